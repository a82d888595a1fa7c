use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: u64,
    amount: u64,
}

struct Payments {
    idempotency: Idempotency,
}

impl Payments {
    #[idempotent(handle = self.idempotency, payload = order, key = "order_id", operation = "charge")]
    async fn charge(&self, order: Order, note: &str) -> Result<u64, lambda_runtime::Error> {
        let _ = note;
        Ok(order.amount)
    }
}

fn main() {
    let payments = Payments { idempotency: Idempotency::new(MemoryStore::new()) };
    let _ = payments.charge(Order { order_id: 1, amount: 2 }, "n");
}

use lambda_idempotency::{Idempotency, MemoryStore, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use serde::de::DeserializeOwned;

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: u64,
    amount: u64,
}

/// A free function: `charge` and `charge_with_outcome`, both `pub`.
#[idempotent(handle = handle, payload = order, key = "order_id", with_outcome)]
pub async fn charge(handle: &Idempotency, mut order: Order) -> Result<u64, lambda_runtime::Error> {
    order.amount += 1;
    Ok(order.amount)
}

struct Payments {
    idempotency: Idempotency,
}

impl Payments {
    /// A method: the receiver is passed on.
    #[idempotent(handle = self.idempotency, payload = order, key = "order_id", with_outcome, operation = "Payments::charge")]
    async fn charge(&self, order: Order, note: &str) -> Result<u64, lambda_runtime::Error> {
        let _ = note;
        Ok(order.amount)
    }

    /// By value, `mut`.
    #[idempotent(handle = self.idempotency, payload = order, key = "order_id", with_outcome, operation = "Payments::into_charge")]
    async fn into_charge(mut self, order: Order) -> Result<u64, lambda_runtime::Error> {
        let this = &mut self;
        let _ = this;
        Ok(order.amount)
    }

    /// An associated function that names `Self`.
    #[idempotent(handle = payments.idempotency, payload = order, key = "order_id", with_outcome, operation = "Payments::charge_on")]
    async fn charge_on(payments: &Self, order: Order) -> Result<u64, lambda_runtime::Error> {
        let _ = payments;
        Ok(order.amount)
    }
}

/// Generic: the type parameters are passed on.
#[idempotent(handle = handle, payload = input, hash = ["id"], with_outcome)]
async fn echo<T, const N: usize>(handle: &Idempotency, input: T) -> Result<T, lambda_idempotency::Error>
where
    T: Serialize + DeserializeOwned + Send,
{
    Ok(input)
}

/// An alias with the error type fixed.
type Answer<T> = std::result::Result<T, lambda_idempotency::Error>;
mod alias {
    pub(crate) type Result<T> = std::result::Result<T, lambda_idempotency::Error>;
}

#[idempotent(handle = handle, payload = order, key = "order_id", with_outcome)]
async fn aliased(handle: &Idempotency, order: Order) -> alias::Result<u64> {
    Ok(order.amount)
}

async fn callers() -> Answer<()> {
    let handle = Idempotency::new(MemoryStore::new());
    let order = || Order { order_id: 1, amount: 2 };
    let _: u64 = charge(&handle, order()).await.unwrap();
    let _: (u64, Outcome) = charge_with_outcome(&handle, order()).await.unwrap();
    let payments = Payments { idempotency: handle.clone() };
    let _: u64 = payments.charge(order(), "n").await.unwrap();
    let _: (u64, Outcome) = payments.charge_with_outcome(order(), "n").await.unwrap();
    let _: (u64, Outcome) = Payments::charge_on_with_outcome(&payments, order()).await.unwrap();
    let _: u64 = Payments::charge_on(&payments, order()).await.unwrap();
    let _: (u64, Outcome) = Payments { idempotency: handle.clone() }.into_charge_with_outcome(order()).await.unwrap();
    let _: u64 = payments.into_charge(order()).await.unwrap();
    let _: (u32, Outcome) = echo_with_outcome::<u32, 3>(&handle, 1).await?;
    let _: u32 = echo::<u32, 3>(&handle, 1).await?;
    let _: (u64, Outcome) = aliased_with_outcome(&handle, order()).await?;
    Ok(())
}

fn main() {
    let _ = callers;
    let _ = aliased;
}

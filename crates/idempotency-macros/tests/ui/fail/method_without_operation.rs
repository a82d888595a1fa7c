use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

struct Worker {
    idempotency: Idempotency,
}

impl Worker {
    // A default would have to name `Worker`, which only `std::any::type_name` can, and
    // its text is no promise: a compiler upgrade could change every stored id.
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

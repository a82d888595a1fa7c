use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

trait Handler {
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error>;
}

struct Worker {
    idempotency: Idempotency,
}

impl Handler for Worker {
    #[idempotent(handle = self.idempotency, key = "id", with_outcome, operation = "handle")]
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

// The macro cannot see that it is in a trait impl (it can for `#[async_trait]`, whose shape
// it recognises): rustc reports the extra method, at `with_outcome`, and the function's
// call to it.

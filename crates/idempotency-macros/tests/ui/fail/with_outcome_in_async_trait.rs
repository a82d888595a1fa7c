use async_trait::async_trait;
use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

#[async_trait]
trait Handler {
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error>;
}

struct Worker {
    idempotency: Idempotency,
}

#[async_trait]
impl Handler for Worker {
    #[idempotent(handle = self.idempotency, key = "id", with_outcome, operation = "handle")]
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

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

#[idempotent(handle = self.idempotency, key = "id")]
#[async_trait]
impl Handler for Worker {
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

trait Handler {
    fn idempotency(&self) -> &Idempotency;

    #[idempotent(handle = self.idempotency(), key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error>;
}

fn main() {}

//! Inside an `#[async_trait]` impl, `#[idempotent]` sees the boxed future `#[async_trait]`
//! made of the `async fn`, and wraps the future's body.

use async_trait::async_trait;
use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
use serde_json::Value;

#[async_trait]
trait Handler {
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error>;
    async fn consume(self, request: Value) -> Result<u32, lambda_idempotency::Error>;

    /// A default method.
    #[idempotent(handle = self.idempotency(), key = "id", operation = "default")]
    async fn by_default(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(0)
    }

    fn idempotency(&self) -> &Idempotency;
}

struct Worker {
    idempotency: Idempotency,
}

#[async_trait]
impl Handler for Worker {
    /// Doc comments and other attributes survive.
    #[idempotent(handle = self.idempotency, key = "id", operation = "Worker::handle")]
    #[allow(clippy::needless_pass_by_value)]
    async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        if request["id"].is_null() {
            return Ok(0);
        }
        let n = Ok::<u32, lambda_idempotency::Error>(1)?;
        Ok(n + self.idempotency.store().name().len() as u32)
    }

    #[idempotent(handle = self.idempotency, payload = request, key = "id", operation = "Worker::consume")]
    async fn consume(mut self, request: Value) -> Result<u32, lambda_idempotency::Error> {
        self.idempotency = self.idempotency.clone();
        let _ = request;
        Ok(1)
    }

    fn idempotency(&self) -> &Idempotency {
        &self.idempotency
    }
}

fn main() {
    let worker = Worker { idempotency: Idempotency::new(MemoryStore::new()) };
    let _ = worker.handle(serde_json::json!({"id": 1}));
    let _ = worker.by_default(serde_json::json!({"id": 1}));
}

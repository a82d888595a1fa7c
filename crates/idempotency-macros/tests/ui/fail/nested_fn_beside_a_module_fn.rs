use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

#[idempotent(handle = handle, payload = request, key = "id")]
async fn process(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
    let _ = request;
    Ok(1)
}

fn main() {
    // Nested in another function's body and named like the module's `process`: without
    // the marker item, both would store under `my_crate::process`.
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn process(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(3)
    }
}

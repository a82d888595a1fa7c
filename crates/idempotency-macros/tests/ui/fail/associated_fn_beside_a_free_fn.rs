use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

#[idempotent(handle = handle, payload = request, key = "id")]
async fn process(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
    let _ = request;
    Ok(1)
}

struct Refunds;

impl Refunds {
    // A free `process` exists in the module, so only the marker item tells the two
    // apart: without it both would store under `my_crate::process`.
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn process(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(2)
    }
}

fn main() {}

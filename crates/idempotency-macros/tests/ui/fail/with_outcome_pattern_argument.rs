use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

#[idempotent(handle = handle, payload = request, key = "id", with_outcome)]
async fn f(handle: &Idempotency, request: Value, (a, b): (u32, u32)) -> Result<u32, lambda_idempotency::Error> {
    let _ = request;
    Ok(a + b)
}

fn main() {}

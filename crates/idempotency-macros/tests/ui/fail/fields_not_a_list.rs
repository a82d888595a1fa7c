use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = body, hash = "model")]
async fn f(handle: &Idempotency, body: serde_json::Value) -> Result<u32, lambda_idempotency::Error> {
    let _ = body;
    Ok(1)
}

fn main() {}

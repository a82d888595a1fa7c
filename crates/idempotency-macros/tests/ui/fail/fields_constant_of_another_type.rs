use lambda_idempotency::{Idempotency, idempotent};

const FIELDS: [u32; 2] = [1, 2];

#[idempotent(handle = handle, payload = body, hash = FIELDS)]
async fn f(handle: &Idempotency, body: serde_json::Value) -> Result<u32, lambda_idempotency::Error> {
    let _ = body;
    Ok(1)
}

fn main() {}

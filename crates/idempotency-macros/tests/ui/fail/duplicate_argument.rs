use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id", key = "other")]
async fn f(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

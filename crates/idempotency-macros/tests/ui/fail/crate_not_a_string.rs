use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(crate = lambda_idempotency, handle = handle, payload = id, key = "id")]
async fn f(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

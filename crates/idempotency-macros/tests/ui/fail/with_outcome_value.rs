use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id", with_outcome = true)]
async fn f(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

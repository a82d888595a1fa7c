use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = request, key = "id")]
async fn f(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

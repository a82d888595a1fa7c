use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, key = "id")]
async fn two_arguments(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

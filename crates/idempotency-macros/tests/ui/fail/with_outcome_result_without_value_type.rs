use lambda_idempotency::{Idempotency, idempotent};

type Result = std::result::Result<String, lambda_idempotency::Error>;

#[idempotent(handle = handle, payload = id, key = "id", with_outcome)]
async fn f(handle: &Idempotency, id: String) -> Result {
    Ok(id)
}

fn main() {}

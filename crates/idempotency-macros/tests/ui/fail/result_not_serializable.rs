use lambda_idempotency::{Idempotency, idempotent};

struct Receipt;

#[idempotent(handle = handle, payload = id, key = "id")]
async fn f(handle: &Idempotency, id: String) -> Result<Receipt, lambda_idempotency::Error> {
    let _ = id;
    Ok(Receipt)
}

fn main() {}

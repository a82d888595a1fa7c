use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id", operation = "charge#eu")]
async fn a(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

#[idempotent(handle = handle, payload = id, key = "id", key_prefix = "v1#")]
async fn b(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

#[idempotent(handle = handle, payload = id, key = "/order/~2")]
async fn c(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

#[idempotent(handle = handle, payload = id, hash = ["/a~"])]
async fn d(handle: &Idempotency, id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}

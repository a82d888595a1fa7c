use lambda_idempotency::{Idempotency, idempotent};
use serde::Serialize;

trait Fields {
    const FIELDS: &'static [&'static str];
}

#[idempotent(handle = handle, payload = request, hash = T::FIELDS)]
async fn f<T: Fields + Serialize>(handle: &Idempotency, request: T) -> Result<u32, lambda_idempotency::Error> {
    let _ = request;
    Ok(1)
}

fn main() {}

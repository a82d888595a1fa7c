use lambda_idempotency::{Idempotency, idempotent};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[idempotent(handle = handle, payload = input, hash = ["id"])]
async fn echo<T>(handle: &Idempotency, input: T) -> Result<T, lambda_idempotency::Error>
where
    T: Serialize + DeserializeOwned + Send,
{
    Ok(input)
}

fn main() {
    let _ = echo::<u32>;
}

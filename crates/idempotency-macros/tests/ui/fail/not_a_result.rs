use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id")]
async fn f(handle: &Idempotency, id: String) -> String {
    id
}

fn main() {}

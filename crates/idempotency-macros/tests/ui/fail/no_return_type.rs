use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id")]
async fn fire_and_forget(handle: &Idempotency, id: String) {
    let _ = id;
}

fn main() {}

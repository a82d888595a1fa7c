use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

struct Worker;

impl Worker {
    // No receiver and no `Self` in the signature: the macro cannot tell this from a free
    // function, and calls `handle_with_outcome` by its bare name.
    #[idempotent(handle = handle, payload = request, key = "id", with_outcome, operation = "handle")]
    async fn handle(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

// Naming `Self` in the signature (`this: &Self`), or taking `self`, makes it compile.

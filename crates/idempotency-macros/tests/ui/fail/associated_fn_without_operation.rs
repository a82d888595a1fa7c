use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

struct Worker;

impl Worker {
    // No receiver and no `Self`: the macro cannot see the impl, but the `use` it emits
    // finds no `handle` in the module, so the default is refused here too.
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn handle(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {}

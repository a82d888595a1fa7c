use lambda_idempotency::{Idempotency, idempotent};
use serde_json::Value;

fn outer() {
    // `module_path!()` cannot tell this `inner` from another function's `inner`: the
    // default is refused (the `use` the macro emits finds no `inner` in the module).
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn inner(handle: &Idempotency, request: Value) -> Result<u32, lambda_idempotency::Error> {
        let _ = request;
        Ok(1)
    }
}

fn main() {
    outer();
}

//! `crate = "..."`: the path of `lambda_idempotency` where the caller sees it, here
//! re-exported by another module as a framework would.

mod framework {
    pub use lambda_idempotency as idempotency;
}

use framework::idempotency::{Idempotency, MemoryStore, Outcome, idempotent};

#[idempotent(crate = "framework::idempotency", handle = handle, payload = request, key = "id", with_outcome)]
async fn first(handle: &Idempotency, request: serde_json::Value) -> Result<u32, framework::idempotency::Error> {
    let _ = request;
    Ok(1)
}

const FIELDS: [&str; 1] = ["id"];

#[idempotent(crate = "crate::framework::idempotency", handle = handle, payload = request, hash = FIELDS, context = ctx)]
async fn second(handle: &Idempotency, request: serde_json::Value, ctx: &lambda_runtime::Context) -> Result<u32, framework::idempotency::Error> {
    let _ = (request, ctx);
    Ok(2)
}

fn main() {
    let handle = Idempotency::new(MemoryStore::new());
    let _: Option<Outcome> = None;
    let _ = first_with_outcome(&handle, serde_json::json!({"id": 1}));
    let _ = first;
    let _ = second;
}

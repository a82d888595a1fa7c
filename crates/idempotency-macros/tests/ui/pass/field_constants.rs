use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct ChatRequest {
    request_id: Option<String>,
    model: String,
    prompt: String,
}

impl ChatRequest {
    /// Written once, for the key and for validation.
    const CANONICAL_FIELDS: [&'static str; 2] = ["model", "prompt"];
}

const SLICE: &[&str] = &["model", "/prompt"];
static STATIC: [&str; 1] = ["model"];

#[idempotent(
    handle = handle,
    payload = request,
    key = "request_id",
    hash = ChatRequest::CANONICAL_FIELDS,
    validate = ChatRequest::CANONICAL_FIELDS
)]
async fn array(handle: &Idempotency, request: ChatRequest) -> Result<String, lambda_idempotency::Error> {
    Ok(request.prompt)
}

#[idempotent(handle = handle, payload = request, hash = SLICE, validate = STATIC)]
async fn slice(handle: &Idempotency, request: ChatRequest) -> Result<String, lambda_idempotency::Error> {
    Ok(request.prompt)
}

struct Worker {
    idempotency: Idempotency,
}

impl Worker {
    const FIELDS: [&'static str; 1] = ["model"];

    #[idempotent(handle = self.idempotency, hash = Self::FIELDS, validate = crate::SLICE,
        operation = "by_self")]
    async fn by_self(&self, request: ChatRequest) -> Result<String, lambda_idempotency::Error> {
        Ok(request.prompt)
    }
}

fn main() {
    let handle = Idempotency::new(MemoryStore::new());
    let request = || ChatRequest { request_id: None, model: "m".into(), prompt: "p".into() };
    let _ = array(&handle, request());
    let _ = slice(&handle, request());
    let _ = Worker { idempotency: handle.clone() }.by_self(request());
}

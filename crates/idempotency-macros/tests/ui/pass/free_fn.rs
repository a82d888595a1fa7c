use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

static IDEMPOTENCY: LazyLock<Idempotency> = LazyLock::new(|| Idempotency::new(MemoryStore::new()));

#[derive(Serialize, Deserialize)]
struct Request {
    request_id: String,
    prompt: String,
}

#[derive(Serialize, Deserialize)]
struct Answer {
    text: String,
}

/// Doc comments and other attributes survive.
#[idempotent(handle = IDEMPOTENCY, key = "request_id", validate = ["prompt"])]
#[allow(clippy::needless_pass_by_value)]
pub async fn generate(request: Request) -> Result<Answer, lambda_runtime::Error> {
    if request.prompt.is_empty() {
        return Err("empty prompt".into());
    }
    let text = request.prompt.parse::<String>()?;
    Ok(Answer { text })
}

#[idempotent(handle = IDEMPOTENCY, hash = ["model", "messages"], operation = "chat", key_prefix = "chat-v1")]
async fn by_hash(body: serde_json::Value) -> Result<u32, lambda_idempotency::Error> {
    Ok(body["messages"].as_array().map_or(0, |m| m.len() as u32))
}

#[idempotent(handle = IDEMPOTENCY, key = "/request_id", context = ctx)]
async fn with_context(request: &Request, ctx: &lambda_runtime::Context) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    Ok(format!("{} {}", request.request_id, ctx.request_id))
}

fn main() {
    let _ = generate(Request { request_id: "1".into(), prompt: "p".into() });
    let _ = by_hash(serde_json::json!({}));
    let _ = with_context;
}

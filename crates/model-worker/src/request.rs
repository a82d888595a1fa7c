//! The message body.

use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

/// A queued model request. Unknown fields (`submitted_at`, ...) are ignored; absent
/// optional fields serialize as `null`, so absent and `null` hash alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The producer's id for this request: the idempotency key when present.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The model to ask.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Completion length limit.
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

impl ChatRequest {
    /// The fields hashed into the key when there is no `request_id`, and validated on every
    /// duplicate: the canonical subset.
    pub const CANONICAL_FIELDS: [&'static str; 4] =
        ["model", "messages", "temperature", "max_tokens"];

    /// Why this request cannot be sent, if it cannot.
    pub fn problem(&self) -> Option<&'static str> {
        if self.model.trim().is_empty() {
            Some("`model` is empty")
        } else if self.messages.is_empty() {
            Some("`messages` is empty")
        } else {
            None
        }
    }
}

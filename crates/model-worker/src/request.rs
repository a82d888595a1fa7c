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

/// A request that parses but can never be sent (an empty model or conversation): it is
/// reported as a failure every time, so the message reaches the dead-letter queue.
#[derive(Debug)]
pub struct InvalidRequest {
    /// The SQS message id.
    pub message_id: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "message {} holds a request that cannot be sent: {}",
            self.message_id, self.problem
        )
    }
}

impl std::error::Error for InvalidRequest {}

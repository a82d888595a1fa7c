//! A Lambda behind SQS, Kinesis or DynamoDB Streams that asks a model for a completion
//! once per request, however often its record arrives ([`Worker::handle_any`]: the event's
//! `eventSource` decides which batch runs).
//!
//! # Message contract
//! Body (JSON): `{"request_id": "...", "model": "...", "messages": [{"role": "...",
//! "content": "..."}], "temperature": 0.2, "max_tokens": 64, ...}`. `request_id` is
//! optional; other fields (`submitted_at`, ...) are ignored.
//!
//! # Key
//! `request_id` when present; otherwise the SHA-256 of the canonical JSON (RFC 8785) of
//! `model`, `messages`, `temperature`, `max_tokens`: the canonical subset. Payload
//! validation covers the same four fields, so a reused `request_id` with a different
//! request is refused.
//!
//! # The call
//! `POST {MODEL_BASE_URL}/v1/chat/completions` with `{model, messages, temperature,
//! max_tokens}` and `Authorization: Bearer {key}` when a key is configured: the value of
//! the Secrets Manager secret `MODEL_API_KEY_SECRET_ARN` (read once at start-up), or
//! `MODEL_API_KEY` for local runs. Never retried
//! automatically: a retry of a request whose answer was lost can be a second billed
//! generation. The provider's JSON response is the stored result ([`Answer`]); a refusal
//! ([`refuses_for_good`]) is stored too, and fails the record permanently on every
//! delivery without asking again.

pub mod answers;
pub mod config;
pub mod emf;
pub mod provider;
pub mod request;
pub mod secret;
pub mod startup;
pub mod worker;

pub use answers::AnswersTable;
pub use config::{ConfigError, RequestEnvelope, StoreChoice, WorkerConfig};
pub use provider::{ModelClient, ProviderError, refuses_for_good};
pub use request::{ChatMessage, ChatRequest};
pub use secret::SecretError;
pub use startup::{Phases, StoreCheck};
pub use worker::{
    Answer, Delivery, Refusal, Source, TableCheck, Worker, idempotency_from_config,
    idempotency_starting, secret_and_store,
};

//! The `Idempotency-Key` header for HTTP APIs: a tower layer over `http::Request` and
//! `http::Response`, so one layer serves API Gateway (REST and HTTP APIs), ALB and Function
//! URLs through lambda_http, and any tower HTTP server (axum, hyper) outside Lambda.
//!
//! It follows draft-ietf-httpapi-idempotency-key-header (revision -06's rules):
//!
//! - the key is the `Idempotency-Key` header, as the draft's structured-field string
//!   (`"8e03…"`) or bare (`8e03…`); at most 255 bytes of visible ASCII;
//! - a missing key where one is required is `400`; a key reused with another request
//!   (method, path, query, body, and the headers you name) is `422`; a key whose first
//!   request is still running is `409` with `Retry-After`, unless you let it wait
//!   ([`IdempotencyKeyLayerBuilder::wait_for_in_progress`]);
//! - every answer of the layer's own is `application/problem+json` (RFC 9457);
//! - a repeated request gets the first one's status, body (byte for byte) and the headers
//!   you allow (the body's `content-*` headers and `location` by default), with
//!   `Idempotent-Replayed: true`;
//! - keys are scoped to the caller ([`CallerScope`]): two callers who send the same key
//!   never see each other's responses;
//! - success and the client errors a retry meets again are stored; `5xx`, `401`, `403`,
//!   `408`, `425` and `429` release the key so the retry runs ([`store_by_default`]).
//!
//! Where it departs from the draft or from Stripe, and why, and what each problem type
//! means: the repository's `docs/http.md`.
//!
//! ```no_run
//! use lambda_http::{Body, Error, Request, Response, service_fn, tower::ServiceBuilder};
//! use lambda_idempotency::http::IdempotencyKeyLayer;
//! use lambda_idempotency::{Idempotency, MemoryStore};
//!
//! async fn generate(request: Request) -> Result<Response<Body>, Error> {
//!     Ok(Response::new(Body::from(format!("{} bytes", request.body().len()))))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Error> {
//!     let idempotency = Idempotency::new(MemoryStore::new());
//!     let service = ServiceBuilder::new()
//!         // Keys scoped by API Gateway's authorizer (the default with `lambda-http`).
//!         .layer(IdempotencyKeyLayer::new(idempotency, "generate"))
//!         .service(service_fn(generate));
//!     lambda_http::run(service).await
//! }
//! ```
//!
//! Store requests per HTTP request: a first request 2 (the claim and the completion); a
//! replay 1 (0 from the local cache); a key in progress or reused 1; a wait one read per
//! poll (50 ms, doubling to 1 s), none for a twin in the same process.

mod header;
mod layer;
mod problem;
mod scope;
mod service;
mod stored;
mod wait;

pub use header::{DEFAULT_MAX_KEY_LEN, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use layer::{
    DEFAULT_MAX_RETRY_AFTER, DEFAULT_REPLAY_HEADERS, IdempotencyKeyLayer,
    IdempotencyKeyLayerBuilder,
};
pub use problem::DEFAULT_PROBLEM_BASE;
pub use scope::CallerScope;
pub use service::{IdempotencyKeyService, ResponseFuture};
pub use stored::store_by_default;

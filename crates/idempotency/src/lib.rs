//! Idempotent AWS Lambda handlers: SQS, Kinesis and DynamoDB Streams batches, whole
//! handlers behind a tower layer, any function with `#[idempotent]`.
//!
//! Every SQS queue delivers at least once: a message comes twice when a visibility timeout
//! runs out mid-call, when a worker crashes before its ack, when SQS duplicates a delivery,
//! or when a producer retries a send; a stream resends everything after a failed record.
//! This crate makes the expensive work run once:
//!
//! 1. derive a key from what the producer decided ([`KeyStrategy`]), never the message id;
//! 2. **claim** it with one atomic conditional write, status `INPROGRESS`, with a lease
//!    that ends with the invocation and a unique lease token;
//! 3. run the function; store its result (`COMPLETED`) or release the claim on error,
//!    both fenced by the lease token so a worker that lost its lease cannot overwrite its
//!    successor.
//!
//! A duplicate gets one of three answers: completed returns the stored result; in progress
//! is [`Error::AlreadyInProgress`] (hand the message back to SQS); expired or lease-passed
//! is taken over and run.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, Outcome};
//! use serde_json::json;
//!
//! let idempotency = Idempotency::new(MemoryStore::new());
//! let op = Operation::new("send_email", KeyStrategy::field("request_id"));
//! let message = json!({"request_id": "r-1", "to": "ada@example.com"});
//!
//! for expected in [Outcome::Executed, Outcome::Replayed] {
//!     let (sent, outcome) = idempotency
//!         .execute(&op, &message, || async { Ok::<_, std::io::Error>("sent".to_string()) })
//!         .await
//!         .unwrap();
//!     assert_eq!((sent.as_str(), outcome), ("sent", expected));
//! }
//! # }
//! ```
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
#[path = "macro_support.rs"]
pub mod __macro_support;
/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
/// The store guide's examples (`docs/stores.md`), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/stores.md")]
struct StoresDoctests;
/// The HTTP guide's examples (`docs/http.md`), compiled as doctests.
#[cfg(all(doctest, feature = "lambda-http", feature = "aws-config"))]
#[doc = include_str!("../../../docs/http.md")]
struct HttpDoctests;
/// The stream guide's examples (`docs/streams.md`), compiled and run as doctests.
#[cfg(all(doctest, feature = "kinesis"))]
#[doc = include_str!("../../../docs/streams.md")]
struct StreamsDoctests;
/// The quick start's handlers, one per trigger (`docs/quickstart.md`), compiled as doctests.
#[cfg(all(
    doctest,
    feature = "kinesis",
    feature = "dynamodb-streams",
    feature = "lambda-http",
    feature = "aws-config",
    feature = "macros",
    feature = "durable"
))]
#[doc = include_str!("../../../docs/quickstart.md")]
struct QuickstartDoctests;

mod batch;
pub mod clock;
mod config;
mod context;
#[cfg(feature = "durable")]
#[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
pub mod durable;
mod engine;
pub mod envelope;
mod error;
mod handle;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod key;
mod layer;
pub mod metrics;
mod operation;
mod record;
mod records;
pub mod store;

#[cfg(feature = "kinesis")]
#[cfg_attr(docsrs, doc(cfg(feature = "kinesis")))]
pub use batch::KinesisBatch;
pub use batch::{
    AwsLogs, BatchError, BatchReport, BatchResponse, CloudWatchLogsBatch, CloudWatchLogsEvent,
    FailureKind, InvalidBody, KafkaBatch, KafkaBatchItemFailure, KafkaBatchResponse, KafkaEvent,
    KafkaItemIdentifier, KafkaRecord, LogEvent, NoResponse, PartialBatchResponse, PermanentError,
    RecordFailure, RecordReport, SkippedRecord, SqsBatch,
};
#[cfg(feature = "dynamodb-streams")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb-streams")))]
pub use batch::{DynamoDbStreamBatch, StreamChange};
pub use config::expiry_for_queue;
pub use context::outcome_unknown::OutcomeUnknown;
pub use context::{current_deadline, current_tenant, with_context, with_deadline};
pub use envelope::Envelope;
pub use error::{BoxError, Error, ExecuteError, report};
pub use handle::{Idempotency, IdempotencyBuilder};
pub use key::KeyStrategy;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use lambda_idempotency_macros::idempotent;
pub use layer::{IdempotentLayer, IdempotentService};
pub use operation::in_progress::InProgress;
pub use operation::replay::Replay;
pub use operation::{Operation, Outcome};
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use store::dynamodb::DynamoDbStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::postgres::PostgresStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
pub use store::writes::WithWrites;

//! SQS: records one by one, or in FIFO message groups.

use super::record::{BatchRecord, GroupRule};
use super::settings::{Settings, batch_entry_points, batch_setters};
use super::{BatchReport, InvalidBody, envelope, fifo};
use crate::envelope::Envelope;
use crate::error::BoxError;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::time::SystemTime;

/// Processes the records of an SQS event concurrently and reports failures one by one.
///
/// - Records run concurrently, at most [`max_concurrency`](Self::max_concurrency) at once.
/// - A handler error, an in-progress duplicate ([`Error::AlreadyInProgress`](crate::Error::AlreadyInProgress)), a body that
///   does not parse and a panic each become a `batchItemFailures` entry for that record only.
/// - FIFO queues (event source ARN ending in `.fifo`) keep order within a message group:
///   after a failure a retry can fix, the group's later records are reported as failures
///   without running ([`SkippedAfterGroupFailure`](crate::FailureKind::SkippedAfterGroupFailure)),
///   so they come again after it. A permanent failure
///   ([`FailureKind::is_permanent`](crate::FailureKind::is_permanent)) does not stop the
///   group: its later messages run now rather than reach the dead-letter queue with it
///   ([`stop_at_permanent_failures`](Self::stop_at_permanent_failures) to stop anyway).
///   Other groups go on in parallel.
/// - Every record's lease ends with the invocation's deadline. A crash (or a record
///   still running when the batch answers) leaves its record in progress until then; the
///   next delivery after it takes over. A handler that panics releases its claim, as one
///   that fails does, and the record is reported [`Panicked`](crate::FailureKind::Panicked):
///   the next delivery runs again at once.
/// - Records share the invocation's task: the concurrency is for I/O (store and provider
///   round trips), not for CPU-bound work.
/// - When every record fails, the default still returns them as `batchItemFailures`: a
///   redelivered one-record batch that finds its record in progress is no function error.
///   [`fail_invocation_when_all_fail`](Self::fail_invocation_when_all_fail) opts into failing
///   the invocation instead, so Lambda backs off.
///
/// **Enable `ReportBatchItemFailures` on the event source mapping**, or failed messages are
/// deleted with the batch.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use aws_lambda_events::event::sqs::SqsEvent;
/// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, SqsBatch};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::{Value, json};
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("greet", KeyStrategy::field("id"));
/// let event: SqsEvent = serde_json::from_value(json!({"Records": [
///     {"messageId": "m1", "body": "{\"id\": \"a\"}"},
///     {"messageId": "m2", "body": "not json"},
/// ]})).unwrap();
///
/// let response = SqsBatch::new()
///     .run_json(LambdaEvent::new(event, Context::default()), |body: Value, _msg| {
///         let (idempotency, op) = (&idempotency, &op);
///         async move {
///             idempotency.run(op, &body, || async { Ok::<_, lambda_runtime::Error>(()) }).await
///         }
///     })
///     .await
///     .unwrap();
/// assert_eq!(serde_json::to_value(&response).unwrap(),
///            json!({"batchItemFailures": [{"itemIdentifier": "m2"}]}));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct SqsBatch {
    settings: Settings,
}

batch_setters!(SqsBatch, "records (FIFO: message groups)");
batch_entry_points!(
    SqsBatch,
    SqsEvent,
    SqsMessage,
    SqsMessage,
    SqsBatchResponse,
    "each body parsed as JSON into `B`"
);

impl BatchRecord for SqsMessage {
    fn item_id(&self) -> Option<String> {
        self.message_id.clone()
    }
}

impl SqsBatch {
    /// A processor running up to 10 records at once (an SQS batch's default size).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` on `records` within an invocation that ends at `deadline`.
    pub async fn report_records<T, E, F, Fut>(
        &self,
        records: Vec<SqsMessage>,
        deadline: Option<SystemTime>,
        handler: F,
    ) -> BatchReport<T>
    where
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let rule = GroupRule {
            noun: "FIFO message group",
            stop_at_permanent: self.settings.stop_at_permanent_failures,
            wait_for_in_progress: None,
        };
        super::run_groups(
            &self.settings,
            fifo::group_records(records),
            rule,
            deadline,
            handler,
        )
        .await
    }
}

/// A message's body parsed as JSON (the request in it, through the envelope), with a
/// clear error naming the message.
fn json_input<B: DeserializeOwned>(
    message: SqsMessage,
    envelope: Option<&Envelope>,
) -> Result<(B, SqsMessage), InvalidBody> {
    let body = match message.body.as_deref() {
        Some(body) => envelope::parse(message.message_id.as_deref(), body.as_bytes(), envelope)?,
        None => {
            return Err(InvalidBody {
                item_id: message.message_id.clone().unwrap_or_default(),
                reason: "the message has no body".into(),
            });
        }
    };
    Ok((body, message))
}

/// Why the envelope acknowledges this message without running it, if it does.
fn skip_reason(message: &SqsMessage, envelope: Option<&Envelope>) -> Option<String> {
    envelope::skip_reason_of(envelope?, message.body.as_deref()?.as_bytes())
}

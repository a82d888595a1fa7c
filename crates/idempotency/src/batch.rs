//! SQS batch processing with partial batch responses.
//!
//! **The event source mapping must enable `ReportBatchItemFailures`**
//! (`FunctionResponseTypes: [ReportBatchItemFailures]` in SAM or CloudFormation).
//! Without it Lambda ignores the `batchItemFailures` this returns: a batch that returns
//! successfully is deleted whole, failed records included.

use crate::error::{BoxError, Error};
use crate::invocation;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::{FutureExt, StreamExt};
use lambda_runtime::LambdaEvent;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};
use tracing::{Instrument, info, info_span, warn};

/// Records processed at once by default: an SQS batch's default size.
pub const DEFAULT_MAX_CONCURRENCY: usize = 10;

/// How long before the invocation's deadline the batch stops waiting for unfinished
/// records and answers Lambda: a response Lambda never gets fails every record of the
/// batch, finished ones included.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Why one record was reported as a batch item failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Another worker holds the key: redelivered later, not an error.
    InProgress,
    /// The body is not what the handler expects; it will reach the dead-letter queue.
    MalformedBody,
    /// The handler returned an error.
    Error,
    /// The handler panicked.
    Panicked,
    /// FIFO: an earlier record of the same message group failed, so this one was not run.
    SkippedAfterGroupFailure,
    /// The record had not finished shortly before the invocation's deadline. Its claim
    /// stays until its lease ends, as after a crash; a later delivery takes it over.
    Unfinished,
}

/// One record's failure.
#[derive(Debug)]
pub struct RecordFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// The error, for logs.
    pub reason: String,
    /// The error itself, when there was one.
    pub error: Option<BoxError>,
}

impl fmt::Display for RecordFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.reason)
    }
}

/// What happened to one record.
#[derive(Debug)]
pub struct RecordReport<T> {
    /// The SQS message id, the batch item failure's identifier.
    pub message_id: Option<String>,
    /// The handler's value, or why the record failed.
    pub result: Result<T, RecordFailure>,
}

/// What happened to every record of a batch, in the event's order.
#[derive(Debug)]
pub struct BatchReport<T> {
    /// One report per record.
    pub records: Vec<RecordReport<T>>,
}

impl<T> BatchReport<T> {
    /// The records that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RecordReport<T>> {
        self.records.iter().filter(|r| r.result.is_err())
    }

    /// The partial batch response for Lambda. Fails when a failed record has no message id
    /// (it could not be reported, so the whole batch must be retried), or when every record
    /// failed and `fail_invocation_when_all_fail` is set.
    pub fn into_response(
        self,
        fail_invocation_when_all_fail: bool,
    ) -> Result<SqsBatchResponse, BatchError> {
        let mut response = SqsBatchResponse::default();
        let total = self.records.len();
        let mut first_reason = None;
        for (index, record) in self.records.into_iter().enumerate() {
            if let Err(failure) = record.result {
                match record.message_id {
                    Some(id) => response.add_failure(id),
                    None => return Err(BatchError::MissingMessageId { index }),
                }
                first_reason.get_or_insert(failure.reason);
            }
        }
        let failed = response.batch_item_failures.len();
        if fail_invocation_when_all_fail && total > 0 && failed == total {
            return Err(BatchError::AllFailed {
                count: total,
                first_reason: first_reason.unwrap_or_default(),
            });
        }
        Ok(response)
    }
}

/// Why a whole invocation failed instead of returning a partial batch response.
#[derive(Debug)]
#[non_exhaustive]
pub enum BatchError {
    /// Every record failed and the processor was told to fail the invocation then.
    AllFailed {
        /// Records in the batch.
        count: usize,
        /// The first failure's reason.
        first_reason: String,
    },
    /// A failed record has no message id to report it by.
    MissingMessageId {
        /// Its position in the batch.
        index: usize,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::AllFailed {
                count,
                first_reason,
            } => write!(
                f,
                "all {count} records of the batch failed (first: {first_reason}); failing the invocation so Lambda backs off"
            ),
            BatchError::MissingMessageId { index } => write!(
                f,
                "record {index} failed and has no messageId to report it by; failing the whole batch so it is retried"
            ),
        }
    }
}

impl std::error::Error for BatchError {}

/// Processes the records of an SQS event concurrently and reports failures one by one.
///
/// - Records run concurrently, at most [`max_concurrency`](Self::max_concurrency) at once.
/// - A handler error, an in-progress duplicate ([`Error::AlreadyInProgress`]), a body that
///   does not parse and a panic each become a `batchItemFailures` entry for that record only.
/// - FIFO queues (event source ARN ending in `.fifo`) keep order within a message group:
///   after the first failure in a group, the group's later records are reported as failures
///   without running. Other groups go on in parallel.
/// - Every record's lease ends with the invocation's deadline. A panic, like a crash,
///   leaves its record in progress until then; the next delivery after it takes over.
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
#[derive(Debug, Clone)]
pub struct SqsBatch {
    max_concurrency: usize,
    fail_invocation_when_all_fail: bool,
    deadline_margin: Duration,
}

impl Default for SqsBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl SqsBatch {
    /// A processor with [`DEFAULT_MAX_CONCURRENCY`].
    pub fn new() -> Self {
        Self {
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            fail_invocation_when_all_fail: false,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
        }
    }

    /// Answers this long before the invocation's deadline, reporting records that have not
    /// finished as [`FailureKind::Unfinished`]. Default [`DEFAULT_DEADLINE_MARGIN`].
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.deadline_margin = margin;
        self
    }

    /// At most `n` records (FIFO: message groups) at once. 1 processes one at a time.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// Fails the invocation when every record failed, instead of reporting each.
    pub fn fail_invocation_when_all_fail(mut self, yes: bool) -> Self {
        self.fail_invocation_when_all_fail = yes;
        self
    }

    /// Runs `handler` on every record and builds the partial batch response.
    pub async fn run<T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> Result<SqsBatchResponse, BatchError>
    where
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.report(event, handler)
            .await
            .into_response(self.fail_invocation_when_all_fail)
    }

    /// Like [`run`](Self::run), with each body parsed as JSON into `B` first: a body that
    /// does not parse is a [`FailureKind::MalformedBody`] failure and the handler does not run.
    pub async fn run_json<B, T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> Result<SqsBatchResponse, BatchError>
    where
        B: DeserializeOwned,
        F: Fn(B, SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.report_json(event, handler)
            .await
            .into_response(self.fail_invocation_when_all_fail)
    }

    /// Like [`run_json`](Self::run_json), returning what happened to each record.
    pub async fn report_json<B, T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> BatchReport<T>
    where
        B: DeserializeOwned,
        F: Fn(B, SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let handler = &handler;
        self.report(event, move |message: SqsMessage| async move {
            let body: B = json_body(&message)?;
            handler(body, message).await.map_err(Into::into)
        })
        .await
    }

    /// Runs `handler` on every record and returns what happened to each.
    pub async fn report<T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> BatchReport<T>
    where
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let deadline = invocation::context_deadline(&event.context);
        self.report_records(event.payload.records, deadline, handler)
            .await
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
        let message_ids: Vec<Option<String>> =
            records.iter().map(|r| r.message_id.clone()).collect();
        let groups = group_records(records);
        let handler = &handler;
        let mut slots: Vec<Option<RecordReport<T>>> = message_ids.iter().map(|_| None).collect();
        let work = futures_util::stream::iter(groups)
            .map(|group| run_group(group, handler))
            .buffer_unordered(self.max_concurrency)
            .for_each(|done| {
                for (index, report) in done {
                    slots[index] = Some(report);
                }
                std::future::ready(())
            });
        let work = invocation::with_deadline(deadline, work);
        match deadline {
            Some(deadline) => {
                let left = deadline
                    .duration_since(SystemTime::now())
                    .unwrap_or_default()
                    .saturating_sub(self.deadline_margin);
                if tokio::time::timeout(left, work).await.is_err() {
                    warn!(
                        margin = ?self.deadline_margin,
                        "the invocation's deadline is near: answering now, unfinished records are reported as failures"
                    );
                }
            }
            None => work.await,
        }
        BatchReport {
            records: slots
                .into_iter()
                .zip(message_ids)
                .map(|(slot, message_id)| slot.unwrap_or_else(|| unfinished(message_id)))
                .collect(),
        }
    }
}

fn unfinished<T>(message_id: Option<String>) -> RecordReport<T> {
    let reason = "not finished before the invocation's deadline; its claim stays until its lease ends, then a redelivery takes it over".to_owned();
    warn!(
        message_id = message_id.as_deref().unwrap_or_default(),
        "{reason}"
    );
    RecordReport {
        message_id,
        result: Err(RecordFailure {
            kind: FailureKind::Unfinished,
            reason,
            error: None,
        }),
    }
}

/// Parses a message body as JSON, with a clear error naming the message.
pub fn json_body<B: DeserializeOwned>(message: &SqsMessage) -> Result<B, Error> {
    let id = message.message_id.as_deref().unwrap_or("<no messageId>");
    let body = message.body.as_deref().ok_or_else(|| Error::InvalidBody {
        message_id: id.to_owned(),
        reason: "the message has no body".into(),
    })?;
    serde_json::from_str(body).map_err(|e| Error::InvalidBody {
        message_id: id.to_owned(),
        reason: e.to_string(),
    })
}

/// Splits records into groups run one after another: FIFO message groups, or one group
/// per record on a standard queue.
fn group_records(records: Vec<SqsMessage>) -> Vec<Vec<(usize, SqsMessage)>> {
    let fifo = records
        .first()
        .and_then(|r| r.event_source_arn.as_deref())
        .is_some_and(|arn| arn.ends_with(".fifo"));
    if !fifo {
        return records.into_iter().enumerate().map(|r| vec![r]).collect();
    }
    let mut order: Vec<Vec<(usize, SqsMessage)>> = Vec::new();
    let mut by_group: HashMap<String, usize> = HashMap::new();
    for (index, record) in records.into_iter().enumerate() {
        let group = record
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default();
        let slot = *by_group.entry(group).or_insert_with(|| {
            order.push(Vec::new());
            order.len() - 1
        });
        order[slot].push((index, record));
    }
    order
}

async fn run_group<T, E, F, Fut>(
    group: Vec<(usize, SqsMessage)>,
    handler: &F,
) -> Vec<(usize, RecordReport<T>)>
where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    let mut done = Vec::with_capacity(group.len());
    let mut failed_before: Option<String> = None;
    for (index, message) in group {
        let message_id = message.message_id.clone();
        let id_text = message_id.clone().unwrap_or_default();
        let result = match &failed_before {
            Some(earlier) => {
                let reason =
                    format!("not run: earlier message {earlier} of its FIFO message group failed");
                warn!(message_id = %id_text, "{reason}");
                Err(RecordFailure {
                    kind: FailureKind::SkippedAfterGroupFailure,
                    reason,
                    error: None,
                })
            }
            None => {
                let span = info_span!("sqs_record", message_id = %id_text);
                run_record(message, handler).instrument(span).await
            }
        };
        if result.is_err() && failed_before.is_none() {
            failed_before = Some(id_text);
        }
        done.push((index, RecordReport { message_id, result }));
    }
    done
}

async fn run_record<T, E, F, Fut>(message: SqsMessage, handler: &F) -> Result<T, RecordFailure>
where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    match AssertUnwindSafe(async move { handler(message).await })
        .catch_unwind()
        .await
    {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => {
            let error: BoxError = err.into();
            let kind = match error.downcast_ref::<Error>() {
                Some(Error::AlreadyInProgress { .. }) => FailureKind::InProgress,
                Some(Error::InvalidBody { .. }) => FailureKind::MalformedBody,
                _ => FailureKind::Error,
            };
            let reason = error.to_string();
            if kind == FailureKind::InProgress {
                info!(%reason, "handed back to SQS for redelivery");
            } else {
                warn!(%reason, ?kind, "record failed");
            }
            Err(RecordFailure {
                kind,
                reason,
                error: Some(error),
            })
        }
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            warn!(%reason, "record handler panicked");
            Err(RecordFailure {
                kind: FailureKind::Panicked,
                reason: format!("the handler panicked: {reason}"),
                error: None,
            })
        }
    }
}

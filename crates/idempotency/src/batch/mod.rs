//! SQS batch processing with partial batch responses.
//!
//! **The event source mapping must enable `ReportBatchItemFailures`**
//! (`FunctionResponseTypes: [ReportBatchItemFailures]` in SAM or CloudFormation).
//! Without it Lambda ignores the `batchItemFailures` this returns: a batch that returns
//! successfully is deleted whole, failed records included.

mod fifo;
mod record;
mod report;

pub use report::{BatchError, BatchReport, FailureKind, InvalidBody, RecordFailure, RecordReport};

use crate::clock::{Clock, SystemClock};
use crate::error::BoxError;
use crate::invocation::{self, Invocation};
use crate::lease;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::StreamExt;
use lambda_runtime::LambdaEvent;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tracing::warn;

/// Records processed at once by default: an SQS batch's default size.
pub(crate) const DEFAULT_MAX_CONCURRENCY: usize = 10;

/// How long before the invocation's deadline the batch stops waiting for unfinished
/// records and answers Lambda: a response Lambda never gets fails every record of the
/// batch, finished ones included.
pub(crate) const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Processes the records of an SQS event concurrently and reports failures one by one.
///
/// - Records run concurrently, at most [`max_concurrency`](Self::max_concurrency) at once.
/// - A handler error, an in-progress duplicate ([`Error::AlreadyInProgress`](crate::Error::AlreadyInProgress)), a body that
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
    clock: Arc<dyn Clock>,
}

impl Default for SqsBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl SqsBatch {
    /// A processor running up to 10 records at once (an SQS batch's default size).
    pub fn new() -> Self {
        Self {
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            fail_invocation_when_all_fail: false,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
            clock: Arc::new(SystemClock),
        }
    }

    /// Answers this long before the invocation's deadline, reporting records that have not
    /// finished as [`FailureKind::Unfinished`]. Default: 500 ms. Store retries inside the
    /// batch stop before it answers, whatever the margin, so a result that was computed
    /// but could not be stored is reported as such rather than as unfinished.
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.deadline_margin = margin;
        self
    }

    /// Where the batch reads the time to find how long it may wait
    /// ([`TestClock`](crate::clock::TestClock) in tests; give the handle the same one).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// At most `n` records (FIFO: message groups) at once. 1 processes one at a time.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// Fails the invocation when every record failed, instead of reporting each. Holds
    /// however the response is built: [`run`](Self::run), [`run_json`](Self::run_json),
    /// or [`BatchReport::into_response`] on a report.
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
        self.report(event, handler).await.into_response()
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
        self.report_json(event, handler).await.into_response()
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
            let body: B = record::json_body(&message)?;
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
        let deadline = invocation::context_deadline_at(&event.context, self.clock.now());
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
        let groups = fifo::group_records(records);
        let handler = &handler;
        // Each record's report lands as soon as it is known, so a stuck record never turns
        // its finished FIFO group-mates into unfinished ones when the deadline cuts in.
        let slots: Mutex<Vec<Option<RecordReport<T>>>> =
            Mutex::new(message_ids.iter().map(|_| None).collect());
        let work = futures_util::stream::iter(groups)
            .map(|group| record::run_group(group, handler, &slots))
            .buffer_unordered(self.max_concurrency)
            .for_each(|()| std::future::ready(()));
        // Twins (two records with one key) meet within this invocation, not in the store.
        let invocation = deadline.map(|deadline| Invocation {
            deadline,
            answer_by: lease::answer_by(deadline, self.deadline_margin),
        });
        let work = invocation::within(invocation, crate::twins::scope(work));
        match invocation {
            Some(invocation) => {
                let left = crate::clock::until(self.clock.now(), invocation.answer_by);
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
            fail_invocation_when_all_fail: self.fail_invocation_when_all_fail,
            records: slots
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .into_iter()
                .zip(message_ids)
                .map(|(slot, message_id)| slot.unwrap_or_else(|| record::unfinished(message_id)))
                .collect(),
        }
    }
}

//! CloudWatch Logs subscriptions: every log event of an invocation run as a record.

use super::envelope;
use super::record::{BatchRecord, GroupRule};
use super::report::{BatchError, BatchReport, SkippedRecord};
use super::settings::{Settings, batch_setters};
use crate::context::{CallContext, WithCallContext, invocation};
use crate::envelope::{Envelope, Opened};
use crate::error::BoxError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// A CloudWatch Logs subscription's event: `{"awslogs": {"data": "<base64 of gzip of
/// JSON>"}}`, decoded by the batch (a body that does not decode is an error of the
/// batch's, [`BatchError::Malformed`], not of the runtime's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CloudWatchLogsEvent {
    /// The subscription's delivery.
    pub awslogs: AwsLogs,
}

/// The `awslogs` field of a [`CloudWatchLogsEvent`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AwsLogs {
    /// Base64 of gzip of the JSON document of log events.
    pub data: String,
}

/// What `awslogs.data` holds.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogsData {
    #[serde(default)]
    log_group: String,
    #[serde(default)]
    log_stream: String,
    #[serde(default)]
    log_events: Vec<LogEntry>,
}

#[derive(Debug, Deserialize)]
struct LogEntry {
    id: String,
    #[serde(default)]
    timestamp: i64,
    #[serde(default)]
    message: String,
}

/// One log event, as the handler gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogEvent {
    /// The event's id: unique, the same on every delivery of it.
    pub id: String,
    /// When it was logged (epoch milliseconds).
    pub timestamp: i64,
    /// The log line.
    pub message: String,
    /// Its log group.
    pub log_group: String,
    /// Its log stream.
    pub log_stream: String,
}

impl BatchRecord for LogEvent {
    fn item_id(&self) -> Option<String> {
        Some(self.id.clone()).filter(|id| !id.is_empty())
    }
}

/// The answer of a CloudWatch Logs batch: none, as the invocation is asynchronous; only
/// whether it failed counts ([`BatchReport::into_result`]). Not a [`BatchResponse`](crate::BatchResponse): a
/// report of it has no `into_response`, which would answer `Ok` over failed events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NoResponse;

impl<T> BatchReport<T, NoResponse> {
    /// The invocation's result: `Ok` when every log event ran or was skipped, otherwise
    /// [`BatchError::SomeFailed`], so Lambda retries the invocation (the events that ran
    /// replay from the store) and then gives it to the on-failure destination. A permanent
    /// failure fails it too: acknowledged, its event would be lost.
    pub fn into_result(self) -> Result<(), BatchError> {
        let count = self.records.len() + self.skipped.len();
        let mut failures = self.records.into_iter().filter_map(|r| r.result.err());
        let Some(first) = failures.next() else {
            return Ok(());
        };
        Err(BatchError::SomeFailed {
            failed: 1 + failures.count(),
            count,
            first_reason: first.reason,
        })
    }
}

/// Runs every log event of a CloudWatch Logs subscription's invocation, concurrently, each
/// keyed by the handler (the event's `id` is unique and stable across deliveries).
///
/// The invocation is asynchronous: there is no partial batch response. When any log event
/// fails, [`run`](Self::run) and [`run_json`](Self::run_json) fail the invocation
/// ([`BatchError::SomeFailed`]); Lambda retries it (twice by default), the events that ran
/// answer from the store, and a last failure goes to the function's on-failure destination
/// or dead-letter queue. The subscription's `CONTROL_MESSAGE` runs nothing. As every
/// failure fails the invocation, `fail_invocation_when_all_fail` and
/// `stop_at_permanent_failures` change nothing here.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::{CloudWatchLogsBatch, CloudWatchLogsEvent, Idempotency, KeyStrategy, MemoryStore, Operation};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::{Value, json};
/// use std::io::Write;
///
/// let logs = json!({"messageType": "DATA_MESSAGE", "logGroup": "/app", "logStream": "s",
///     "logEvents": [{"id": "3719", "timestamp": 0, "message": "{\"alert\": \"disk\"}"}]});
/// let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
/// gz.write_all(logs.to_string().as_bytes()).unwrap();
/// let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, gz.finish().unwrap());
/// let event: CloudWatchLogsEvent = serde_json::from_value(json!({"awslogs": {"data": data}})).unwrap();
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("page", KeyStrategy::field("id"));
/// CloudWatchLogsBatch::new()
///     .run_json(LambdaEvent::new(event, Context::default()), |alert: Value, log| {
///         let (idempotency, op) = (&idempotency, &op);
///         async move {
///             let keyed = json!({"id": log.id, "alert": alert});
///             idempotency.run(op, &keyed, || async { Ok::<_, lambda_runtime::Error>(()) }).await
///         }
///     })
///     .await
///     .unwrap();
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct CloudWatchLogsBatch {
    settings: Settings,
}

batch_setters!(CloudWatchLogsBatch, "log events");

impl CloudWatchLogsBatch {
    /// A processor running up to 10 log events at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` on every log event: `Ok` when all ran, otherwise the invocation's
    /// error.
    pub async fn run<T, E, F, Fut>(
        &self,
        event: lambda_runtime::LambdaEvent<CloudWatchLogsEvent>,
        handler: F,
    ) -> Result<(), BatchError>
    where
        F: Fn(LogEvent) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.report(event, handler).await?.into_result()
    }

    /// Like [`run`](Self::run), with each message parsed as JSON into `B` first (through
    /// the batch's [`envelope`](Self::envelope), if set): one that does not parse is a
    /// [`MalformedBody`](crate::FailureKind::MalformedBody) failure.
    pub async fn run_json<B, T, E, F, Fut>(
        &self,
        event: lambda_runtime::LambdaEvent<CloudWatchLogsEvent>,
        handler: F,
    ) -> Result<(), BatchError>
    where
        B: DeserializeOwned,
        F: Fn(B, LogEvent) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.report_json(event, handler).await?.into_result()
    }

    /// Like [`run_json`](Self::run_json), returning what happened to each log event.
    pub async fn report_json<B, T, E, F, Fut>(
        &self,
        event: lambda_runtime::LambdaEvent<CloudWatchLogsEvent>,
        handler: F,
    ) -> Result<BatchReport<T, NoResponse>, BatchError>
    where
        B: DeserializeOwned,
        F: Fn(B, LogEvent) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let envelope = self.settings.envelope.as_deref();
        let handler = &handler;
        // The envelope's own messages are acknowledged, as in every batch.
        let skip = move |log: &LogEvent| {
            envelope.and_then(|e| envelope::skip_reason_of(e, log.message.as_bytes()))
        };
        self.report_skipping(event, skip, move |log: LogEvent| async move {
            let body: B = envelope::parse(Some(&log.id), log.message.as_bytes(), envelope)
                .map_err(BoxError::from)?;
            handler(body, log).await.map_err(Into::into)
        })
        .await
    }

    /// Runs `handler` on every log event and returns what happened to each; an error when
    /// the event does not decode.
    pub async fn report<T, E, F, Fut>(
        &self,
        event: lambda_runtime::LambdaEvent<CloudWatchLogsEvent>,
        handler: F,
    ) -> Result<BatchReport<T, NoResponse>, BatchError>
    where
        F: Fn(LogEvent) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        self.report_skipping(event, |_: &LogEvent| None, handler)
            .await
    }

    /// [`report`](Self::report), acknowledging without running the log events `skip`
    /// names a reason for.
    async fn report_skipping<T, E, F, Fut>(
        &self,
        event: lambda_runtime::LambdaEvent<CloudWatchLogsEvent>,
        skip: impl Fn(&LogEvent) -> Option<String>,
        handler: F,
    ) -> Result<BatchReport<T, NoResponse>, BatchError>
    where
        F: Fn(LogEvent) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let malformed = |reason: String| BatchError::Malformed { reason };
        let value = serde_json::to_value(&event.payload).map_err(|e| malformed(e.to_string()))?;
        let data: LogsData = match Envelope::cloudwatch_logs().open_value(value) {
            Ok(Opened::Request(data)) => serde_json::from_value(data).map_err(|e| {
                let e = super::record::without_values(&e.to_string());
                malformed(format!("not CloudWatch Logs data ({e})"))
            })?,
            Ok(Opened::Skip { reason }) => {
                tracing::info!("acknowledged without running: {reason}");
                crate::metrics::batch_skipped("envelope");
                return Ok(BatchReport {
                    records: Vec::new(),
                    skipped: vec![SkippedRecord {
                        index: 0,
                        item_id: None,
                        reason,
                    }],
                    fail_invocation_when_all_fail: false,
                    response: std::marker::PhantomData,
                });
            }
            Err(e) => return Err(malformed(e.to_string())),
        };
        let mut records: Vec<LogEvent> = data
            .log_events
            .into_iter()
            .map(|e| LogEvent {
                id: e.id,
                timestamp: e.timestamp,
                message: e.message,
                log_group: data.log_group.clone(),
                log_stream: data.log_stream.clone(),
            })
            .collect();
        if let Some(index) = records.iter().position(|r| r.id.is_empty()) {
            return Err(malformed(format!("log event {index} has no id")));
        }
        let now = self.settings.clock.now();
        let deadline = invocation::context_deadline_at(&event.context, now);
        let rule = GroupRule {
            noun: "log event",
            stop_at_permanent: self.settings.stop_at_permanent_failures,
            wait_for_in_progress: None,
        };
        let skipped = envelope::take_skipped(&mut records, skip);
        let groups = records.into_iter().enumerate().map(|r| vec![r]).collect();
        let run = super::run_groups(&self.settings, groups, rule, deadline, handler);
        let cx = CallContext::current().with_lambda(invocation::from_lambda(&event.context));
        Ok(skipped.into_report(run.with_call_context(cx).await))
    }
}

//! Kinesis Data Streams: a shard's records in order, reported by sequence number.

use super::record::{BatchRecord, GroupRule};
use super::settings::{Settings, batch_entry_points, batch_setters, stream_setters};
use super::{BatchReport, InvalidBody, envelope};
use crate::envelope::Envelope;
use crate::error::BoxError;
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::KinesisEventResponse;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::time::SystemTime;

/// Processes the records of a Kinesis event and reports failures by sequence number.
///
/// - By default the shard's order is kept: records run one after another, and the batch
///   stops at the first failure a retry can fix (a key in progress elsewhere, a store or
///   provider error, a panic, the deadline). That record is reported, and the ones after it
///   are reported too without running
///   ([`SkippedAfterGroupFailure`](crate::FailureKind::SkippedAfterGroupFailure)): Lambda
///   resumes the shard from the lowest reported sequence number, so they come again after
///   it, in order.
/// - A permanent failure (data that is not JSON, a missing key, a payload that does not
///   match its stored one, a [`PermanentError`](crate::PermanentError)) is reported and the
///   batch goes on: the records after it run now, and when Lambda resends them they are
///   answered from the store. When the retries run out only the poison record is lost.
///   [`stop_at_permanent_failures`](Self::stop_at_permanent_failures) stops there too;
///   [`continue_past_failures`](Self::continue_past_failures) never stops.
/// - The data is base64 in the event; [`run_json`](Self::run_json) parses the decoded bytes
///   as JSON, and bytes that do not parse (or are not UTF-8) are a
///   [`MalformedBody`](crate::FailureKind::MalformedBody) failure.
/// - The batch answers before the invocation's deadline whatever hangs, as [`SqsBatch`](crate::SqsBatch).
///
/// **Enable `ReportBatchItemFailures` on the event source mapping**, or Lambda retries the
/// whole batch on an error and moves past it otherwise. The other settings that matter
/// (`BisectBatchOnFunctionError`, `MaximumRetryAttempts`, an on-failure destination) are in
/// the deployment guide, `docs/deploy.md`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use aws_lambda_events::event::kinesis::KinesisEvent;
/// use lambda_idempotency::{Idempotency, KeyStrategy, KinesisBatch, MemoryStore, Operation};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::{Value, json};
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("greet", KeyStrategy::field("id"));
/// let record = |seq: &str, data: &str| json!({"eventSource": "aws:kinesis", "kinesis": {
///     "sequenceNumber": seq, "partitionKey": "p", "data": data,
///     "approximateArrivalTimestamp": 1700000000.0}});
/// // {"id": "a"}, then bytes that are not JSON, then {"id": "b"}.
/// let event: KinesisEvent = serde_json::from_value(json!({"Records": [
///     record("1", "eyJpZCI6ICJhIn0="), record("2", "bm90IGpzb24="), record("3", "eyJpZCI6ICJiIn0="),
/// ]})).unwrap();
///
/// let response = KinesisBatch::new()
///     .run_json(LambdaEvent::new(event, Context::default()), |body: Value, _record| {
///         let (idempotency, op) = (&idempotency, &op);
///         async move {
///             idempotency.run(op, &body, || async { Ok::<_, lambda_runtime::Error>(()) }).await
///         }
///     })
///     .await
///     .unwrap();
/// // The poison record is reported; the one after it ran.
/// assert_eq!(serde_json::to_value(&response).unwrap(),
///            json!({"batchItemFailures": [{"itemIdentifier": "2"}]}));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct KinesisBatch {
    settings: Settings,
}

batch_setters!(KinesisBatch, "records (only with `continue_past_failures`)");
stream_setters!(KinesisBatch);
batch_entry_points!(
    KinesisBatch,
    KinesisEvent,
    KinesisEventRecord,
    KinesisEventRecord,
    KinesisEventResponse,
    "each record's decoded data parsed as JSON into `B`"
);

/// A record's decoded data parsed as JSON.
fn json_input<B: DeserializeOwned>(
    record: KinesisEventRecord,
    envelope: Option<&Envelope>,
) -> Result<(B, KinesisEventRecord), InvalidBody> {
    let item_id = record.item_id();
    let body = envelope::parse(item_id.as_deref(), &record.kinesis.data.0, envelope)?;
    Ok((body, record))
}

/// Why the envelope acknowledges this record without running it, if it does.
fn skip_reason(record: &KinesisEventRecord, envelope: Option<&Envelope>) -> Option<String> {
    envelope::skip_reason_of(envelope?, &record.kinesis.data.0)
}

impl BatchRecord for KinesisEventRecord {
    fn item_id(&self) -> Option<String> {
        Some(self.kinesis.sequence_number.clone()).filter(|s| !s.is_empty())
    }
}

impl KinesisBatch {
    /// A processor that keeps the shard's order.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` on `records` within an invocation that ends at `deadline`.
    pub async fn report_records<T, E, F, Fut>(
        &self,
        records: Vec<KinesisEventRecord>,
        deadline: Option<SystemTime>,
        handler: F,
    ) -> BatchReport<T, KinesisEventResponse>
    where
        F: Fn(KinesisEventRecord) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let rule = GroupRule {
            noun: "shard",
            stop_at_permanent: self.settings.stop_at_permanent_failures,
            wait_for_in_progress: self.settings.time_to_run_after_a_wait,
        };
        let groups = super::stream_groups(records.into_iter().enumerate(), self.settings.in_order);
        super::run_groups(&self.settings, groups, rule, deadline, handler).await
    }
}

//! Kafka (Amazon MSK and self-managed): partitions concurrently, each in offset order.

use super::kafka_event::{self, KafkaBatchResponse, KafkaEvent, KafkaRecord};
use super::record::{BatchRecord, GroupRule};
use super::report::BatchResponse;
use super::settings::{Settings, batch_entry_points, batch_setters, stream_setters};
use super::{BatchReport, InvalidBody, envelope, fifo};
use crate::envelope::Envelope;
use crate::error::BoxError;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::time::SystemTime;

/// Processes a Kafka event: partitions concurrently, each partition's records in offset
/// order, with the rules of the stream batches.
///
/// - Within a partition, the first failure a retry can fix stops it: that record and the
///   later ones are reported, and Lambda resumes the partition at that offset. A
///   permanent failure ([`FailureKind::is_permanent`](crate::FailureKind::is_permanent):
///   a value that does not decode, a [`PermanentError`](crate::PermanentError)) is
///   reported and the partition goes on, so a poison record costs only itself
///   ([`stop_at_permanent_failures`](Self::stop_at_permanent_failures) to stop anyway).
/// - The response names, for each partition with a failure, the partition's key as Lambda
///   sent it and the lowest failed offset ([`KafkaBatchResponse`]).
/// - `run_json` decodes each value from base64 (then the envelope, if set) and parses it
///   as JSON. A tombstone (a `null` value) is acknowledged without running, in
///   [`BatchReport::skipped`](crate::BatchReport::skipped); `run` and `report` hand every
///   record over as it came.
/// - A record's item id in the report is `<partition key>@<offset>`.
/// - Twins (one key twice in the batch, in one partition or two) run once; a key in
///   progress elsewhere is waited for as in the other stream batches
///   ([`wait_for_in_progress`](Self::wait_for_in_progress)).
///
/// **Enable `ReportBatchItemFailures` on the event source mapping**, or a returned
/// response is read as "every record succeeded".
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::{Idempotency, KafkaBatch, KafkaEvent, KeyStrategy, MemoryStore, Operation};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::{Value, json};
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("order", KeyStrategy::field("order_id"));
/// let value = |v: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, v);
/// let event: KafkaEvent = serde_json::from_value(json!({
///     "eventSource": "aws:kafka",
///     "records": {"orders-0": [
///         {"topic": "orders", "partition": 0, "offset": 15, "timestamp": 0, "key": null,
///          "value": value(r#"{"order_id": "o-1"}"#), "headers": null},
///         {"topic": "orders", "partition": 0, "offset": 16, "timestamp": 0, "key": null,
///          "value": value("not json"), "headers": []},
///     ]},
/// })).unwrap();
///
/// let response = KafkaBatch::new()
///     .run_json(LambdaEvent::new(event, Context::default()), |order: Value, _record| {
///         let (idempotency, op) = (&idempotency, &op);
///         async move {
///             idempotency.run(op, &order, || async { Ok::<_, lambda_runtime::Error>(()) }).await
///         }
///     })
///     .await
///     .unwrap();
/// assert_eq!(serde_json::to_value(&*response).unwrap(), json!({"batchItemFailures": [
///     {"itemIdentifier": {"partition": "orders-0", "offset": 16}},
/// ]}));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct KafkaBatch {
    settings: Settings,
}

batch_setters!(KafkaBatch, "partitions");
stream_setters!(KafkaBatch);
batch_entry_points!(
    KafkaBatch,
    KafkaEvent,
    KafkaRecord,
    KafkaRecord,
    KafkaBatchResponse,
    "each value decoded from base64 and parsed as JSON into `B`"
);

impl BatchRecord for KafkaRecord {
    fn item_id(&self) -> Option<String> {
        Some(kafka_event::item_id(self))
    }
}

impl super::report::sealed::Sealed for KafkaBatchResponse {}
impl BatchResponse for KafkaBatchResponse {
    fn add_failure(&mut self, item_id: String) {
        match kafka_event::parse_item_id(&item_id) {
            Some((partition, offset)) => KafkaBatchResponse::add_failure(self, partition, offset),
            // Every item id here is one `item_id` made. Were one not, offset -1 is in no
            // event: Lambda reads the response as failed and retries the whole batch,
            // which loses nothing.
            None => KafkaBatchResponse::add_failure(self, &item_id, -1),
        }
    }
}

impl KafkaBatch {
    /// A processor running up to 10 partitions at once, each in offset order.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` on `records` within an invocation that ends at `deadline`.
    pub async fn report_records<T, E, F, Fut>(
        &self,
        records: Vec<KafkaRecord>,
        deadline: Option<SystemTime>,
        handler: F,
    ) -> BatchReport<T, KafkaBatchResponse>
    where
        F: Fn(KafkaRecord) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let rule = GroupRule {
            noun: "partition",
            stop_at_permanent: self.settings.stop_at_permanent_failures,
            wait_for_in_progress: self.settings.time_to_run_after_a_wait,
        };
        let groups = if self.settings.in_order {
            let mut groups = fifo::group_by(records, KafkaRecord::partition_name);
            // Lambda sends a partition in offset order; a map written by hand may not.
            for group in &mut groups {
                group.sort_by_key(|(_, record)| record.offset);
            }
            groups
        } else {
            records.into_iter().enumerate().map(|r| vec![r]).collect()
        };
        super::run_groups(&self.settings, groups, rule, deadline, handler).await
    }
}

/// A record's value decoded and parsed as JSON (the request in it, through the envelope).
fn json_input<B: DeserializeOwned>(
    record: KafkaRecord,
    envelope: Option<&Envelope>,
) -> Result<(B, KafkaRecord), InvalidBody> {
    let item_id = kafka_event::item_id(&record);
    let invalid = |reason: String| InvalidBody {
        item_id: item_id.clone(),
        reason,
    };
    let bytes = match record.value_bytes() {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(invalid("the record has no value (a tombstone)".into())),
        Err(e) => return Err(invalid(format!("the value is not base64 ({e})"))),
    };
    let body = envelope::parse(Some(&item_id), &bytes, envelope)?;
    Ok((body, record))
}

/// Why this record is acknowledged without running: a tombstone, or a carrier's own
/// message the envelope skips.
fn skip_reason(record: &KafkaRecord, envelope: Option<&Envelope>) -> Option<String> {
    match record.value_bytes() {
        Ok(None) => Some("a tombstone (null value): no request to run".into()),
        Ok(Some(bytes)) => envelope.and_then(|e| envelope::skip_reason_of(e, &bytes)),
        Err(_) => None,
    }
}

//! DynamoDB Streams: a shard's changes in order, images as plain JSON.

use super::record::{BatchRecord, GroupRule};
use super::settings::{Settings, batch_entry_points, batch_setters, stream_setters};
use super::{BatchReport, InvalidBody, SkippedRecord, dynamodb_json, envelope, record};
use crate::envelope::Envelope;
use crate::error::BoxError;
use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::future::Future;
use std::time::SystemTime;

/// Processes the records of a DynamoDB Streams event and reports failures by sequence
/// number. The same rules as [`KinesisBatch`](crate::KinesisBatch): the shard's order kept,
/// a stop at the first failure a retry can fix, past a permanent one, an answer before the
/// deadline.
///
/// [`run_json`](Self::run_json) hands the handler the record's **new image** as plain JSON
/// parsed into `B`, and a [`StreamChange`] with the event name, the keys and the old image.
/// DynamoDB's typed attributes become plain JSON as follows, so keys and validated fields
/// are written as for an SQS body:
///
/// | DynamoDB | JSON |
/// |---|---|
/// | `S` | string |
/// | `N` | number: an integer when it is a whole number that fits 64 bits; a double when it has at most 15 significant digits; otherwise a string, exactly as written |
/// | `BOOL`, `NULL` | `true`/`false`, `null` |
/// | `M`, `L` | object, array |
/// | `SS`, `NS` | array of strings, array of numbers, sorted (a set has no order) |
/// | `B`, `BS` | base64 string, array of base64 strings, sorted |
///
/// A `REMOVE` is acknowledged without running the handler by default: a table with a TTL
/// streams one for every item that expires, and each is no request to run. It is logged,
/// listed in [`BatchReport::skipped`](crate::BatchReport::skipped) and counted
/// ([`metrics::BATCH_SKIPPED`](crate::metrics::BATCH_SKIPPED)), never a batch item
/// failure. A handler that acts on deletions says so with
/// [`run_removals`](Self::run_removals) and is handed the **old image** of each `REMOVE`.
/// An `INSERT` or `MODIFY` without a new image (a stream whose view type is `KEYS_ONLY` or
/// `OLD_IMAGE`: a deployment that cannot work) is a
/// [`MalformedBody`](crate::FailureKind::MalformedBody) failure that says so, as is an
/// image that does not convert or parse into `B`: left for the on-failure destination,
/// never acknowledged unprocessed.
///
/// **Enable `ReportBatchItemFailures` on the event source mapping.**
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use aws_lambda_events::event::dynamodb::Event;
/// use lambda_idempotency::{DynamoDbStreamBatch, Idempotency, KeyStrategy, MemoryStore, Operation};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::{Value, json};
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("greet", KeyStrategy::field("id"));
/// let record = |seq: &str, name: &str, image: Value| json!({
///     "eventID": seq, "eventName": name, "awsRegion": "us-east-1", "eventSource": "aws:dynamodb",
///     "dynamodb": {"SequenceNumber": seq, "SizeBytes": 10, "Keys": {"id": {"S": "a"}},
///                  "NewImage": image, "StreamViewType": "NEW_AND_OLD_IMAGES"}});
/// let event: Event = serde_json::from_value(json!({"Records": [
///     record("100", "INSERT", json!({"id": {"S": "a"}, "n": {"N": "1"}})),
///     record("200", "REMOVE", Value::Null),
/// ]})).unwrap();
///
/// let response = DynamoDbStreamBatch::new()
///     .run_json(LambdaEvent::new(event, Context::default()), |image: Value, change| {
///         let (idempotency, op) = (&idempotency, &op);
///         assert_eq!((image["n"].as_i64(), change.event_name.as_str()), (Some(1), "INSERT"));
///         async move {
///             idempotency.run(op, &image, || async { Ok::<_, lambda_runtime::Error>(()) }).await
///         }
///     })
///     .await
///     .unwrap();
/// // The REMOVE is acknowledged without running.
/// assert_eq!(serde_json::to_value(&response).unwrap(), json!({"batchItemFailures": []}));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct DynamoDbStreamBatch {
    settings: Settings,
    run_removals: bool,
}

/// The event name of a deletion (a TTL expiry or a `DeleteItem`).
const REMOVE: &str = "REMOVE";

batch_setters!(
    DynamoDbStreamBatch,
    "records (only with `continue_past_failures`)"
);
stream_setters!(DynamoDbStreamBatch);
batch_entry_points!(
    DynamoDbStreamBatch,
    Event,
    EventRecord,
    StreamChange,
    DynamoDbEventResponse,
    "each record's new image (a `REMOVE`'s old image, with `run_removals`) converted to plain JSON and parsed into `B` (a record without that image does not parse either)"
);

/// A record's change, its new image (a removal's old image) parsed.
fn json_input<B: DeserializeOwned>(
    record: EventRecord,
    envelope: Option<&Envelope>,
) -> Result<(B, StreamChange), InvalidBody> {
    let change = StreamChange::from_record(record)?;
    let image = match envelope {
        None => change.image_as()?,
        Some(envelope) => {
            let image: Value = change.image_as()?;
            envelope::parse_value(change.record.item_id().as_deref(), image, envelope)?
        }
    };
    Ok((image, change))
}

/// Why the envelope acknowledges this change without running it, if it does.
fn skip_reason(record: &EventRecord, envelope: Option<&Envelope>) -> Option<String> {
    let envelope = envelope.filter(|e| e.can_skip())?;
    let image: Value = StreamChange::from_record(record.clone())
        .ok()?
        .image_as()
        .ok()?;
    match envelope.open_value(image) {
        Ok(crate::envelope::Opened::Skip { reason }) => Some(reason),
        _ => None,
    }
}

impl BatchRecord for EventRecord {
    fn item_id(&self) -> Option<String> {
        self.change
            .sequence_number
            .clone()
            .filter(|s| !s.is_empty())
    }
}

/// One change of a DynamoDB stream, its images as plain JSON (see
/// [`DynamoDbStreamBatch`] for the conversion).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamChange {
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event_name: String,
    /// The item's key attributes.
    pub keys: Value,
    /// The item after the change: absent on a `REMOVE` and on streams that do not carry it.
    pub new_image: Option<Value>,
    /// The item before the change: absent on an `INSERT` and on streams that do not carry it.
    pub old_image: Option<Value>,
    /// The record as Lambda delivered it.
    pub record: EventRecord,
}

impl StreamChange {
    /// The change `record` describes, its images converted to plain JSON; an attribute that
    /// does not convert is an [`InvalidBody`] naming the attribute (never its value).
    pub fn from_record(record: EventRecord) -> Result<Self, InvalidBody> {
        let item_id = record.item_id().unwrap_or_default();
        let convert = |what: &str, item: &serde_json::Map<String, Value>| {
            dynamodb_json::item_to_json(item).map_err(|reason| InvalidBody {
                item_id: item_id.clone(),
                reason: format!("its {what} does not convert to JSON: {reason}"),
            })
        };
        let typed = |item: &_| match serde_json::to_value(item) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let (keys, new, old) = (
            typed(&record.change.keys),
            typed(&record.change.new_image),
            typed(&record.change.old_image),
        );
        Ok(Self {
            event_name: record.event_name.clone(),
            keys: convert("keys", &keys)?,
            new_image: (!new.is_empty())
                .then(|| convert("new image", &new))
                .transpose()?,
            old_image: (!old.is_empty())
                .then(|| convert("old image", &old))
                .transpose()?,
            record,
        })
    }

    /// The new image (a `REMOVE`'s old image) parsed into `B`; none is an [`InvalidBody`]
    /// that says why.
    fn image_as<B: DeserializeOwned>(&self) -> Result<B, InvalidBody> {
        let item_id = self.record.item_id().unwrap_or_default();
        let (image, which) = match self.event_name.as_str() {
            REMOVE => (&self.old_image, "old"),
            _ => (&self.new_image, "new"),
        };
        let Some(image) = image else {
            return Err(InvalidBody {
                item_id,
                reason: format!(
                    "it has no {which} image (eventName {}, StreamViewType {}): the stream does not carry {which} images",
                    self.event_name,
                    self.record
                        .change
                        .stream_view_type
                        .as_ref()
                        .and_then(|t| serde_json::to_value(t).ok())
                        .and_then(|t| t.as_str().map(str::to_owned))
                        .unwrap_or_else(|| "absent".to_owned())
                ),
            });
        };
        B::deserialize(image).map_err(|e| InvalidBody {
            item_id,
            reason: format!(
                "its image is not the handler's input: {}",
                record::without_values(&e.to_string())
            ),
        })
    }
}

impl DynamoDbStreamBatch {
    /// A processor that keeps the shard's order.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `handler` on `records` within an invocation that ends at `deadline`.
    pub async fn report_records<T, E, F, Fut>(
        &self,
        records: Vec<EventRecord>,
        deadline: Option<SystemTime>,
        handler: F,
    ) -> BatchReport<T, DynamoDbEventResponse>
    where
        F: Fn(EventRecord) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let rule = GroupRule {
            noun: "shard",
            stop_at_permanent: self.settings.stop_at_permanent_failures,
            wait_for_in_progress: self.settings.time_to_run_after_a_wait,
        };
        let mut skipped = Vec::new();
        let mut to_run = Vec::with_capacity(records.len());
        for (index, record) in records.into_iter().enumerate() {
            if record.event_name == REMOVE && !self.run_removals {
                let item_id = record.item_id();
                tracing::info!(
                    item_id = item_id.as_deref().unwrap_or_default(),
                    "a REMOVE: acknowledged without running (run_removals is off)"
                );
                crate::metrics::batch_skipped("remove");
                skipped.push(SkippedRecord {
                    index,
                    item_id,
                    reason: "a REMOVE (an expired or deleted item): acknowledged without running; `run_removals(true)` runs the handler on removals".into(),
                });
            } else {
                to_run.push((index, record));
            }
        }
        let groups = super::stream_groups(to_run, self.settings.in_order);
        let mut report = super::run_groups(&self.settings, groups, rule, deadline, handler).await;
        report.skipped = skipped;
        report
    }

    /// Runs the handler on `REMOVE` records too, with the item's **old image** as the
    /// JSON input (the stream must carry old images: `NEW_AND_OLD_IMAGES` or `OLD_IMAGE`).
    /// Default: off, a `REMOVE` is acknowledged without running (a TTL expiry is no
    /// request). With it on, a `REMOVE` counts as any record: keep the event source
    /// mapping's `FilterCriteria` to the removals you want, or each one runs.
    pub fn run_removals(mut self, yes: bool) -> Self {
        self.run_removals = yes;
        self
    }
}

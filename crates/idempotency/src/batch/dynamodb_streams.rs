//! DynamoDB Streams: a shard's changes in order, images as plain JSON.

use super::record::{BatchRecord, GroupRule};
use super::settings::{Settings, batch_entry_points, batch_setters, stream_setters};
use super::{BatchReport, InvalidBody, dynamodb_json, record};
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
/// A record without a new image (a `REMOVE`, or a stream whose view type is `KEYS_ONLY` or
/// `OLD_IMAGE`) is a [`MalformedBody`](crate::FailureKind::MalformedBody) failure with that
/// reason, as is an image that does not convert or parse into `B`. To act on removals, use
/// [`run`](Self::run) with [`StreamChange::from_record`], or keep them from the function
/// with the event source mapping's filter (`FilterCriteria` on `eventName`).
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
/// // The REMOVE has no new image: reported, with that reason in the log.
/// assert_eq!(serde_json::to_value(&response).unwrap(),
///            json!({"batchItemFailures": [{"itemIdentifier": "200"}]}));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct DynamoDbStreamBatch {
    settings: Settings,
}

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
    "each record's new image converted to plain JSON and parsed into `B` (a record without a new image does not parse either)"
);

/// A record's change, its new image parsed.
fn json_input<B: DeserializeOwned>(record: EventRecord) -> Result<(B, StreamChange), InvalidBody> {
    let change = StreamChange::from_record(record)?;
    let image = change.new_image_as()?;
    Ok((image, change))
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

    /// The new image parsed into `B`; none is an [`InvalidBody`] that says why.
    fn new_image_as<B: DeserializeOwned>(&self) -> Result<B, InvalidBody> {
        let item_id = self.record.item_id().unwrap_or_default();
        let Some(image) = &self.new_image else {
            return Err(InvalidBody {
                item_id,
                reason: format!(
                    "it has no new image (eventName {}, StreamViewType {}): a REMOVE, or a stream that does not carry new images",
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
                "its new image is not the handler's input: {}",
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
        let groups = super::stream_groups(records, self.settings.in_order);
        super::run_groups(&self.settings, groups, rule, deadline, handler).await
    }
}

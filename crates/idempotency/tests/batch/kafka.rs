//! Kafka batches: partitions concurrently, each in offset order, and the response Lambda
//! reads, checked against the JSON it documents.

use base64::Engine;
use lambda_idempotency::{
    FailureKind, Idempotency, KafkaBatch, KafkaBatchResponse, KafkaEvent, KafkaRecord, KeyStrategy,
    MemoryStore, Operation, PermanentError,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn record(topic: &str, partition: i64, offset: i64, value: Option<&str>) -> Value {
    json!({
        "topic": topic, "partition": partition, "offset": offset,
        "timestamp": 1_764_925_200_000i64, "timestampType": "CREATE_TIME",
        "key": null, "value": value.map(b64), "headers": null,
    })
}

fn event(records: Value) -> LambdaEvent<KafkaEvent> {
    let event = json!({
        "eventSource": "aws:kafka",
        "eventSourceArn": "arn:aws:kafka:us-east-1:123456789012:cluster/orders/abc",
        "bootstrapServers": "b-1.orders.kafka.us-east-1.amazonaws.com:9098",
        "records": records,
    });
    LambdaEvent::new(serde_json::from_value(event).unwrap(), Context::default())
}

/// A handler keyed on `id` that logs what ran, fails on `"fail"` and refuses `"refuse"`.
struct Handler {
    idempotency: Idempotency,
    calls: AtomicU32,
    ran: Mutex<Vec<(String, i64)>>,
}

impl Handler {
    fn new() -> Self {
        Self {
            idempotency: Idempotency::new(MemoryStore::new()),
            calls: AtomicU32::new(0),
            ran: Mutex::default(),
        }
    }

    async fn run(
        &self,
        batch: &KafkaBatch,
        event: LambdaEvent<KafkaEvent>,
    ) -> lambda_idempotency::BatchReport<(), KafkaBatchResponse> {
        let op = Operation::new("order", KeyStrategy::field("id"));
        batch
            .report_json(event, |body: Value, record: KafkaRecord| {
                let op = &op;
                async move {
                    self.ran
                        .lock()
                        .unwrap()
                        .push((record.partition_key.clone(), record.offset));
                    let action = body["action"].as_str().unwrap_or("ok").to_owned();
                    let result = self
                        .idempotency
                        .execute(op, &body, || async {
                            self.calls.fetch_add(1, Ordering::SeqCst);
                            match action.as_str() {
                                "fail" => Err(lambda_runtime::Error::from("the provider is down")),
                                "refuse" => Err(PermanentError::new("refused for good").into()),
                                _ => Ok(()),
                            }
                        })
                        .await;
                    result
                        .map(|_| ())
                        .map_err(lambda_idempotency::ExecuteError::into_inner)
                }
            })
            .await
    }
}

fn kinds(
    report: &lambda_idempotency::BatchReport<(), KafkaBatchResponse>,
) -> Vec<(String, Option<FailureKind>)> {
    report
        .records
        .iter()
        .map(|r| {
            (
                r.item_id.clone().unwrap(),
                r.result.as_ref().err().map(|f| f.kind),
            )
        })
        .collect()
}

#[test]
fn the_response_is_the_shape_lambda_documents() {
    // Lambda's partial batch response for Kafka: the partition as the `records` map's
    // key, and the offset as a number.
    let documented: Value = serde_json::from_str(
        r#"{"batchItemFailures": [{"itemIdentifier": {"partition": "orders-0", "offset": 15}}]}"#,
    )
    .unwrap();
    let mut response = KafkaBatchResponse::default();
    response.add_failure("orders-0", 17);
    response.add_failure("orders-0", 15);
    response.add_failure("orders-0", 16);
    assert_eq!(serde_json::to_value(&response).unwrap(), documented);
    assert_eq!(
        serde_json::to_value(KafkaBatchResponse::default()).unwrap(),
        json!({"batchItemFailures": []})
    );
}

#[tokio::test]
async fn partitions_in_any_order_each_run_in_offset_order() {
    let handler = Handler::new();
    // The map's keys in reverse, and a partition's records out of order.
    let records = json!({
        "orders-1": [
            record("orders", 1, 7, Some(r#"{"id": "b2"}"#)),
            record("orders", 1, 5, Some(r#"{"id": "b1"}"#)),
        ],
        "orders-0": [
            record("orders", 0, 3, Some(r#"{"id": "a1"}"#)),
            record("orders", 0, 4, Some(r#"{"id": "a2"}"#)),
        ],
    });
    let report = handler.run(&KafkaBatch::new(), event(records)).await;
    assert!(
        kinds(&report).iter().all(|(_, k)| k.is_none()),
        "{:?}",
        kinds(&report)
    );
    let ran = handler.ran.lock().unwrap().clone();
    let offsets = |partition: &str| -> Vec<i64> {
        ran.iter()
            .filter(|(p, _)| p == partition)
            .map(|(_, o)| *o)
            .collect()
    };
    assert_eq!(offsets("orders-0"), vec![3, 4]);
    assert_eq!(offsets("orders-1"), vec![5, 7]);
    let response = serde_json::to_value(&*report.into_response().unwrap()).unwrap();
    assert_eq!(response, json!({"batchItemFailures": []}));
}

#[tokio::test]
async fn a_retryable_failure_stops_its_partition_only_and_names_its_offset() {
    let handler = Handler::new();
    let records = json!({
        "orders-0": [
            record("orders", 0, 15, Some(r#"{"id": "a1"}"#)),
            record("orders", 0, 16, Some(r#"{"id": "a2", "action": "fail"}"#)),
            record("orders", 0, 17, Some(r#"{"id": "a3"}"#)),
        ],
        "orders-1": [
            record("orders", 1, 40, Some(r#"{"id": "b1"}"#)),
            record("orders", 1, 41, Some(r#"{"id": "b2"}"#)),
        ],
    });
    let report = handler.run(&KafkaBatch::new(), event(records)).await;
    assert_eq!(
        kinds(&report),
        vec![
            ("orders-0@15".into(), None),
            ("orders-0@16".into(), Some(FailureKind::Error)),
            (
                "orders-0@17".into(),
                Some(FailureKind::SkippedAfterGroupFailure)
            ),
            ("orders-1@40".into(), None),
            ("orders-1@41".into(), None),
        ]
    );
    let response = serde_json::to_value(&*report.into_response().unwrap()).unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": {"partition": "orders-0", "offset": 16}}]})
    );
}

#[tokio::test]
async fn a_poison_record_costs_only_itself_and_an_offset_past_2_53_stays_exact() {
    let handler = Handler::new();
    let big = (1i64 << 53) + 1;
    let mut not_base64 = record("orders", 0, big + 1, None);
    not_base64["value"] = json!("***");
    let records = json!({
        "orders-0": [
            record("orders", 0, big, Some("not json")),
            not_base64,
            record("orders", 0, big + 2, Some(r#"{"id": "a1", "action": "refuse"}"#)),
            record("orders", 0, big + 3, Some(r#"{"id": "a2"}"#)),
        ],
    });
    let report = handler.run(&KafkaBatch::new(), event(records)).await;
    let kinds: Vec<_> = kinds(&report).into_iter().map(|(_, k)| k).collect();
    assert_eq!(
        kinds,
        vec![
            Some(FailureKind::MalformedBody),
            Some(FailureKind::MalformedBody),
            Some(FailureKind::Permanent),
            None,
        ]
    );
    let reason = &report.records[1].result.as_ref().unwrap_err().reason;
    assert!(reason.contains("not base64"), "{reason}");
    let response = serde_json::to_string(&*report.into_response().unwrap()).unwrap();
    assert_eq!(
        response,
        format!(
            r#"{{"batchItemFailures":[{{"itemIdentifier":{{"partition":"orders-0","offset":{big}}}}}]}}"#
        )
    );
}

#[tokio::test]
async fn twins_across_partitions_run_once_and_a_tombstone_is_skipped() {
    let handler = Handler::new();
    let records = json!({
        "orders-0": [record("orders", 0, 1, Some(r#"{"id": "same"}"#)), record("orders", 0, 2, None)],
        "orders-1": [record("orders", 1, 9, Some(r#"{"id": "same"}"#))],
    });
    let report = handler.run(&KafkaBatch::new(), event(records)).await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].item_id.as_deref(), Some("orders-0@2"));
    assert!(report.skipped[0].reason.contains("tombstone"));
    assert!(report.records.iter().all(|r| r.result.is_ok()));
    // Delivered again: replayed, no second call.
    let records = json!({"orders-1": [record("orders", 1, 9, Some(r#"{"id": "same"}"#))]});
    let report = handler.run(&KafkaBatch::new(), event(records)).await;
    assert!(report.records[0].result.is_ok());
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn headers_and_keys_read_as_lambda_sends_them() {
    let event: KafkaEvent = serde_json::from_value(json!({
        "eventSource": "SelfManagedKafka",
        "bootstrapServers": "kafka:9092",
        "records": {"t-0": [{
            "topic": "t", "partition": 0, "offset": 0, "timestamp": 0,
            "timestampType": "CREATE_TIME", "key": b64("k"), "value": b64("{}"),
            "headers": [{"trace": [104, 105]}, {"signed": [-1]}],
        }]},
    }))
    .unwrap();
    let record = &event.records[0];
    assert_eq!(record.partition_key, "t-0");
    assert_eq!(record.key_bytes().unwrap().as_deref(), Some(&b"k"[..]));
    assert_eq!(record.header("trace").as_deref(), Some(&b"hi"[..]));
    assert_eq!(record.header("signed"), Some(vec![255]));
    assert_eq!(record.header("missing"), None);
    // Serialized back: the map, keyed by partition.
    let back = serde_json::to_value(&event).unwrap();
    assert_eq!(back["records"]["t-0"][0]["offset"], 0);
    // No records at all, or `null`: an empty batch.
    let empty: KafkaEvent = serde_json::from_value(json!({"records": null})).unwrap();
    assert!(empty.records.is_empty());
}

#[test]
fn an_item_id_that_names_no_offset_fails_the_whole_batch() {
    use lambda_idempotency::BatchResponse;
    // Offset -1 is in no event: Lambda reads the response as failed and retries the
    // whole batch, which loses nothing.
    let mut response = KafkaBatchResponse::default();
    BatchResponse::add_failure(&mut response, "no offset here".to_owned());
    BatchResponse::add_failure(&mut response, "orders-3@12".to_owned());
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({"batchItemFailures": [
            {"itemIdentifier": {"partition": "no offset here", "offset": -1}},
            {"itemIdentifier": {"partition": "orders-3", "offset": 12}},
        ]})
    );
}

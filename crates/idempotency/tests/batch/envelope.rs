//! A batch's envelope: the request taken out of each body before it is parsed, keyed and
//! hashed; a carrier's own message acknowledged without running.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::{
    Envelope, FailureKind, Idempotency, KeyStrategy, MemoryStore, Operation, SqsBatch,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};

const SNS: &str = include_str!("../../../../events/sns-to-sqs.json");
const EVENTBRIDGE: &str = include_str!("../../../../events/eventbridge-to-sqs.json");
const S3: &str = include_str!("../../../../events/s3-to-sqs.json");

fn event(fixture: &str) -> LambdaEvent<SqsEvent> {
    LambdaEvent::new(serde_json::from_str(fixture).unwrap(), Context::default())
}

fn bodies(records: &[(&str, Value)]) -> LambdaEvent<SqsEvent> {
    let records: Vec<Value> = records
        .iter()
        .map(|(id, body)| json!({"messageId": id, "body": body.to_string()}))
        .collect();
    LambdaEvent::new(
        serde_json::from_value(json!({ "Records": records })).unwrap(),
        Context::default(),
    )
}

/// Runs `batch` over `event`, keyed by `op`, counting the function's calls.
async fn run(
    batch: &SqsBatch,
    idempotency: &Idempotency,
    op: &Operation,
    event: LambdaEvent<SqsEvent>,
    calls: &AtomicU32,
) -> lambda_idempotency::BatchReport<Value> {
    batch
        .report_json(event, |request: Value, _| async move {
            let (answer, _) = idempotency
                .execute(op, &request, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, lambda_runtime::Error>(json!({"seen": request}))
                })
                .await
                .map_err(lambda_idempotency::ExecuteError::into_inner)?;
            Ok::<_, lambda_runtime::Error>(answer)
        })
        .await
}

fn kinds(report: &lambda_idempotency::BatchReport<Value>) -> Vec<Option<FailureKind>> {
    report
        .records
        .iter()
        .map(|r| r.result.as_ref().err().map(|f| f.kind))
        .collect()
}

#[tokio::test]
async fn two_sns_publishes_of_one_request_run_once_keyed_on_its_hash() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("summarise", KeyStrategy::hash(["/model", "/messages"]));
    let calls = AtomicU32::new(0);
    let batch = SqsBatch::new().envelope(Envelope::sns());
    let report = run(&batch, &idempotency, &op, event(SNS), &calls).await;
    assert_eq!(kinds(&report), vec![None, None]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "twins in one batch: one call"
    );
    // The handler saw the request only, not the notification around it.
    let seen = &report.records[0].result.as_ref().unwrap()["seen"];
    assert_eq!(seen["model"], "gpt-4o-mini");
    assert!(seen.get("MessageId").is_none());
    // Delivered again, in a later batch: the stored answer.
    let report = run(&batch, &idempotency, &op, event(SNS), &calls).await;
    assert_eq!(kinds(&report), vec![None, None]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_the_envelope_the_publishes_would_be_two_requests() {
    // What the envelope prevents: hashing the whole body sees MessageId and Timestamp.
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("summarise", KeyStrategy::hash_payload());
    let calls = AtomicU32::new(0);
    let report = run(&SqsBatch::new(), &idempotency, &op, event(SNS), &calls).await;
    assert_eq!(kinds(&report), vec![None, None]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn two_eventbridge_deliveries_run_once_keyed_on_a_field() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("thank", KeyStrategy::field("request_id"));
    let calls = AtomicU32::new(0);
    let batch = SqsBatch::new().envelope(Envelope::eventbridge());
    let report = run(&batch, &idempotency, &op, event(EVENTBRIDGE), &calls).await;
    assert_eq!(kinds(&report), vec![None, None]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_same_key_with_another_inner_request_is_refused() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id")).validate(["/amount"]);
    let calls = AtomicU32::new(0);
    let batch = SqsBatch::new().envelope(Envelope::sns());
    let publish = |id: &str, amount: u32| json!({"Type": "Notification", "MessageId": id, "Message": json!({"id": "k", "amount": amount}).to_string()});
    let first = bodies(&[("m1", publish("n1", 5))]);
    let report = run(&batch, &idempotency, &op, first, &calls).await;
    assert_eq!(kinds(&report), vec![None]);
    let second = bodies(&[("m2", publish("n2", 6))]);
    let report = run(&batch, &idempotency, &op, second, &calls).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::Rejected, "{}", failure.reason);
    assert!(
        failure.reason.contains("different payload"),
        "{}",
        failure.reason
    );
}

#[tokio::test]
async fn a_body_that_is_no_notification_is_malformed_for_good_with_a_reason() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id"));
    let calls = AtomicU32::new(0);
    let batch = SqsBatch::new().envelope(Envelope::sns());
    let event = bodies(&[
        ("plain", json!({"id": "k"})),
        ("good", json!({"Message": json!({"id": "k2"}).to_string()})),
        ("object", json!({"Message": {"id": "k3"}})),
    ]);
    let report = run(&batch, &idempotency, &op, event, &calls).await;
    assert_eq!(
        kinds(&report),
        vec![
            Some(FailureKind::MalformedBody),
            None,
            Some(FailureKind::MalformedBody)
        ]
    );
    let reason = &report.records[0].result.as_ref().unwrap_err().reason;
    assert!(
        reason.contains("sns envelope") && reason.contains("/Message"),
        "{reason}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let response = serde_json::to_value(report.into_response().unwrap()).unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": "plain"}, {"itemIdentifier": "object"}]})
    );
}

#[tokio::test]
async fn an_s3_test_event_is_skipped_not_failed_and_the_object_runs() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new(
        "ingest",
        KeyStrategy::hash(["/object/key", "/object/sequencer"]),
    );
    let calls = AtomicU32::new(0);
    let batch = SqsBatch::new()
        .envelope(Envelope::s3())
        .fail_invocation_when_all_fail(true);
    let report = run(&batch, &idempotency, &op, event(S3), &calls).await;
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].index, 0);
    assert_eq!(
        report.skipped[0].item_id.as_deref(),
        Some("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c01")
    );
    assert_eq!(kinds(&report), vec![None]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let response = serde_json::to_value(report.into_response().unwrap()).unwrap();
    assert_eq!(response, json!({"batchItemFailures": []}));
}

#[tokio::test]
async fn skipped_records_keep_their_place_so_failures_name_the_right_message() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("ingest", KeyStrategy::field("n"));
    let calls = AtomicU32::new(0);
    let test_event = json!({"Event": "s3:TestEvent"});
    let object = |n: u32| json!({"Records": [{"s3": {"n": n}}]});
    let event = bodies(&[
        ("t1", test_event.clone()),
        ("bad", json!({"Records": []})),
        ("t2", test_event),
        ("ok", object(1)),
    ]);
    let batch = SqsBatch::new().envelope(Envelope::s3());
    let report = run(&batch, &idempotency, &op, event, &calls).await;
    let skipped: Vec<usize> = report.skipped.iter().map(|s| s.index).collect();
    assert_eq!(skipped, vec![0, 2]);
    let ids: Vec<_> = report
        .records
        .iter()
        .map(|r| r.item_id.clone().unwrap())
        .collect();
    assert_eq!(ids, vec!["bad", "ok"]);
    assert_eq!(kinds(&report), vec![Some(FailureKind::MalformedBody), None]);
    let response = serde_json::to_value(report.into_response().unwrap()).unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": "bad"}]})
    );
}

#[tokio::test]
async fn a_kinesis_batch_opens_each_records_data_through_its_envelope() {
    use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id"));
    let calls = AtomicU32::new(0);
    let mut event = KinesisEvent::default();
    let data = |n: &str, id: &str| json!({"detail": {"id": id}, "id": n}).to_string();
    event.records = [
        ("1", data("e1", "k")),
        ("2", data("e2", "k")),
        ("3", "{}".to_owned()),
    ]
    .into_iter()
    .map(|(seq, data)| {
        let mut record = KinesisEventRecord::default();
        record.kinesis.sequence_number = seq.to_owned();
        record.kinesis.data.0 = data.into_bytes();
        record
    })
    .collect();
    let report = lambda_idempotency::KinesisBatch::new()
        .envelope(Envelope::eventbridge())
        .report_json(
            LambdaEvent::new(event, Context::default()),
            |request: Value, _| {
                let (idempotency, op, calls) = (&idempotency, &op, &calls);
                async move {
                    idempotency
                        .run(op, &request, || async {
                            calls.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, lambda_runtime::Error>(())
                        })
                        .await
                }
            },
        )
        .await;
    let kinds: Vec<_> = report
        .records
        .iter()
        .map(|r| r.result.as_ref().err().map(|f| f.kind))
        .collect();
    assert_eq!(kinds, vec![None, None, Some(FailureKind::MalformedBody)]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "keyed on the detail's id, not the event's"
    );
}

#[tokio::test]
async fn a_dynamodb_stream_keeps_every_place_when_an_envelope_and_removals_both_skip() {
    use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
    let change = |seq: &str, name: &str, payload: &str| {
        let image = json!({"payload": {"S": payload}});
        let (new, old) = if name == "REMOVE" {
            (Value::Null, image)
        } else {
            (image, Value::Null)
        };
        json!({
            "eventID": seq, "eventName": name, "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "eventVersion": "1.1",
            "dynamodb": {"SequenceNumber": seq, "SizeBytes": 100, "Keys": {"id": {"S": seq}},
                         "NewImage": new, "OldImage": old, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        })
    };
    let records = vec![
        change("1", "REMOVE", "{}"),
        change("2", "INSERT", r#"{"kind": "probe"}"#),
        change("3", "INSERT", "not json"),
        change("4", "INSERT", r#"{"kind": "job", "id": "k"}"#),
    ];
    let event: DynamoDbEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let envelope = Envelope::new()
        .pointer("/payload")
        .json_string()
        .skip_when("/kind", "probe", "a probe");
    let report = lambda_idempotency::DynamoDbStreamBatch::new()
        .envelope(envelope)
        .report_json(
            LambdaEvent::new(event, Context::default()),
            |request: Value, _| async move {
                assert_eq!(request["id"], "k");
                Ok::<_, lambda_runtime::Error>(())
            },
        )
        .await;
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|s| (s.index, s.item_id.clone().unwrap()))
        .collect();
    assert_eq!(skipped, vec![(0, "1".to_owned()), (1, "2".to_owned())]);
    let ran: Vec<_> = report
        .records
        .iter()
        .map(|r| r.item_id.clone().unwrap())
        .collect();
    assert_eq!(ran, vec!["3", "4"]);
    let response = serde_json::to_value(&*report.into_response().unwrap()).unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": "3"}]})
    );
}

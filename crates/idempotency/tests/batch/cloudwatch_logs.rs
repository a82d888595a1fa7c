//! CloudWatch Logs subscriptions: every log event run as a record, and the invocation
//! failed (never acknowledged) while one has not run.

use base64::Engine;
use lambda_idempotency::{
    BatchError, CloudWatchLogsBatch, CloudWatchLogsEvent, FailureKind, Idempotency, KeyStrategy,
    MemoryStore, Operation,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Mutex;

const SAMPLE: &str = include_str!("../../../../events/cloudwatch-logs.json");

fn encode(document: &Value) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(document.to_string().as_bytes()).unwrap();
    base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
}

fn event(data: String) -> LambdaEvent<CloudWatchLogsEvent> {
    let event = json!({"awslogs": {"data": data}});
    LambdaEvent::new(serde_json::from_value(event).unwrap(), Context::default())
}

fn logs(events: &[(&str, &str)]) -> LambdaEvent<CloudWatchLogsEvent> {
    let events: Vec<Value> = events
        .iter()
        .map(|(id, message)| json!({"id": id, "timestamp": 1_764_925_200_000i64, "message": message}))
        .collect();
    event(encode(&json!({
        "messageType": "DATA_MESSAGE", "owner": "123456789012", "logGroup": "/aws/lambda/app",
        "logStream": "2026/12/05/[$LATEST]abc", "subscriptionFilters": ["alerts"], "logEvents": events,
    })))
}

/// Runs `batch` keyed on each log event's id; `"fail"` in a message fails its call.
async fn run(
    idempotency: &Idempotency,
    ran: &Mutex<Vec<String>>,
    event: LambdaEvent<CloudWatchLogsEvent>,
) -> Result<(), BatchError> {
    let op = Operation::new("alert", KeyStrategy::field("id"));
    CloudWatchLogsBatch::new()
        .run_json(event, |alert: Value, log| {
            let op = &op;
            async move {
                let keyed = json!({"id": log.id, "alert": alert});
                idempotency
                    .run(op, &keyed, || async {
                        ran.lock().unwrap().push(log.id.clone());
                        if alert["fail"] == true {
                            return Err(lambda_runtime::Error::from("the pager is down"));
                        }
                        Ok(())
                    })
                    .await
            }
        })
        .await
}

#[tokio::test]
async fn every_log_event_runs_once_and_a_retried_invocation_runs_none_again() {
    let (idempotency, ran) = (Idempotency::new(MemoryStore::new()), Mutex::default());
    let sample: LambdaEvent<CloudWatchLogsEvent> =
        LambdaEvent::new(serde_json::from_str(SAMPLE).unwrap(), Context::default());
    run(&idempotency, &ran, sample.clone()).await.unwrap();
    let mut first = ran.lock().unwrap().clone();
    first.sort();
    assert_eq!(first.len(), 3, "{first:?}");
    run(&idempotency, &ran, sample).await.unwrap();
    assert_eq!(ran.lock().unwrap().len(), 3, "a retried invocation replays");
}

#[tokio::test]
async fn a_failed_event_fails_the_invocation_and_only_it_runs_on_the_retry() {
    let (idempotency, ran) = (Idempotency::new(MemoryStore::new()), Mutex::default());
    let batch = [
        ("1", r#"{"n": 1}"#),
        ("2", r#"{"fail": true}"#),
        ("3", r#"{"n": 3}"#),
    ];
    let err = run(&idempotency, &ran, logs(&batch)).await.unwrap_err();
    match &err {
        BatchError::SomeFailed {
            failed,
            count,
            first_reason,
        } => {
            assert_eq!((*failed, *count), (1, 3));
            assert!(first_reason.contains("pager"), "{first_reason}");
        }
        other => panic!("expected SomeFailed, got {other:?}"),
    }
    ran.lock().unwrap().clear();
    let _ = run(&idempotency, &ran, logs(&batch)).await;
    assert_eq!(*ran.lock().unwrap(), vec!["2".to_owned()]);
}

#[tokio::test]
async fn a_message_that_is_not_json_is_never_acknowledged() {
    let (idempotency, ran) = (Idempotency::new(MemoryStore::new()), Mutex::default());
    let err = run(
        &idempotency,
        &ran,
        logs(&[("1", "plain text"), ("2", "{}")]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, BatchError::SomeFailed { failed: 1, .. }),
        "{err:?}"
    );
    let report = CloudWatchLogsBatch::new()
        .report_json(logs(&[("1", "plain text")]), |_: Value, _| async {
            Ok::<_, lambda_runtime::Error>(())
        })
        .await
        .unwrap();
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::MalformedBody);
}

#[tokio::test]
async fn a_control_message_runs_nothing_and_succeeds() {
    let (idempotency, ran) = (Idempotency::new(MemoryStore::new()), Mutex::default());
    let control = encode(&json!({
        "messageType": "CONTROL_MESSAGE", "owner": "CloudwatchLogs", "logGroup": "",
        "logStream": "", "subscriptionFilters": [],
        "logEvents": [{"id": "", "timestamp": 0, "message": "CWL CONTROL MESSAGE: Checking health of destination Kinesis stream."}],
    }));
    run(&idempotency, &ran, event(control)).await.unwrap();
    assert!(ran.lock().unwrap().is_empty());
}

#[tokio::test]
async fn data_that_does_not_decode_fails_the_invocation_with_its_reason() {
    let (idempotency, ran) = (Idempotency::new(MemoryStore::new()), Mutex::default());
    let not_gzip = base64::engine::general_purpose::STANDARD.encode("plain");
    let cases = [
        ("***".to_owned(), "not base64"),
        (not_gzip, "not gzip"),
        (
            encode(&json!({"logEvents": "no list"})),
            "not CloudWatch Logs data",
        ),
        (
            encode(&json!({"logEvents": [{"id": "", "message": "{}"}]})),
            "has no id",
        ),
    ];
    for (data, expected) in cases {
        let err = run(&idempotency, &ran, event(data)).await.unwrap_err();
        assert!(
            matches!(&err, BatchError::Malformed { reason } if reason.contains(expected)),
            "{err:?} (expected {expected:?})"
        );
    }
    assert!(ran.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_batch_envelope_skips_its_own_messages_and_opens_the_rest() {
    let envelope = lambda_idempotency::Envelope::new()
        .skip_when("/type", "heartbeat", "a heartbeat, not an alert")
        .pointer("/alert");
    let report = CloudWatchLogsBatch::new()
        .envelope(envelope)
        .report_json(
            logs(&[
                ("1", r#"{"type": "heartbeat"}"#),
                ("2", r#"{"alert": {"n": 2}}"#),
            ]),
            |alert: Value, _| async move {
                assert_eq!(alert, json!({"n": 2}));
                Ok::<_, lambda_runtime::Error>(())
            },
        )
        .await
        .unwrap();
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].item_id.as_deref(), Some("1"));
    assert_eq!(report.records.len(), 1);
    report.into_result().unwrap();
}

#[tokio::test]
async fn run_fails_the_invocation_while_an_event_failed_and_counts_the_skipped_ones() {
    // `run` hands each log event over as it came.
    let failing = CloudWatchLogsBatch::new()
        .run(logs(&[("1", "a"), ("2", "b")]), |log| async move {
            match log.id.as_str() {
                "2" => Err(lambda_runtime::Error::from("down")),
                _ => Ok(()),
            }
        })
        .await;
    assert!(
        matches!(
            failing,
            Err(BatchError::SomeFailed {
                failed: 1,
                count: 2,
                ..
            })
        ),
        "{failing:?}"
    );
    // Skipped events count in the batch's size, beside the ones that ran.
    let envelope = lambda_idempotency::Envelope::new().skip_when("/type", "heartbeat", "hb");
    let err = CloudWatchLogsBatch::new()
        .envelope(envelope)
        .run_json(
            logs(&[("1", r#"{"type": "heartbeat"}"#), ("2", r#"{"type": "x"}"#)]),
            |_: Value, _| async { Err::<(), _>(lambda_runtime::Error::from("down")) },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BatchError::SomeFailed {
                failed: 1,
                count: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

//! SQS batches from fixture events, as Lambda delivers them.

use super::{Handler, Job};

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::{
    BatchError, BatchReport, ExecuteError, FailureKind, Idempotency, KeyStrategy, MemoryStore,
    Operation, Outcome, SqsBatch,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn event(fixture: &str) -> LambdaEvent<SqsEvent> {
    let payload: SqsEvent = serde_json::from_str(fixture).expect("fixture is an SQS event");
    LambdaEvent::new(payload, Context::default())
}

impl Handler {
    /// Runs `batch` over a fixture with this handler, reporting each record.
    async fn report(&self, batch: &SqsBatch, fixture: &str) -> BatchReport<Outcome> {
        batch
            .report_json(event(fixture), |job: Job, _| self.handle(job))
            .await
    }
}

/// An invocation of records given as (messageId, body).
fn records(records: &[(&str, &str)]) -> LambdaEvent<SqsEvent> {
    let records: Vec<Value> = records
        .iter()
        .map(|(id, body)| json!({"messageId": id, "body": body}))
        .collect();
    let payload = serde_json::from_value(json!({ "Records": records })).unwrap();
    LambdaEvent::new(payload, Context::default())
}

fn failures(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Value {
    serde_json::to_value(response).unwrap()
}

#[tokio::test]
async fn mixed_success_and_failure_report_only_the_failures() {
    let handler = Handler::new();
    let response = handler
        .report(&SqsBatch::new(), include_str!("../fixtures/sqs-mixed.json"))
        .await
        .into_response()
        .unwrap();
    assert_eq!(
        failures(&response),
        json!({"batchItemFailures": [
            {"itemIdentifier": "2e1424d4-f796-459a-8184-9c92662be6da"},
            {"itemIdentifier": "8c3c1c06-0c5c-4f1e-9c2a-3d4b1f0e6a11"},
        ]})
    );
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        3,
        "the malformed body ran nothing"
    );
}

#[tokio::test]
async fn malformed_body_is_reported_with_a_clear_reason() {
    let handler = Handler::new();
    let report = handler
        .report(&SqsBatch::new(), include_str!("../fixtures/sqs-mixed.json"))
        .await;
    let failure = report.records[2].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::MalformedBody);
    assert!(
        failure
            .reason
            .contains("8c3c1c06-0c5c-4f1e-9c2a-3d4b1f0e6a11")
            && failure.reason.contains("invalid body"),
        "{}",
        failure.reason
    );
    assert_eq!(
        report.records[1].result.as_ref().unwrap_err().kind,
        FailureKind::Error
    );
}

/// Two copies of one request in a batch (`sqs-duplicate-in-batch.json`: two messageIds,
/// one `id`, a slow job), through a handler over `store`.
async fn twins(handler: &Handler, fixture: &str) -> BatchReport<Outcome> {
    handler.report(&SqsBatch::new(), fixture).await
}

fn kinds(report: &BatchReport<Outcome>) -> Vec<Result<Outcome, FailureKind>> {
    report
        .records
        .iter()
        .map(|r| r.result.as_ref().map_err(|f| f.kind).copied())
        .collect()
}

#[tokio::test]
async fn a_twin_in_the_same_batch_waits_for_its_sibling_and_answers_with_its_result() {
    let store = FaultyStore::new(MemoryStore::new());
    let handler = Handler::over(store.clone());
    let report = twins(
        &handler,
        include_str!("../fixtures/sqs-duplicate-in-batch.json"),
    )
    .await;
    assert_eq!(
        kinds(&report),
        vec![Ok(Outcome::Executed), Ok(Outcome::Joined)]
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "one call");
    assert_eq!(
        (store.requests(StoreOp::Claim), store.total_requests()),
        (1, 2),
        "one claim and one completion: the twin asked the store nothing"
    );
    let response = report.into_response().unwrap();
    assert_eq!(
        failures(&response),
        json!({"batchItemFailures": []}),
        "both acked"
    );
}

#[tokio::test]
async fn a_twin_fails_with_its_sibling_and_both_come_again() {
    let handler = Handler::new();
    let fixture =
        include_str!("../fixtures/sqs-duplicate-in-batch.json").replace("slow", "slow-fail");
    let report = twins(&handler, &fixture).await;
    assert_eq!(
        kinds(&report),
        vec![Err(FailureKind::Error), Err(FailureKind::Error)]
    );
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        1,
        "the twin did not run it again"
    );
    let reason = &report.records[1].result.as_ref().unwrap_err().reason;
    assert!(
        reason.contains("twin") && reason.contains("job same failed"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_twin_of_a_call_that_panics_fails_with_it_and_the_function_runs_once() {
    // The first copy may have paid for its call before it panicked: its twin must not run
    // the function again in this invocation.
    let handler = Handler::new();
    let fixture =
        include_str!("../fixtures/sqs-duplicate-in-batch.json").replace("slow", "slow-panic");
    let report = twins(&handler, &fixture).await;
    assert_eq!(
        kinds(&report),
        vec![Err(FailureKind::Panicked), Err(FailureKind::Panicked)]
    );
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        1,
        "the function ran once"
    );
    let reason = &report.records[1].result.as_ref().unwrap_err().reason;
    assert!(
        reason.contains("twin") && reason.contains("panicked"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_twin_of_a_permanent_failure_is_permanent() {
    let handler = Handler::new();
    let fixture =
        include_str!("../fixtures/sqs-duplicate-in-batch.json").replace("slow", "slow-refuse");
    let report = twins(&handler, &fixture).await;
    assert_eq!(
        kinds(&report),
        vec![Err(FailureKind::Permanent), Err(FailureKind::Permanent)]
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_twin_arriving_while_its_siblings_record_is_still_answering_waits_for_its_class() {
    // The first copy's call fails at once, but its handler answers 150 ms later; the
    // copy that arrives in between gets the class the batch gives that record.
    let handler = Handler::new();
    let event = records(&[
        ("m1", r#"{"id": "same", "action": "refuse-then-linger"}"#),
        ("m2", r#"{"id": "same", "action": "late"}"#),
    ]);
    let report = SqsBatch::new()
        .report_json(event, |job: Job, _| handler.handle(job))
        .await;
    assert_eq!(
        kinds(&report),
        vec![Err(FailureKind::Permanent), Err(FailureKind::Permanent)]
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_twin_later_in_its_fifo_group_keeps_its_siblings_failure_and_does_not_run_again() {
    // In order, the twin starts after its sibling ended: it still answers with that end.
    for (action, kind) in [
        ("refuse", FailureKind::Permanent),
        ("panic", FailureKind::Panicked),
    ] {
        let handler = Handler::new();
        let record = |id: &str, body: String| {
            json!({"messageId": id, "body": body, "eventSourceARN": "arn:aws:sqs:us-east-1:1:q.fifo",
                   "attributes": {"MessageGroupId": "g"}})
        };
        let body = format!(r#"{{"id": "same", "action": "{action}"}}"#);
        let payload = serde_json::from_value(json!({"Records": [
            record("a-1", body.clone()),
            record("a-2", body),
        ]}))
        .unwrap();
        let report = SqsBatch::new()
            .report_json(
                LambdaEvent::new(payload, Context::default()),
                |job: Job, _| handler.handle(job),
            )
            .await;
        let expected = if kind.is_permanent() {
            vec![Err(kind), Err(kind)]
        } else {
            vec![Err(kind), Err(FailureKind::SkippedAfterGroupFailure)]
        };
        assert_eq!(kinds(&report), expected, "{action}");
        assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "{action}: one run");
    }
}

/// A handler that calls the idempotent function for each key of `keys` in turn (or all at
/// once), each call failing after 50 ms, and goes on past each failure.
async fn failing_calls(
    idempotency: &Idempotency,
    keys: Vec<String>,
    at_once: bool,
) -> Result<(), String> {
    let op = Operation::new("job", KeyStrategy::field("id"));
    let call = |key: String| {
        let op = op.clone();
        async move {
            let payload = json!({ "id": key });
            idempotency
                .execute(&op, &payload, || async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err::<(), _>("the provider failed".to_owned())
                })
                .await
                .map(|_| ())
        }
    };
    if at_once {
        futures_util::future::join_all(keys.into_iter().map(call)).await;
    } else {
        for key in keys {
            let _ = call(key).await;
        }
    }
    Err("every call failed".into())
}

#[tokio::test]
async fn twins_whose_failures_a_handler_goes_past_never_wait_for_each_other() {
    // One record calling one key twice at once; two records each calling the other's key
    // after its own failed: none waits for a record that waits for it.
    let idempotency = Idempotency::new(MemoryStore::new());
    let same_record = records(&[("m1", r#"{"keys": ["k", "k"], "at_once": true}"#)]);
    let crossed = records(&[
        ("a", r#"{"keys": ["k1", "k2"], "at_once": false}"#),
        ("b", r#"{"keys": ["k2", "k1"], "at_once": false}"#),
    ]);
    let sqs = SqsBatch::new();
    for event in [same_record, crossed] {
        let batch = sqs.report_json(event, |job: Value, _| {
            let keys = serde_json::from_value(job["keys"].clone()).unwrap();
            failing_calls(&idempotency, keys, job["at_once"] == true)
        });
        let report = tokio::time::timeout(Duration::from_secs(5), batch)
            .await
            .expect("no twin waits for its own record");
        assert!(report.records.iter().all(|r| r.result.is_err()));
    }
}

#[tokio::test]
async fn twins_whose_key_is_in_progress_in_another_worker_are_both_handed_back() {
    // Two workers (two handles over one store) get the same batch at once: the first
    // worker's records run and join; the second's find the key in progress, both.
    let store = MemoryStore::new();
    let (first, second) = (Handler::over(store.clone()), Handler::over(store));
    let fixture = include_str!("../fixtures/sqs-duplicate-in-batch.json");
    let (a, b) = tokio::join!(twins(&first, fixture), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        twins(&second, fixture).await
    });
    assert_eq!(kinds(&a), vec![Ok(Outcome::Executed), Ok(Outcome::Joined)]);
    assert_eq!(
        kinds(&b),
        vec![Err(FailureKind::InProgress), Err(FailureKind::InProgress)]
    );
    assert_eq!(
        first.calls.load(Ordering::SeqCst) + second.calls.load(Ordering::SeqCst),
        1
    );
    assert_eq!(
        failures(&b.into_response().unwrap()),
        json!({"batchItemFailures": [
            {"itemIdentifier": "11111111-1111-4111-8111-111111111111"},
            {"itemIdentifier": "22222222-2222-4222-8222-222222222222"},
        ]})
    );
}

#[tokio::test]
async fn a_twin_with_another_payload_is_a_mismatch_not_its_siblings_result() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id")).validate(["prompt"]);
    let event = records(&[
        ("m1", r#"{"id": "same", "prompt": "hi"}"#),
        ("m2", r#"{"id": "same", "prompt": "bye"}"#),
    ]);
    let report = SqsBatch::new()
        .report_json(event, |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                idempotency
                    .run(op, &body, || async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, lambda_runtime::Error>(body["prompt"].clone())
                    })
                    .await
            }
        })
        .await;
    assert_eq!(report.records[0].result.as_ref().unwrap(), "hi");
    let failure = report.records[1].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::Rejected, "{}", failure.reason);
    assert!(
        failure.reason.contains("different payload"),
        "{}",
        failure.reason
    );
}

#[tokio::test]
async fn permanent_failures_are_rejected_and_the_reason_is_the_whole_chain() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id"));
    let event = records(&[("m1", r#"{"no_id": 1}"#), ("m2", "not json")]);
    let report = SqsBatch::new()
        .report_json(event, |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                // A handler error type that wraps the library's error: its kind is found.
                idempotency
                    .run(op, &body, || async { Ok::<_, Wrapped>(1) })
                    .await
            }
        })
        .await;
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::Rejected);
    assert!(failure.kind.is_permanent());
    assert_eq!(
        failure.reason,
        "the handler's wrapper: the payload has no idempotency key at id; refusing to process it without one"
    );
    let inner = failure.error.as_deref().unwrap();
    assert!(
        std::error::Error::source(inner)
            .unwrap()
            .downcast_ref::<lambda_idempotency::Error>()
            .is_some_and(|e| matches!(e, lambda_idempotency::Error::KeyMissing { .. }))
    );
    let malformed = report.records[1].result.as_ref().unwrap_err();
    assert_eq!(malformed.kind, FailureKind::MalformedBody);
    assert!(malformed.kind.is_permanent());
    for kind in [
        FailureKind::InProgress,
        FailureKind::Error,
        FailureKind::Panicked,
        FailureKind::SkippedAfterGroupFailure,
        FailureKind::Unfinished,
    ] {
        assert!(!kind.is_permanent(), "{kind:?}");
    }
}

/// A handler's own error type wrapping the library's.
#[derive(Debug)]
struct Wrapped(lambda_idempotency::Error);

impl From<lambda_idempotency::Error> for Wrapped {
    fn from(e: lambda_idempotency::Error) -> Self {
        Wrapped(e)
    }
}

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the handler's wrapper")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test]
async fn a_panic_fails_only_its_record() {
    let handler = Handler::new();
    let report = handler
        .report(&SqsBatch::new(), include_str!("../fixtures/sqs-panic.json"))
        .await;
    assert!(report.records[0].result.is_ok() && report.records[2].result.is_ok());
    let failure = report.records[1].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::Panicked);
    assert!(
        failure.reason.contains("job p2 panicked"),
        "{}",
        failure.reason
    );
}

#[tokio::test]
async fn when_every_record_fails_the_default_reports_each() {
    let handler = Handler::new();
    let run = |batch: SqsBatch| {
        let handler = &handler;
        async move {
            batch
                .run_json(
                    event(include_str!("../fixtures/sqs-all-fail.json")),
                    |job: Job, _| handler.handle(job),
                )
                .await
        }
    };
    let response = run(SqsBatch::new()).await.unwrap();
    assert_eq!(
        failures(&response),
        json!({"batchItemFailures": [
            {"itemIdentifier": "66666666-6666-4666-8666-666666666666"},
            {"itemIdentifier": "77777777-7777-4777-8777-777777777777"},
        ]})
    );
    let err = run(SqsBatch::new().fail_invocation_when_all_fail(true))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BatchError::AllFailed { count: 2, .. }),
        "{err}"
    );
    // The same setting holds when the response is built from a report.
    let failing = SqsBatch::new().fail_invocation_when_all_fail(true);
    let err = handler
        .report(&failing, include_str!("../fixtures/sqs-all-fail.json"))
        .await
        .into_response()
        .unwrap_err();
    assert!(
        matches!(err, BatchError::AllFailed { count: 2, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn fifo_failure_fails_the_rest_of_its_group_only() {
    let handler = Handler::new();
    let report = handler
        .report(
            &SqsBatch::new(),
            include_str!("../fixtures/sqs-fifo-two-groups.json"),
        )
        .await;
    let kinds: Vec<_> = report
        .records
        .iter()
        .map(|r| {
            (
                r.item_id.clone().unwrap(),
                r.result.as_ref().err().map(|f| f.kind),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("a-1".into(), None),
            ("b-1".into(), None),
            ("a-2".into(), Some(FailureKind::Error)),
            ("b-2".into(), None),
            ("a-3".into(), Some(FailureKind::SkippedAfterGroupFailure)),
        ]
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 4, "a-3 did not run");
    assert_eq!(
        failures(&report.into_response().unwrap()),
        json!({"batchItemFailures": [{"itemIdentifier": "a-2"}, {"itemIdentifier": "a-3"}]})
    );
}

/// A FIFO batch of one group: a-1, then `poison` as a-2, then a-3.
fn fifo_group_with(poison: &str) -> LambdaEvent<SqsEvent> {
    let record = |id: &str, body: &str| {
        json!({"messageId": id, "body": body, "eventSourceARN": "arn:aws:sqs:us-east-1:1:q.fifo",
               "attributes": {"MessageGroupId": "g"}})
    };
    let payload = serde_json::from_value(json!({"Records": [
        record("a-1", r#"{"id": "a1", "action": "ok"}"#),
        record("a-2", poison),
        record("a-3", r#"{"id": "a3", "action": "ok"}"#),
    ]}))
    .unwrap();
    LambdaEvent::new(payload, Context::default())
}

#[tokio::test]
async fn a_permanent_failure_does_not_hold_back_the_rest_of_its_fifo_group() {
    for (poison, kind) in [
        ("not json", FailureKind::MalformedBody),
        (
            r#"{"id": "a2", "action": "refuse"}"#,
            FailureKind::Permanent,
        ),
    ] {
        let handler = Handler::new();
        let report = SqsBatch::new()
            .report_json(fifo_group_with(poison), |job: Job, _| handler.handle(job))
            .await;
        assert_eq!(
            kinds(&report),
            [Ok(Outcome::Executed), Err(kind), Ok(Outcome::Executed)],
            "{poison}"
        );
        assert_eq!(
            failures(&report.into_response().unwrap()),
            json!({"batchItemFailures": [{"itemIdentifier": "a-2"}]})
        );

        // Asked to, the group stops there too.
        let handler = Handler::new();
        let report = SqsBatch::new()
            .stop_at_permanent_failures(true)
            .report_json(fifo_group_with(poison), |job: Job, _| handler.handle(job))
            .await;
        assert_eq!(
            kinds(&report),
            [
                Ok(Outcome::Executed),
                Err(kind),
                Err(FailureKind::SkippedAfterGroupFailure)
            ],
            "{poison}"
        );
    }
}

#[tokio::test]
async fn concurrency_is_bounded() {
    let records: Vec<Value> = (0..12)
        .map(|i| json!({"messageId": format!("m{i}"), "body": "{}"}))
        .collect();
    let payload: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let in_flight = AtomicUsize::new(0);
    let peak = AtomicUsize::new(0);
    let response = SqsBatch::new()
        .max_concurrency(3)
        .run(
            LambdaEvent::new(payload, Context::default()),
            |_msg| async {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, lambda_runtime::Error>(())
            },
        )
        .await
        .unwrap();
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(peak.load(Ordering::SeqCst), 3, "ran three at a time");
}

#[tokio::test]
async fn a_failure_without_a_message_id_fails_the_whole_batch() {
    // No messageId, or an empty one: Lambda would read an empty itemIdentifier as the
    // whole batch failing, so the invocation fails instead.
    for record in [json!({"body": "x"}), json!({"messageId": "", "body": "x"})] {
        let payload: SqsEvent = serde_json::from_value(json!({ "Records": [record] })).unwrap();
        let err = SqsBatch::new()
            .run(
                LambdaEvent::new(payload, Context::default()),
                |_msg| async { Err::<(), _>("boom") },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, BatchError::MissingItemId { index: 0 }),
            "{err}"
        );
    }
}

#[tokio::test]
async fn every_records_lease_ends_with_the_invocation() {
    let store = MemoryStore::new();
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("job", KeyStrategy::field("id"));
    let mut context = Context::default();
    context.deadline =
        lambda_idempotency::store::epoch_millis(std::time::SystemTime::now()) + 30_000;
    let payload: SqsEvent =
        serde_json::from_str(include_str!("../fixtures/sqs-mixed.json")).unwrap();
    // Leases seen while each function ran, checked outside the batch: an assertion inside
    // a handler would only turn into a caught panic.
    let leases = std::sync::Mutex::new(Vec::new());
    let _ = SqsBatch::new()
        .run_json(
            LambdaEvent::new(payload, context.clone()),
            |body: Value, _| {
                let (idempotency, op, store, leases) = (&idempotency, &op, &store, &leases);
                async move {
                    idempotency
                        .run(op, &body, || async {
                            let id = format!("fn.job#{}", body["id"].as_str().unwrap());
                            let lease = store.record(&id).and_then(|r| r.in_progress_expiration);
                            leases
                                .lock()
                                .unwrap()
                                .push(lease.map(lambda_idempotency::store::epoch_millis));
                            Ok::<_, lambda_runtime::Error>(())
                        })
                        .await
                }
            },
        )
        .await
        .unwrap();
    let leases = leases.into_inner().unwrap();
    assert_eq!(leases.len(), 3, "three records ran: {leases:?}");
    assert!(
        leases.iter().all(|l| *l == Some(context.deadline)),
        "every lease is the deadline {}: {leases:?}",
        context.deadline
    );
    assert_eq!(store.len(), 3);
}

#[tokio::test]
async fn a_stuck_record_is_reported_unfinished_before_the_deadline_and_the_rest_answer() {
    let store = MemoryStore::new();
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("job", KeyStrategy::field("id"));
    let mut context = Context::default();
    let start = std::time::SystemTime::now();
    context.deadline = lambda_idempotency::store::epoch_millis(start) + 1_500;
    let payload: SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "stuck", "body": "{\"id\": \"a\", \"action\": \"hang\"}"},
        {"messageId": "quick", "body": "{\"id\": \"b\", \"action\": \"ok\"}"},
    ]}))
    .unwrap();
    let report = SqsBatch::new()
        .deadline_margin(Duration::from_millis(500))
        .report_json(LambdaEvent::new(payload, context), |job: Job, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                let body = json!({"id": job.id});
                idempotency
                    .run(op, &body, || async {
                        if job.action == "hang" {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, lambda_runtime::Error>(job.action.clone())
                    })
                    .await
            }
        })
        .await;
    let elapsed = start.elapsed().unwrap();
    assert!(
        elapsed < Duration::from_millis(1_500),
        "answered before the deadline, after {elapsed:?}"
    );
    let kinds: Vec<_> = report
        .records
        .iter()
        .map(|r| {
            (
                r.item_id.clone().unwrap(),
                r.result.as_ref().map_err(|f| f.kind).cloned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("stuck".to_string(), Err(FailureKind::Unfinished)),
            ("quick".to_string(), Ok("ok".to_string())),
        ]
    );
    // The stuck record's claim stays, as after a crash, until its lease (the deadline) ends.
    let stuck = store.record("fn.job#a").expect("the stuck claim stays");
    assert_eq!(stuck.status, lambda_idempotency::store::Status::InProgress);
    let response = report.into_response().unwrap();
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({"batchItemFailures": [{"itemIdentifier": "stuck"}]})
    );
}

/// FIFO: a record that finished before its group-mate got stuck keeps its own answer when
/// the deadline cuts the batch; only the stuck one is reported unfinished.
#[tokio::test]
async fn a_stuck_fifo_record_never_turns_its_finished_group_mates_into_failures() {
    let idempotency = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let op = Operation::new("job", KeyStrategy::field("id"));
    let mut context = Context::default();
    let start = std::time::SystemTime::now();
    context.deadline = lambda_idempotency::store::epoch_millis(start) + 1_500;
    let arn = "arn:aws:sqs:us-east-1:123456789012:requests.fifo";
    let payload: SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "done", "body": "{\"id\": \"a\", \"hang\": false}",
         "eventSourceARN": arn, "attributes": {"MessageGroupId": "g"}},
        {"messageId": "stuck", "body": "{\"id\": \"b\", \"hang\": true}",
         "eventSourceARN": arn, "attributes": {"MessageGroupId": "g"}},
    ]}))
    .unwrap();
    let report = SqsBatch::new()
        .report_json(LambdaEvent::new(payload, context), |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                idempotency
                    .run(op, &body, || async {
                        if body["hang"] == json!(true) {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, lambda_runtime::Error>(())
                    })
                    .await
            }
        })
        .await;
    let kinds: Vec<_> = report
        .records
        .iter()
        .map(|r| r.result.as_ref().map(|_| ()).map_err(|f| f.kind))
        .collect();
    assert_eq!(kinds, vec![Ok(()), Err(FailureKind::Unfinished)]);
}

#[tokio::test]
async fn the_report_names_its_failures_and_their_reasons() {
    let handler = Handler::new();
    let report = handler
        .report(&SqsBatch::new(), include_str!("../fixtures/sqs-mixed.json"))
        .await;
    let failed: Vec<String> = report
        .failures()
        .map(|r| r.result.as_ref().unwrap_err().to_string())
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed
            .iter()
            .any(|f| f.starts_with("MalformedBody: record ")),
        "{failed:?}"
    );
    let all_failed = lambda_idempotency::BatchError::AllFailed {
        count: 2,
        first_reason: "boom".into(),
    };
    assert_eq!(
        all_failed.to_string(),
        "all 2 records of the batch failed (first: boom); failing the invocation so Lambda backs off"
    );
}

#[tokio::test]
async fn an_empty_batch_never_fails_the_invocation() {
    let empty: SqsEvent = serde_json::from_value(json!({"Records": []})).unwrap();
    let report = SqsBatch::new()
        .report(LambdaEvent::new(empty, Context::default()), |_| async {
            Ok::<_, lambda_runtime::Error>(())
        })
        .await;
    let response = report.into_response_failing_when_all_fail().unwrap();
    assert_eq!(failures(&response), json!({"batchItemFailures": []}));

    // Every record of a batch failed: an error, whatever the batch's own setting.
    let report = SqsBatch::new()
        .report(records(&[("m1", "x"), ("m2", "y")]), |_| async {
            Err::<(), _>("boom")
        })
        .await;
    let err = report.into_response_failing_when_all_fail().unwrap_err();
    assert!(
        matches!(err, BatchError::AllFailed { count: 2, .. }),
        "{err}"
    );
}

/// A wider margin answers earlier: the batch waits until the deadline less the margin.
#[tokio::test]
async fn the_deadline_margin_is_the_one_configured() {
    let mut context = Context::default();
    let start = std::time::SystemTime::now();
    context.deadline = lambda_idempotency::store::epoch_millis(start) + 2_000;
    let payload: SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "stuck", "body": "{}"},
    ]}))
    .unwrap();
    let report = SqsBatch::new()
        .deadline_margin(Duration::from_millis(1_500))
        .report(LambdaEvent::new(payload, context), |_| async {
            std::future::pending::<Result<(), lambda_runtime::Error>>().await
        })
        .await;
    let waited = start.elapsed().unwrap();
    assert!(
        waited < Duration::from_millis(1_000),
        "answered {waited:?} after the start: the 1.5 s margin was not used"
    );
    assert_eq!(
        report.records[0].result.as_ref().unwrap_err().kind,
        FailureKind::Unfinished
    );
}

#[tokio::test]
async fn a_nested_call_with_its_callers_id_is_in_progress_not_a_twin_waiting_forever() {
    // Two operations sharing a `key_prefix` share ids: the inner call, made from inside
    // the outer one, must not wait for its own caller.
    let idempotency = Idempotency::new(MemoryStore::new());
    let outer = Operation::new("outer", KeyStrategy::field("id")).key_prefix("orders");
    let inner = Operation::new("inner", KeyStrategy::field("id")).key_prefix("orders");
    let event = records(&[("m1", r#"{"id": "a"}"#)]);
    let sqs = SqsBatch::new();
    let batch = sqs.report_json(event, |body: Value, _| {
        let (idempotency, outer, inner) = (&idempotency, &outer, &inner);
        async move {
            idempotency
                .run(outer, &body, || async {
                    idempotency
                        .run(inner, &body, || async { Ok::<_, lambda_runtime::Error>(1) })
                        .await
                })
                .await
        }
    });
    let report = tokio::time::timeout(Duration::from_secs(5), batch)
        .await
        .expect("the nested call answers instead of waiting for its caller");
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::InProgress, "{}", failure.reason);
}

#[tokio::test]
async fn a_stray_payload_first_in_the_batch_never_costs_the_genuine_resend_its_replay() {
    // The store holds P's result. The batch holds a stray Q (same key, other prompt), then
    // P again: P is judged by the store (a replay), not against Q.
    let store = FaultyStore::new(MemoryStore::new());
    let idempotency = Idempotency::new(store.clone());
    let op = Operation::new("job", KeyStrategy::field("id")).validate(["prompt"]);
    let p = json!({"id": "same", "prompt": "hi"});
    let answer =
        |body: Value| async move { Ok::<_, lambda_runtime::Error>(body["prompt"].clone()) };
    idempotency
        .run(&op, &p, || answer(p.clone()))
        .await
        .unwrap();
    // Claims take a while, so P arrives while Q's claim is in flight.
    store.inject(StoreOp::Claim, Fault::Slow(Duration::from_millis(100)), 2);
    let event = records(&[
        ("mq", r#"{"id": "same", "prompt": "bye"}"#),
        ("mp", r#"{"id": "same", "prompt": "hi"}"#),
    ]);
    let report = SqsBatch::new()
        .report_json(event, |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move { idempotency.run(op, &body, || answer(body.clone())).await }
        })
        .await;
    assert_eq!(
        report.records[0].result.as_ref().unwrap_err().kind,
        FailureKind::Rejected
    );
    assert_eq!(
        report.records[1].result.as_ref().unwrap(),
        "hi",
        "P is replayed"
    );
}

#[tokio::test]
async fn a_twin_of_a_deployment_fault_is_not_a_permanent_failure() {
    // A store error that is not retryable (a missing table, denied access) is no
    // permanent failure of the message: nor is its twin's.
    let store = FaultyStore::new(MemoryStore::new());
    let handler = Handler::over(store.clone());
    // A throttled first attempt (its backoff lets the twin arrive), then a refusal.
    store.inject(StoreOp::Claim, Fault::Unavailable, 1);
    store.inject(StoreOp::Claim, Fault::Rejected, 1);
    let report = twins(
        &handler,
        include_str!("../fixtures/sqs-duplicate-in-batch.json"),
    )
    .await;
    assert_eq!(
        kinds(&report),
        vec![Err(FailureKind::Error), Err(FailureKind::Error)]
    );
    let reason = &report.records[1].result.as_ref().unwrap_err().reason;
    assert!(
        reason.contains("twin") && reason.contains("not retryable"),
        "{reason}"
    );
}

/// However wide the batch's margin, a completion that the store never answers is given
/// up before the batch answers: the record is reported as run (and unstored), never as
/// unfinished, and its provider call is not repeated by a redelivery of the others.
#[tokio::test(start_paused = true)]
async fn store_retries_stop_before_the_batch_answers_whatever_its_margin() {
    completion_given_up_before_the_batch_answers(false).await;
}

/// The same, with the handler setting the invocation's deadline itself inside the batch
/// (`with_deadline`, as `with_context` does): the batch still answers when it said.
#[tokio::test(start_paused = true)]
async fn a_deadline_set_inside_the_batch_keeps_the_batch_s_answer_time() {
    completion_given_up_before_the_batch_answers(true).await;
}

async fn completion_given_up_before_the_batch_answers(rescope: bool) {
    use lambda_idempotency::clock::{Clock, TestClock};
    let clock = TestClock::new(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let store = FaultyStore::new(MemoryStore::new());
    store.inject(StoreOp::Complete, Fault::Hang, 100);
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .clock(clock.clone())
        .build();
    let op = Operation::new("job", KeyStrategy::field("id"));
    let mut context = Context::default();
    context.deadline = lambda_idempotency::store::epoch_millis(clock.now()) + 4_000;
    let deadline = lambda_idempotency::store::from_epoch_millis(context.deadline);
    let event = LambdaEvent::new(
        serde_json::from_value::<SqsEvent>(json!({"Records": [
            {"messageId": "m1", "body": "{\"id\": \"a\"}"},
        ]}))
        .unwrap(),
        context,
    );
    let report = SqsBatch::new()
        // Wider than the engine's own completion margin (600 ms).
        .deadline_margin(Duration::from_secs(2))
        .clock(clock.clone())
        .report_json(event, |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                let run =
                    idempotency.execute(op, &body, || async { Ok::<_, lambda_runtime::Error>(7) });
                let run = async move {
                    run.await
                        .map(|(_, outcome)| outcome)
                        .map_err(ExecuteError::into_inner)
                };
                if rescope {
                    lambda_idempotency::with_deadline(Some(deadline), run).await
                } else {
                    run.await
                }
            }
        })
        .await;
    let outcome = report.records[0].result.as_ref().map(|o| *o);
    assert_eq!(
        outcome.map_err(|f| f.kind),
        Ok(Outcome::ExecutedUnstored),
        "the completion was given up before the batch answered"
    );
    assert!(store.requests(StoreOp::Complete) >= 1);
}

/// At most once: a message whose key a crashed run claimed fails for good (`Rejected`,
/// its reason saying the outcome is unknown and how to resolve it) and runs nothing;
/// the rest of the batch runs.
#[tokio::test]
async fn an_at_most_once_message_whose_run_crashed_is_rejected_and_not_run_again() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("charge", KeyStrategy::field("id"))
        .at_most_once()
        .lease(Duration::from_secs(1));
    let crashed = json!({"id": "paid"});
    let crashing = idempotency.run(&op, &crashed, || async {
        std::future::pending::<Result<(), lambda_runtime::Error>>().await
    });
    let _ = tokio::time::timeout(Duration::from_millis(20), crashing).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let calls = AtomicUsize::new(0);
    let event = records(&[("m1", r#"{"id": "paid"}"#), ("m2", r#"{"id": "fresh"}"#)]);
    let report = SqsBatch::new()
        .report_json(event, |body: Value, _| {
            let (idempotency, op, calls) = (&idempotency, &op, &calls);
            async move {
                idempotency
                    .execute(op, &body, || async {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, lambda_runtime::Error>(())
                    })
                    .await
                    .map(|(_, outcome)| outcome)
                    .map_err(|e| match e {
                        ExecuteError::Idempotency(e) => lambda_runtime::Error::from(e),
                        ExecuteError::Function(e) => e,
                    })
            }
        })
        .await;
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::Rejected, "{}", failure.reason);
    assert!(
        failure.reason.contains("outcome is unknown")
            && failure.reason.contains("lambda-idempotency forget"),
        "{}",
        failure.reason
    );
    assert_eq!(
        report.records[1].result.as_ref().ok(),
        Some(&Outcome::Executed)
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the fresh message ran"
    );
    assert_eq!(
        failures(&report.into_response().unwrap()),
        json!({"batchItemFailures": [{"itemIdentifier": "m1"}]})
    );
}

/// One SQS invocation of `tenant` (none for `None`) with a message of job `id`.
fn tenant_invocation(tenant: Option<&str>, id: &str) -> LambdaEvent<SqsEvent> {
    let mut event = records(&[("m1", &json!({"id": id, "action": "ok"}).to_string())]);
    event.context.tenant_id = tenant.map(str::to_owned);
    event
}

/// Lambda's tenant isolation mode: the same message under two tenants runs once for each;
/// again under one of them it replays, also inside a `with_deadline` the handler sets.
#[tokio::test]
async fn the_same_message_under_two_tenants_runs_once_for_each() {
    let handler = Handler::new();
    let batch = SqsBatch::new();
    let mut outcomes = Vec::new();
    for (tenant, rescope) in [
        (Some("a"), false),
        (Some("b"), false),
        (Some("a"), true),
        (Some("b"), false),
        (None, false),
    ] {
        let report = batch
            .report_json(tenant_invocation(tenant, "j"), |job: Job, _| {
                let handler = &handler;
                async move {
                    match rescope {
                        true => lambda_idempotency::with_deadline(None, handler.handle(job)).await,
                        false => handler.handle(job).await,
                    }
                }
            })
            .await;
        outcomes.push(*report.records[0].result.as_ref().unwrap());
    }
    use Outcome::{Executed, Replayed};
    assert_eq!(outcomes, [Executed, Executed, Replayed, Replayed, Executed]);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
    let op = Operation::new("job", KeyStrategy::field("id"));
    let untenanted = handler.idempotency.idempotency_id(&op, &json!({"id": "j"}));
    assert_eq!(untenanted.unwrap(), "local.job#j");
}

/// An operation's in-progress answer is for direct calls: in a batch, a record whose key is
/// in progress is still handed back for redelivery, never acknowledged unrun.
#[tokio::test]
async fn a_key_in_progress_is_a_batch_item_failure_whatever_the_in_progress_answer() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let op = {
        let asked = asked.clone();
        Operation::new("job", KeyStrategy::field("id")).when_in_progress(move |_| {
            asked.fetch_add(1, Ordering::SeqCst);
            Some(json!("pending"))
        })
    };
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    // Another worker holds the key.
    let holder = {
        let (idempotency, op) = (idempotency.clone(), op.clone());
        tokio::spawn(async move {
            idempotency
                .run(&op, &json!({"id": "a"}), || async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, lambda_runtime::Error>(json!("done"))
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let direct: Value = idempotency
        .run(&op, &json!({"id": "a"}), || async {
            Ok::<_, lambda_runtime::Error>(json!("ran"))
        })
        .await
        .unwrap();
    assert_eq!(direct, "pending", "outside the batch, the answer");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    let report = SqsBatch::new()
        .report_json(records(&[("m1", r#"{"id": "a"}"#)]), |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                idempotency
                    .run(op, &body, || async {
                        Ok::<_, lambda_runtime::Error>(json!("ran"))
                    })
                    .await
            }
        })
        .await;
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert_eq!(failure.kind, FailureKind::InProgress, "{}", failure.reason);
    assert_eq!(asked.load(Ordering::SeqCst), 1, "never asked in a batch");
    assert_eq!(
        failures(&report.into_response().unwrap()),
        json!({"batchItemFailures": [{"itemIdentifier": "m1"}]})
    );
    finish_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();
}

/// The replay hook runs on a batch's replays as on any other.
#[tokio::test]
async fn a_batchs_replay_goes_through_the_operations_replay_hook() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id")).on_replay(|mut stored, replay| {
        stored["replayed_from"] = json!(replay.id);
        stored
    });
    let batch = SqsBatch::new();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let report = batch
            .report_json(records(&[("m1", r#"{"id": "a"}"#)]), |body: Value, _| {
                let (idempotency, op) = (&idempotency, &op);
                async move {
                    idempotency
                        .run(op, &body, || async {
                            Ok::<_, lambda_runtime::Error>(json!({"n": 1}))
                        })
                        .await
                }
            })
            .await;
        answers.push(report.records[0].result.as_ref().unwrap().clone());
    }
    assert_eq!(
        answers,
        [
            json!({"n": 1}),
            json!({"n": 1, "replayed_from": "local.job#a"})
        ]
    );
}

//! Kinesis and DynamoDB Streams batches: the shard's order, where it stops and where it goes
//! on, the response Lambda reads, the images as plain JSON.

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use lambda_idempotency::{
    BatchError, BatchReport, DynamoDbStreamBatch, ExecuteError, FailureKind, Idempotency,
    KeyStrategy, KinesisBatch, MemoryStore, Operation, Outcome, PermanentError,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A Kinesis event of (sequence number, data) records.
fn kinesis(records: &[(&str, &[u8])]) -> LambdaEvent<KinesisEvent> {
    kinesis_until(records, None)
}

fn kinesis_until(
    records: &[(&str, &[u8])],
    deadline: Option<SystemTime>,
) -> LambdaEvent<KinesisEvent> {
    let mut event = KinesisEvent::default();
    event.records = records
        .iter()
        .map(|(seq, data)| {
            let mut record = KinesisEventRecord::default();
            record.event_source = Some("aws:kinesis".into());
            record.kinesis.sequence_number = (*seq).to_owned();
            record.kinesis.data.0 = data.to_vec();
            record
        })
        .collect();
    let mut context = Context::default();
    if let Some(deadline) = deadline {
        context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    }
    LambdaEvent::new(event, context)
}

fn job(id: &str) -> Vec<u8> {
    json!({"id": id, "n": 1}).to_string().into_bytes()
}

/// The handler the stream tests share: idempotent on `id` (validating `n`), counting calls;
/// `"fail": true` fails while `broken` is set, `"refuse": true` is a [`PermanentError`],
/// `"hang": true` never answers.
struct Worker {
    idempotency: Idempotency,
    op: Operation,
    calls: AtomicU32,
    broken: AtomicBool,
}

impl Worker {
    fn new() -> Self {
        Self {
            idempotency: Idempotency::new(MemoryStore::new()),
            op: Operation::new("job", KeyStrategy::field("id")).validate(["n"]),
            calls: AtomicU32::new(0),
            broken: AtomicBool::new(true),
        }
    }

    async fn handle(&self, body: Value) -> Result<Outcome, lambda_runtime::Error> {
        let work = || async {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if body["hang"] == true {
                std::future::pending::<()>().await;
            }
            if body["fail"] == true && self.broken.load(Ordering::SeqCst) {
                return Err("the provider is down".into());
            }
            if body["refuse"] == true {
                return Err(PermanentError::new("the provider refused this request").into());
            }
            Ok::<_, lambda_runtime::Error>(())
        };
        let (_, outcome) = self
            .idempotency
            .execute(&self.op, &body, work)
            .await
            .map_err(|e| match e {
                ExecuteError::Idempotency(e) => e.into(),
                ExecuteError::Function(e) => e,
            })?;
        Ok(outcome)
    }

    async fn kinesis(&self, batch: &KinesisBatch, event: LambdaEvent<KinesisEvent>) -> Report {
        batch
            .report_json(event, |body: Value, _| self.handle(body))
            .await
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

type Report = BatchReport<Outcome, aws_lambda_events::event::streams::KinesisEventResponse>;

fn kinds<R>(report: &BatchReport<Outcome, R>) -> Vec<Result<Outcome, FailureKind>> {
    report
        .records
        .iter()
        .map(|r| r.result.as_ref().map_err(|f| f.kind).copied())
        .collect()
}

fn reported(response: impl serde::Serialize) -> Vec<String> {
    serde_json::to_value(response).unwrap()["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_shard_stops_at_a_failure_a_retry_can_fix_and_the_rest_comes_again_in_order() {
    let worker = Worker::new();
    let fail = json!({"id": "j2", "n": 1, "fail": true}).to_string();
    let report = worker
        .kinesis(
            &KinesisBatch::new(),
            kinesis(&[
                ("1", &job("j1")),
                ("2", fail.as_bytes()),
                ("3", &job("j3")),
                ("4", &job("j4")),
            ]),
        )
        .await;
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Err(Error),
            Err(SkippedAfterGroupFailure),
            Err(SkippedAfterGroupFailure)
        ]
    );
    assert_eq!(worker.calls(), 2, "nothing after the failure ran");
    assert!(
        report.records[2]
            .result
            .as_ref()
            .unwrap_err()
            .reason
            .contains("earlier record 2 of its shard"),
        "{:?}",
        report.records[2].result
    );
    assert_eq!(reported(report.into_response().unwrap()), ["2", "3", "4"]);

    // Lambda resends from the lowest reported record; the provider is back.
    worker.broken.store(false, Ordering::SeqCst);
    let again = worker
        .kinesis(
            &KinesisBatch::new(),
            kinesis(&[("2", fail.as_bytes()), ("3", &job("j3")), ("4", &job("j4"))]),
        )
        .await;
    assert_eq!(kinds(&again), [Ok(Outcome::Executed); 3]);
    assert_eq!(
        worker.calls(),
        5,
        "each request ran once, j2 twice (its first call failed)"
    );
}

#[tokio::test]
async fn a_poison_record_of_each_kind_is_reported_and_the_records_after_it_run_now() {
    let not_json: &[u8] = b"{not json";
    let not_utf8: &[u8] = b"\xff\xfe\x00";
    let no_key = json!({"n": 1}).to_string();
    let mismatch = json!({"id": "seen", "n": 2}).to_string();
    let refused = json!({"id": "refused", "n": 1, "refuse": true}).to_string();
    let poisons: [(&str, &[u8], FailureKind, &str); 5] = [
        (
            "not JSON",
            not_json,
            FailureKind::MalformedBody,
            "invalid body",
        ),
        (
            "not UTF-8",
            not_utf8,
            FailureKind::MalformedBody,
            "invalid body",
        ),
        ("no key", no_key.as_bytes(), FailureKind::Rejected, "id"),
        (
            "another payload under a stored key",
            mismatch.as_bytes(),
            FailureKind::Rejected,
            "payload",
        ),
        (
            "refused by the provider",
            refused.as_bytes(),
            FailureKind::Permanent,
            "refused",
        ),
    ];
    for (what, poison, kind, reason) in poisons {
        let worker = Worker::new();
        worker.handle(json!({"id": "seen", "n": 1})).await.unwrap();
        let before = worker.calls();
        let records = [
            ("1", &job("a")[..]),
            ("2", poison),
            ("3", &job("b")),
            ("4", &job("c")),
        ];
        let report = worker
            .kinesis(&KinesisBatch::new(), kinesis(&records))
            .await;
        let failure = report.records[1].result.as_ref().unwrap_err();
        assert_eq!(failure.kind, kind, "{what}: {failure}");
        assert!(
            failure.reason.contains(reason),
            "{what}: {}",
            failure.reason
        );
        let ran = |i: usize| report.records[i].result.as_ref().ok().copied();
        assert_eq!(
            [ran(0), ran(2), ran(3)],
            [Some(Outcome::Executed); 3],
            "{what}"
        );
        let poison_calls = u32::from(kind == FailureKind::Permanent);
        assert_eq!(worker.calls() - before, 3 + poison_calls, "{what}");
        assert_eq!(reported(report.into_response().unwrap()), ["2"], "{what}");

        // Lambda resends from the poison record: the ones after it are replayed, not run.
        let again = worker
            .kinesis(&KinesisBatch::new(), kinesis(&records[1..]))
            .await;
        assert_eq!(
            again.records[0].result.as_ref().unwrap_err().kind,
            kind,
            "{what}"
        );
        let replays: Vec<_> = again.records[1..]
            .iter()
            .map(|r| r.result.as_ref().ok().copied())
            .collect();
        assert_eq!(replays, [Some(Outcome::Replayed); 2], "{what}");
        assert_eq!(
            worker.calls() - before,
            3 + 2 * poison_calls,
            "{what}: no second call"
        );
    }
}

#[tokio::test]
async fn stop_at_permanent_failures_holds_back_the_records_after_a_poison() {
    let worker = Worker::new();
    let batch = KinesisBatch::new().stop_at_permanent_failures(true);
    let report = worker
        .kinesis(
            &batch,
            kinesis(&[("1", &job("a")), ("2", b"nope"), ("3", &job("b"))]),
        )
        .await;
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Err(MalformedBody),
            Err(SkippedAfterGroupFailure)
        ]
    );
    assert_eq!(worker.calls(), 1);
}

#[tokio::test]
async fn continue_past_failures_runs_every_record_and_reports_each_failure() {
    let worker = Worker::new();
    let fail = |id: &str| {
        json!({"id": id, "n": 1, "fail": true})
            .to_string()
            .into_bytes()
    };
    let batch = KinesisBatch::new().continue_past_failures(true);
    let report = worker
        .kinesis(
            &batch,
            kinesis(&[
                ("1", &job("a")),
                ("2", &fail("b")),
                ("3", &job("c")),
                ("4", &fail("d")),
                ("5", &job("e")),
            ]),
        )
        .await;
    assert_eq!(worker.calls(), 5, "every record ran");
    assert_eq!(reported(report.into_response().unwrap()), ["2", "4"]);
}

#[tokio::test]
async fn a_twin_of_a_permanent_failure_later_in_the_shard_is_permanent_and_does_not_run() {
    let worker = Worker::new();
    let refused = json!({"id": "a", "n": 1, "refuse": true}).to_string();
    let report = worker
        .kinesis(
            &KinesisBatch::new(),
            kinesis(&[
                ("1", refused.as_bytes()),
                ("2", &job("b")),
                ("3", refused.as_bytes()),
                ("4", &job("c")),
            ]),
        )
        .await;
    assert_eq!(
        kinds(&report),
        [
            Err(FailureKind::Permanent),
            Ok(Outcome::Executed),
            Err(FailureKind::Permanent),
            Ok(Outcome::Executed)
        ],
        "the twin keeps its sibling's class: the shard goes on"
    );
    assert_eq!(worker.calls(), 3, "the refused request ran once");
}

#[tokio::test]
async fn a_key_whose_lease_ends_before_the_batch_answers_is_waited_for_then_taken_over() {
    let store = MemoryStore::new();
    // Elsewhere: a call that hangs under a 1 s lease (the shortest).
    let elsewhere = Worker {
        idempotency: Idempotency::builder(store.clone())
            .lease(Duration::from_secs(1))
            .build(),
        ..Worker::new()
    };
    let worker = Worker {
        idempotency: Idempotency::new(store),
        ..Worker::new()
    };
    let slow = json!({"id": "busy", "n": 1, "hang": true});
    let data = json!({"id": "busy", "n": 1}).to_string();
    let hanging = elsewhere.handle(slow);
    let batch = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let deadline = SystemTime::now() + Duration::from_secs(3);
        let event = kinesis_until(
            &[("1", data.as_bytes()), ("2", &job("next"))],
            Some(deadline),
        );
        let batch = KinesisBatch::new().wait_for_in_progress(Some(Duration::from_millis(500)));
        worker.kinesis(&batch, event).await
    };
    let started = Instant::now();
    let report = tokio::select! {
        _ = hanging => unreachable!("it hangs"),
        report = batch => report,
    };
    assert_eq!(
        kinds(&report),
        [Ok(Outcome::TookOver), Ok(Outcome::Executed)]
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for the lease"
    );
}

/// `wait_for_in_progress` at its extremes: `Duration::MAX` of time to run never fits
/// before the batch answers, so the record is reported (no overflow when the lease ends);
/// zero waits for the lease and takes the key over.
#[tokio::test]
async fn wait_for_in_progress_at_zero_and_at_its_maximum() {
    for (time_to_run, expected) in [
        (
            Duration::MAX,
            [
                Err(FailureKind::InProgress),
                Err(FailureKind::SkippedAfterGroupFailure),
            ],
        ),
        (
            Duration::ZERO,
            [Ok(Outcome::TookOver), Ok(Outcome::Executed)],
        ),
    ] {
        let store = MemoryStore::new();
        let elsewhere = Worker {
            idempotency: Idempotency::builder(store.clone())
                .lease(Duration::from_secs(1))
                .build(),
            ..Worker::new()
        };
        let worker = Worker {
            idempotency: Idempotency::new(store),
            ..Worker::new()
        };
        let slow = json!({"id": "busy", "n": 1, "hang": true});
        let data = json!({"id": "busy", "n": 1}).to_string();
        let hanging = elsewhere.handle(slow);
        let batch = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let deadline = SystemTime::now() + Duration::from_secs(3);
            let event = kinesis_until(
                &[("1", data.as_bytes()), ("2", &job("next"))],
                Some(deadline),
            );
            let batch = KinesisBatch::new().wait_for_in_progress(Some(time_to_run));
            worker.kinesis(&batch, event).await
        };
        let report = tokio::select! {
            _ = hanging => unreachable!("it hangs"),
            report = batch => report,
        };
        assert_eq!(kinds(&report), expected, "{time_to_run:?}");
    }
}

/// `deadline_margin` and `max_concurrency` at their extremes: a margin of
/// `Duration::MAX` answers at once (a record that waits is unfinished; no overflow), zero
/// lets records run to the deadline; a concurrency of 0 runs one at a time, `usize::MAX`
/// every record at once.
#[tokio::test]
async fn deadline_margin_and_max_concurrency_at_zero_and_at_their_maximum() {
    use FailureKind::*;
    let hang = json!({"id": "h", "n": 1, "hang": true}).to_string();
    let (a, b) = (job("a"), job("b"));
    let deadline = || Some(SystemTime::now() + Duration::from_secs(3));
    type Case<'a> = (
        KinesisBatch,
        Vec<(&'a str, &'a [u8])>,
        Vec<Result<Outcome, FailureKind>>,
    );
    let cases: [Case<'_>; 4] = [
        (
            KinesisBatch::new().deadline_margin(Duration::MAX),
            vec![("1", hang.as_bytes()), ("2", &a)],
            vec![Err(Unfinished), Err(Unfinished)],
        ),
        (
            KinesisBatch::new().deadline_margin(Duration::ZERO),
            vec![("1", &a), ("2", &b)],
            vec![Ok(Outcome::Executed); 2],
        ),
        (
            KinesisBatch::new().max_concurrency(0),
            vec![("1", &a), ("2", &b)],
            vec![Ok(Outcome::Executed); 2],
        ),
        (
            KinesisBatch::new()
                .continue_past_failures(true)
                .max_concurrency(usize::MAX),
            vec![("1", &a), ("2", &b)],
            vec![Ok(Outcome::Executed); 2],
        ),
    ];
    for (batch, records, expected) in cases {
        let worker = Worker::new();
        let report = worker
            .kinesis(&batch, kinesis_until(&records, deadline()))
            .await;
        assert_eq!(kinds(&report), expected, "{batch:?}");
    }
}

#[tokio::test]
async fn a_key_in_progress_elsewhere_stops_the_shard() {
    let worker = Worker::new();
    let slow = json!({"id": "busy", "n": 1, "hang": true});
    let elsewhere = worker.handle(slow.clone());
    let batch = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let data = slow.to_string();
        // Its lease (15 minutes outside a batch) outlives this invocation: no wait.
        let deadline = SystemTime::now() + Duration::from_secs(2);
        let event = kinesis_until(
            &[("1", data.as_bytes()), ("2", &job("next"))],
            Some(deadline),
        );
        worker.kinesis(&KinesisBatch::new(), event).await
    };
    let report = tokio::select! {
        _ = elsewhere => unreachable!("it hangs"),
        report = batch => report,
    };
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [Err(InProgress), Err(SkippedAfterGroupFailure)]
    );
}

#[tokio::test]
async fn the_response_follows_lambdas_rules() {
    let worker = Worker::new();
    // No failure: an empty list, which Lambda reads as the whole batch done.
    let report = worker
        .kinesis(&KinesisBatch::new(), kinesis(&[("1", &job("a"))]))
        .await;
    assert_eq!(
        serde_json::to_value(report.into_response().unwrap()).unwrap(),
        json!({"batchItemFailures": []})
    );
    // The same through `run_json` and `run`, which build the response themselves.
    let batch = KinesisBatch::new().continue_past_failures(true);
    let event = || kinesis(&[("7", b"x"), ("8", &job("b"))]);
    let response = batch
        .run_json(event(), |body: Value, _| worker.handle(body))
        .await
        .unwrap();
    assert_eq!(reported(response), ["7"]);
    let response = batch
        .run(event(), |record| async move {
            match record.kinesis.sequence_number.as_str() {
                "8" => Ok(()),
                _ => Err("no"),
            }
        })
        .await
        .unwrap();
    assert_eq!(reported(response), ["7"]);
    let dynamodb_batch = DynamoDbStreamBatch::new();
    let records = || {
        dynamodb(vec![
            change(
                "1",
                "INSERT",
                json!({"id": {"S": "x"}, "n": {"N": "1"}}),
                Value::Null,
            ),
            change("2", "REMOVE", Value::Null, json!({"id": {"S": "x"}})),
        ])
    };
    let response = dynamodb_batch
        .run_json(records(), |image: Value, _| worker.handle(image))
        .await
        .unwrap();
    assert!(reported(response).is_empty(), "a REMOVE is skipped");
    let response = dynamodb_batch
        .clone()
        .run_removals(true)
        .run(records(), |record| async move {
            match record.event_name.as_str() {
                "INSERT" => Ok(()),
                _ => Err("a removal"),
            }
        })
        .await
        .unwrap();
    assert_eq!(reported(response), ["2"]);
    // A failed record with no sequence number cannot be reported: an empty
    // itemIdentifier would fail the batch anyway, so the invocation fails.
    let report = worker
        .kinesis(&KinesisBatch::new(), kinesis(&[("", b"nope")]))
        .await;
    assert!(matches!(
        report.into_response(),
        Err(BatchError::MissingItemId { index: 0 })
    ));
    // Every failure in the event's order; Lambda resumes from the lowest.
    let batch = KinesisBatch::new().continue_past_failures(true);
    let report = worker
        .kinesis(
            &batch,
            kinesis(&[("7", b"x"), ("8", &job("b")), ("9", b"y")]),
        )
        .await;
    assert_eq!(reported(report.into_response().unwrap()), ["7", "9"]);
}

#[tokio::test]
async fn a_record_that_hangs_is_unfinished_and_the_batch_answers_before_the_deadline() {
    let worker = Worker::new();
    let hang = json!({"id": "stuck", "n": 1, "hang": true}).to_string();
    let deadline = SystemTime::now() + Duration::from_millis(1500);
    let started = Instant::now();
    let report = worker
        .kinesis(
            &KinesisBatch::new(),
            kinesis_until(
                &[("1", &job("a")), ("2", hang.as_bytes()), ("3", &job("b"))],
                Some(deadline),
            ),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(1300),
        "{:?}",
        started.elapsed()
    );
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [Ok(Outcome::Executed), Err(Unfinished), Err(Unfinished)]
    );
    assert_eq!(reported(report.into_response().unwrap()), ["2", "3"]);
}

/// A DynamoDB Streams record as Lambda delivers it.
fn change(seq: &str, name: &str, new_image: Value, old_image: Value) -> Value {
    json!({
        "eventID": format!("id-{seq}"), "eventName": name, "awsRegion": "us-east-1",
        "eventSource": "aws:dynamodb", "eventVersion": "1.1",
        "dynamodb": {
            "SequenceNumber": seq, "SizeBytes": 100, "StreamViewType": "NEW_AND_OLD_IMAGES",
            "Keys": {"id": {"S": "k"}}, "NewImage": new_image, "OldImage": old_image,
        },
    })
}

fn dynamodb(records: Vec<Value>) -> LambdaEvent<DynamoDbEvent> {
    let event =
        serde_json::from_value(json!({ "Records": records })).expect("a DynamoDB Streams event");
    LambdaEvent::new(event, Context::default())
}

#[tokio::test]
async fn a_dynamodb_change_hands_over_its_images_as_plain_json() {
    let worker = Worker::new();
    let item = |id: &str| json!({"id": {"S": id}, "n": {"N": "1"}, "tags": {"SS": ["x"]}});
    let seen = std::sync::Mutex::new(Vec::new());
    let report = DynamoDbStreamBatch::new()
        .report_json(
            dynamodb(vec![
                change("100", "INSERT", item("a"), Value::Null),
                // A put that changes nothing still streams a MODIFY: the same request.
                change("200", "MODIFY", item("a"), item("a")),
                change("300", "REMOVE", Value::Null, item("a")),
                change(
                    "400",
                    "INSERT",
                    json!({"id": {"S": "b"}, "n": {"N": "1e999"}}),
                    Value::Null,
                ),
                change("500", "INSERT", item("c"), Value::Null),
            ]),
            |image: Value, change| {
                seen.lock().unwrap().push((
                    change.event_name.clone(),
                    change.old_image.clone(),
                    image.clone(),
                ));
                async { worker.handle(image).await }
            },
        )
        .await;
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Ok(Outcome::Replayed),
            Err(MalformedBody),
            Ok(Outcome::Executed)
        ],
        "the REMOVE is skipped, not run"
    );
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(
        (
            report.skipped[0].index,
            report.skipped[0].item_id.as_deref()
        ),
        (2, Some("300"))
    );
    let reason = |i: usize| {
        report.records[i]
            .result
            .as_ref()
            .unwrap_err()
            .reason
            .clone()
    };
    assert!(reason(2).contains("attribute `n`"), "{}", reason(2));
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen[0],
        (
            "INSERT".into(),
            None,
            json!({"id": "a", "n": 1, "tags": ["x"]})
        )
    );
    assert_eq!(seen[1].1, Some(json!({"id": "a", "n": 1, "tags": ["x"]})));
    assert_eq!(worker.calls(), 2);
    assert_eq!(reported(report.into_response().unwrap()), ["400"]);
}

#[tokio::test]
async fn a_removal_is_acknowledged_without_running_unless_the_handler_asks_for_removals() {
    // A requests table with a TTL streams a REMOVE for every expired item: by default each
    // is acknowledged, never a failure that resends its batch with it.
    let item = |id: &str| json!({"id": {"S": id}, "n": {"N": "1"}});
    let records = || {
        dynamodb(vec![
            change("100", "INSERT", item("a"), Value::Null),
            change("200", "REMOVE", Value::Null, item("old")),
            change("300", "REMOVE", Value::Null, item("older")),
        ])
    };
    let worker = Worker::new();
    let report = DynamoDbStreamBatch::new()
        .report_json(records(), |image: Value, _| worker.handle(image))
        .await;
    assert_eq!(kinds(&report), [Ok(Outcome::Executed)]);
    assert_eq!(worker.calls(), 1, "no call for a removal");
    let skipped: Vec<_> = report.skipped.iter().map(|s| s.item_id.clone()).collect();
    assert_eq!(skipped, [Some("200".to_owned()), Some("300".to_owned())]);
    assert!(
        report.skipped[0].reason.contains("REMOVE"),
        "{:?}",
        report.skipped[0]
    );
    assert!(reported(report.into_response().unwrap()).is_empty());

    // A failure without a sequence number is named by its place in the event.
    let unnamed = dynamodb(vec![
        change("200", "REMOVE", Value::Null, item("x")),
        change("", "INSERT", item("fails"), Value::Null),
    ]);
    let response = DynamoDbStreamBatch::new()
        .run_json(unnamed, |_: Value, _| async { Err::<(), _>("down") })
        .await;
    assert!(
        matches!(response, Err(BatchError::MissingItemId { index: 1 })),
        "{response:?}"
    );

    // Every record a REMOVE: acknowledged, not "every record failed".
    let only_removals = dynamodb(vec![change("200", "REMOVE", Value::Null, item("x"))]);
    let response = DynamoDbStreamBatch::new()
        .fail_invocation_when_all_fail(true)
        .run_json(only_removals, |image: Value, _| worker.handle(image))
        .await;
    assert!(reported(response.unwrap()).is_empty());

    // Asked for, a removal runs with its old image.
    let seen = std::sync::Mutex::new(Vec::new());
    let worker = Worker::new();
    let report = DynamoDbStreamBatch::new()
        .run_removals(true)
        .report_json(records(), |image: Value, change| {
            seen.lock()
                .unwrap()
                .push((change.event_name.clone(), image.clone()));
            worker.handle(image)
        })
        .await;
    assert_eq!(kinds(&report), [Ok(Outcome::Executed); 3]);
    assert!(report.skipped.is_empty());
    assert_eq!(
        seen.into_inner().unwrap()[1],
        ("REMOVE".to_owned(), json!({"id": "old", "n": 1}))
    );
}

#[tokio::test]
async fn a_dynamodb_shard_stops_at_a_failure_a_retry_can_fix() {
    let worker = Worker::new();
    let item =
        |id: &str, fail: bool| json!({"id": {"S": id}, "n": {"N": "1"}, "fail": {"BOOL": fail}});
    let report = DynamoDbStreamBatch::new()
        .report_json(
            dynamodb(vec![
                change("100", "INSERT", item("a", false), Value::Null),
                change("200", "INSERT", item("b", true), Value::Null),
                change("300", "INSERT", item("c", false), Value::Null),
            ]),
            |image: Value, _| worker.handle(image),
        )
        .await;
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Err(Error),
            Err(SkippedAfterGroupFailure)
        ]
    );
    assert_eq!(reported(report.into_response().unwrap()), ["200", "300"]);
}

#[tokio::test]
async fn a_wait_that_would_leave_too_little_time_to_run_is_not_made() {
    let store = MemoryStore::new();
    let elsewhere = Worker {
        idempotency: Idempotency::builder(store.clone())
            .lease(Duration::from_secs(1))
            .build(),
        ..Worker::new()
    };
    let worker = Worker {
        idempotency: Idempotency::new(store),
        ..Worker::new()
    };
    let hanging = elsewhere.handle(json!({"id": "busy", "n": 1, "hang": true}));
    let data = json!({"id": "busy", "n": 1}).to_string();
    let batch = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The lease ends in 0.3 s, but the default 10 s to run do not fit before 3 s.
        let deadline = SystemTime::now() + Duration::from_secs(3);
        let event = kinesis_until(&[("1", data.as_bytes())], Some(deadline));
        worker.kinesis(&KinesisBatch::new(), event).await
    };
    let started = Instant::now();
    let report = tokio::select! {
        _ = hanging => unreachable!("it hangs"),
        report = batch => report,
    };
    assert_eq!(kinds(&report), [Err(FailureKind::InProgress)]);
    assert!(started.elapsed() < Duration::from_millis(300), "no wait");
}

/// The handler shape the README shows: `execute`'s own result, returned as it is.
#[tokio::test]
async fn a_handler_returning_executes_error_is_classified_by_what_is_inside_it() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("job", KeyStrategy::field("id")).validate(["n"]);
    let data = |v: Value| v.to_string().into_bytes();
    let records = [
        data(json!({"id": "a", "n": 1})),
        // The same key with another payload: Rejected, permanent.
        data(json!({"id": "a", "n": 2})),
        // The function's own PermanentError, inside ExecuteError::Function.
        data(json!({"id": "b", "n": 1, "refuse": true})),
        data(json!({"id": "c", "n": 1})),
    ];
    let event: Vec<(&str, &[u8])> = vec![
        ("1", &records[0]),
        ("2", &records[1]),
        ("3", &records[2]),
        ("4", &records[3]),
    ];
    let report = KinesisBatch::new()
        .report_json(kinesis(&event), |body: Value, _| {
            let (idempotency, op) = (&idempotency, &op);
            async move {
                idempotency
                    .execute(op, &body, || async {
                        if body["refuse"] == true {
                            // Inside an io::Error, inside ExecuteError::Function.
                            return Err(std::io::Error::other(PermanentError::new("refused")));
                        }
                        Ok(())
                    })
                    .await
                    .map(|(_, outcome)| outcome)
            }
        })
        .await;
    use FailureKind::*;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Err(Rejected),
            Err(Permanent),
            Ok(Outcome::Executed)
        ]
    );
}

#[tokio::test]
async fn different_big_numbers_stay_different_and_sets_convert_alike_in_any_order() {
    let worker = Worker::new();
    let report = DynamoDbStreamBatch::new()
        .report_json(
            dynamodb(vec![
                change(
                    "1",
                    "INSERT",
                    json!({"id": {"N": "123456789012345678901234567890"}, "n": {"N": "1"}}),
                    Value::Null,
                ),
                change(
                    "2",
                    "INSERT",
                    json!({"id": {"N": "123456789012345678901234567891"}, "n": {"N": "1"}}),
                    Value::Null,
                ),
                change(
                    "3",
                    "INSERT",
                    json!({"id": {"S": "set"}, "n": {"SS": ["x", "y"]}}),
                    Value::Null,
                ),
                // The same item again, its set in another order: the same payload.
                change(
                    "4",
                    "MODIFY",
                    json!({"id": {"S": "set"}, "n": {"SS": ["y", "x"]}}),
                    Value::Null,
                ),
            ]),
            |image: Value, _| worker.handle(image),
        )
        .await;
    assert_eq!(
        kinds(&report),
        [
            Ok(Outcome::Executed),
            Ok(Outcome::Executed),
            Ok(Outcome::Executed),
            Ok(Outcome::Replayed)
        ]
    );
    assert_eq!(worker.calls(), 3);
}

#[tokio::test]
async fn a_value_in_a_body_that_does_not_parse_stays_out_of_its_reason() {
    let secret = "my card is 4111-1111-1111-1111";
    let kinesis_data = json!({"id": secret, "n": [secret]}).to_string();
    let report = KinesisBatch::new()
        .report_json(
            kinesis(&[("1", kinesis_data.as_bytes())]),
            |_: Job, _| async { Ok::<_, std::io::Error>(()) },
        )
        .await;
    let dynamodb_report = DynamoDbStreamBatch::new()
        .report_json(
            dynamodb(vec![change(
                "1",
                "INSERT",
                json!({"id": {"S": secret}, "n": {"S": secret}}),
                Value::Null,
            )]),
            |_: Job, _| async { Ok::<_, std::io::Error>(()) },
        )
        .await;
    for reason in [&report.records[0], &dynamodb_report.records[0]]
        .map(|r| r.result.as_ref().unwrap_err().reason.clone())
    {
        assert!(reason.contains("invalid type"), "{reason}");
        assert!(!reason.contains("4111"), "{reason}");
    }
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Job {
    id: String,
    n: u32,
}

/// At most once on a stream: a record whose key a crashed run claimed is a permanent
/// failure (the records after it run now, as after any poison record) and does not run.
#[tokio::test]
async fn an_at_most_once_record_whose_run_crashed_is_rejected_and_the_shard_goes_on() {
    let worker = Worker {
        op: Operation::new("job", KeyStrategy::field("id"))
            .validate(["n"])
            .at_most_once()
            .lease(Duration::from_secs(1)),
        ..Worker::new()
    };
    let crashed = json!({"id": "sent", "n": 1, "hang": true});
    let _ = tokio::time::timeout(Duration::from_millis(20), worker.handle(crashed)).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let data = json!({"id": "sent", "n": 1}).to_string();
    let report = worker
        .kinesis(
            &KinesisBatch::new(),
            kinesis(&[("1", data.as_bytes()), ("2", &job("next"))]),
        )
        .await;
    assert_eq!(
        kinds(&report),
        [Err(FailureKind::Rejected), Ok(Outcome::Executed)]
    );
    assert_eq!(
        worker.calls(),
        2,
        "the crashed run and the next record, nothing again"
    );
    assert_eq!(reported(report.into_response().unwrap()), ["1"]);
}

/// At most once on a DynamoDB stream, as on Kinesis: the crashed run's record is a
/// permanent failure and does not run; the change after it runs now.
#[tokio::test]
async fn an_at_most_once_change_whose_run_crashed_is_rejected_and_the_shard_goes_on() {
    let worker = Worker {
        op: Operation::new("job", KeyStrategy::field("id"))
            .validate(["n"])
            .at_most_once()
            .lease(Duration::from_secs(1)),
        ..Worker::new()
    };
    let crashed = json!({"id": "sent", "n": 1, "hang": true});
    let _ = tokio::time::timeout(Duration::from_millis(20), worker.handle(crashed)).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let item = |id: &str| json!({"id": {"S": id}, "n": {"N": "1"}});
    let report = DynamoDbStreamBatch::new()
        .report_json(
            dynamodb(vec![
                change("100", "MODIFY", item("sent"), item("sent")),
                change("200", "INSERT", item("next"), Value::Null),
            ]),
            |image: Value, _| worker.handle(image),
        )
        .await;
    assert_eq!(
        kinds(&report),
        [Err(FailureKind::Rejected), Ok(Outcome::Executed)]
    );
    assert_eq!(worker.calls(), 2, "the crashed run and the next change");
    assert_eq!(reported(report.into_response().unwrap()), ["100"]);
}

/// Lambda's tenant isolation mode, for Kinesis and DynamoDB Streams: the same record under
/// two tenants runs once for each, and again under one of them replays.
#[tokio::test]
async fn the_same_record_under_two_tenants_runs_once_for_each() {
    use Outcome::{Executed, Replayed};
    let tenants = [Some("a"), Some("b"), Some("a"), Some("b"), None];
    let worker = Worker::new();
    let mut outcomes = Vec::new();
    for tenant in tenants {
        let mut event = kinesis(&[("1", &job("j"))]);
        event.context.tenant_id = tenant.map(str::to_owned);
        let report = worker.kinesis(&KinesisBatch::new(), event).await;
        outcomes.extend(kinds(&report));
    }
    let expected = [Executed, Executed, Replayed, Replayed, Executed].map(Ok);
    assert_eq!(outcomes, expected);
    assert_eq!(worker.calls(), 3);

    let worker = Worker::new();
    let item = json!({"id": {"S": "j"}, "n": {"N": "1"}});
    let mut outcomes = Vec::new();
    for tenant in tenants {
        let mut event = dynamodb(vec![change("100", "INSERT", item.clone(), Value::Null)]);
        event.context.tenant_id = tenant.map(str::to_owned);
        let report = DynamoDbStreamBatch::new()
            .report_json(event, |image: Value, _| worker.handle(image))
            .await;
        outcomes.extend(kinds(&report));
    }
    assert_eq!(outcomes, expected);
    assert_eq!(worker.calls(), 3);
}

//! The metrics feature: a known mix of calls counted by a recorder in the test
//! (metrics-util's `DebuggingRecorder`, local to this thread, so each test runs on a
//! current-thread runtime), and the tracing span's fields, read by a layer in the test.
#![cfg(feature = "metrics")]

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::metrics::{
    BATCH_FAILURES, OUTCOMES, STORE_REQUEST_SECONDS, STORE_REQUESTS,
};
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::{Claim, IdempotencyStore, StoreOp};
use lambda_idempotency::{
    ExecuteError, Idempotency, KeyStrategy, KinesisBatch, MemoryStore, Operation, SqsBatch,
};
use lambda_runtime::{Context, LambdaEvent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// What a test recorded: (name, sorted labels) -> value.
type Recorded = BTreeMap<(String, Vec<(String, String)>), DebugValue>;

/// Runs `f` on a current-thread runtime with a recorder of its own; returns what was
/// recorded, as (name, sorted labels) -> value.
fn recorded<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> Recorded {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        lambda_idempotency::metrics::describe();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f());
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

fn counter(all: &Recorded, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut labels: Vec<_> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    match all.get(&(name.to_owned(), labels)) {
        Some(DebugValue::Counter(n)) => *n,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
        None => 0,
    }
}

fn outcomes(all: &Recorded) -> BTreeMap<String, u64> {
    all.iter()
        .filter(|((name, _), _)| name == OUTCOMES)
        .map(|((_, labels), value)| {
            let outcome = labels
                .iter()
                .find(|(k, _)| k == "outcome")
                .unwrap()
                .1
                .clone();
            let DebugValue::Counter(n) = value else {
                panic!()
            };
            (outcome, *n)
        })
        .collect()
}

#[test]
fn every_outcome_is_counted_once_with_low_cardinality_labels() {
    let store = FaultyStore::new(MemoryStore::new());
    let op = Operation::new("send", KeyStrategy::field("id")).validate(["body"]);
    let all = recorded(|| {
        let store = store.clone();
        let op = op.clone();
        async move {
            let idempotency = Idempotency::builder(store.clone())
                .function_name("fn")
                .build();
            let run = |payload: Value, fail: bool| {
                let idempotency = idempotency.clone();
                let op = op.clone();
                async move {
                    idempotency
                        .execute(&op, &payload, || async move {
                            if fail {
                                Err("the function failed")
                            } else {
                                Ok("done".to_owned())
                            }
                        })
                        .await
                }
            };
            assert!(run(json!({"id": "a", "body": 1}), false).await.is_ok()); // executed
            assert!(run(json!({"id": "a", "body": 1}), false).await.is_ok()); // replayed
            assert!(run(json!({"id": "a", "body": 1}), false).await.is_ok()); // replayed
            assert!(run(json!({"id": "a", "body": 2}), false).await.is_err()); // rejected
            assert!(run(json!({"id": "b", "body": 1}), true).await.is_err()); // failed
            assert!(run(json!({"id": "b", "body": 1}), false).await.is_ok()); // executed
            // Another worker's live claim, and a crashed worker's lease that ended.
            let now = SystemTime::now();
            for (key, lease) in [
                ("c", now + Duration::from_secs(60)),
                ("d", now - Duration::from_secs(1)),
            ] {
                let id = idempotency
                    .idempotency_id(&op, &json!({"id": key}))
                    .unwrap();
                let claim = Claim::new(id, now - Duration::from_secs(2), lease, "other-worker")
                    .expires_at(now + Duration::from_secs(3600));
                store.inner().claim(&claim).await.unwrap();
            }
            assert!(run(json!({"id": "c", "body": 1}), false).await.is_err()); // in_progress
            assert!(run(json!({"id": "d", "body": 1}), false).await.is_ok()); // took_over
            store.inject(StoreOp::Claim, Fault::Rejected, 1);
            assert!(run(json!({"id": "e", "body": 1}), false).await.is_err()); // store_error
            let cached = Idempotency::builder(store.clone())
                .function_name("fn")
                .local_cache(8)
                .build();
            for _ in 0..2 {
                // executed, then replayed_from_cache
                let answer: Result<String, lambda_idempotency::Error> = cached
                    .run(&op, &json!({"id": "f", "body": 1}), || async {
                        Ok("done".to_owned())
                    })
                    .await;
                answer.unwrap();
            }
            let disabled = Idempotency::builder(store.clone())
                .function_name("fn")
                .disabled(true)
                .build();
            let answer: Result<String, lambda_idempotency::Error> = disabled
                .run(&op, &json!({"id": "g", "body": 1}), || async {
                    Ok("done".to_owned())
                })
                .await;
            answer.unwrap();
        }
    });
    let expected: BTreeMap<String, u64> = [
        ("executed", 3),
        ("replayed", 2),
        ("replayed_from_cache", 1),
        ("rejected", 1),
        ("failed", 1),
        ("in_progress", 1),
        ("took_over", 1),
        ("store_error", 1),
        ("disabled", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(outcomes(&all), expected);
    // The labels: the function and the operation, never a key.
    for (name, labels) in all.keys() {
        if name == OUTCOMES {
            let names: Vec<_> = labels.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["function", "operation", "outcome"]);
            assert!(labels.contains(&("function".into(), "fn".into())));
            assert!(labels.contains(&("operation".into(), "send".into())));
        }
        for (_, value) in labels {
            assert!(
                !["a", "b", "c", "d"].contains(&value.as_str()),
                "a key in a label: {labels:?}"
            );
        }
    }
    // Every store request attempt, by operation and result, as the store saw them.
    let attempts = |operation: &str, result: &str| {
        counter(
            &all,
            STORE_REQUESTS,
            &[
                ("store", "memory"),
                ("operation", operation),
                ("result", result),
            ],
        )
    };
    assert_eq!(
        attempts("claim", "ok") + attempts("claim", "error"),
        store.requests(StoreOp::Claim),
        "the two claims made by hand went past the counting wrapper"
    );
    assert_eq!(attempts("claim", "error"), 1);
    assert_eq!(
        attempts("complete", "ok"),
        store.requests(StoreOp::Complete)
    );
    assert_eq!(attempts("release", "ok"), store.requests(StoreOp::Release));
    assert!(matches!(
        all.get(&(STORE_REQUEST_SECONDS.to_owned(), vec![("operation".into(), "claim".into()), ("store".into(), "memory".into())])),
        Some(DebugValue::Histogram(samples)) if samples.len() as u64 == attempts("claim", "ok") + 1
    ));
}

#[test]
fn batch_failures_are_counted_by_kind() {
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "m1", "body": "{not json", "eventSource": "aws:sqs"},
        {"messageId": "m2", "body": "{\"id\": \"1\"}", "eventSource": "aws:sqs"},
        {"messageId": "m3", "body": "{\"id\": \"2\"}", "eventSource": "aws:sqs"},
    ]}))
    .unwrap();
    let all = recorded(|| async move {
        let response = SqsBatch::new()
            .run_json(
                LambdaEvent::new(event, Context::default()),
                |job: Value, _| async move {
                    if job["id"] == "2" {
                        Err::<(), _>("the handler failed")
                    } else {
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        assert_eq!(response.batch_item_failures.len(), 2);
    });
    assert_eq!(
        counter(&all, BATCH_FAILURES, &[("kind", "malformed_body")]),
        1
    );
    assert_eq!(counter(&all, BATCH_FAILURES, &[("kind", "error")]), 1);
    assert_eq!(
        all.keys()
            .filter(|(name, _)| name == BATCH_FAILURES)
            .count(),
        2,
        "no other kind"
    );
}

#[test]
fn a_stream_record_that_waited_out_a_lease_is_counted_once_by_its_final_answer() {
    // The in-progress alarm means "handed back": a record that waited for another
    // worker's lease and then ran was never handed back.
    let all = recorded(|| async {
        let store = MemoryStore::new();
        let elsewhere = Idempotency::builder(store.clone())
            .lease(Duration::from_secs(1))
            .build();
        let here = Idempotency::new(store);
        let op = Operation::new("job", KeyStrategy::field("id"));
        let busy = json!({"id": "busy"});
        let hanging = elsewhere.execute(&op, &busy, std::future::pending::<Result<(), String>>);
        let batch = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut event = KinesisEvent::default();
            let mut record = KinesisEventRecord::default();
            record.event_source = Some("aws:kinesis".into());
            record.kinesis.sequence_number = "1".into();
            record.kinesis.data.0 = br#"{"id": "busy"}"#.to_vec();
            event.records = vec![record];
            let mut context = Context::default();
            let deadline = SystemTime::now() + Duration::from_secs(3);
            context.deadline = deadline
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            KinesisBatch::new()
                .wait_for_in_progress(Some(Duration::from_millis(500)))
                .report_json(LambdaEvent::new(event, context), |job: Value, _| {
                    let (here, op) = (&here, &op);
                    async move {
                        // A call that runs before the wait: counted though its attempt is not.
                        let first = json!({"id": "first"});
                        let ok = || async { Ok::<_, lambda_runtime::Error>(()) };
                        here.execute(op, &first, ok)
                            .await
                            .map_err(ExecuteError::into_inner)?;
                        here.execute(op, &job, ok)
                            .await
                            .map(|(_, outcome)| outcome)
                            .map_err(ExecuteError::into_inner)
                    }
                })
                .await
        };
        tokio::select! {
            _ = hanging => unreachable!("it hangs"),
            report = batch => assert_eq!(
                report.records[0].result.as_ref().ok(),
                Some(&lambda_idempotency::Outcome::TookOver)
            ),
        }
    });
    assert_eq!(
        outcomes(&all),
        BTreeMap::from([
            ("cancelled".into(), 1),
            ("executed".into(), 1),
            ("replayed".into(), 1),
            ("took_over".into(), 1)
        ]),
        "the waiting call once, by its answer; the call before it each time it was made; the hanging call elsewhere as cancelled"
    );
}

#[test]
fn a_record_cut_by_the_deadline_counts_what_its_calls_did() {
    // Its first call executed; its second never answers; the batch answers at its
    // deadline and the record is unfinished: the executed call is counted all the same.
    let all = recorded(|| async {
        let idempotency = Idempotency::new(MemoryStore::new());
        let op = Operation::new("job", KeyStrategy::field("id"));
        let event: SqsEvent = serde_json::from_value(json!({"Records": [
            {"messageId": "m1", "body": "{}", "eventSource": "aws:sqs"},
        ]}))
        .unwrap();
        let mut context = Context::default();
        let deadline = SystemTime::now() + Duration::from_millis(1500);
        context.deadline = deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let report = SqsBatch::new()
            .report_json(LambdaEvent::new(event, context), |_: Value, _| {
                let (idempotency, op) = (&idempotency, &op);
                async move {
                    let ok = || async { Ok::<_, lambda_runtime::Error>(()) };
                    idempotency
                        .execute(op, &json!({"id": "first"}), ok)
                        .await
                        .map_err(ExecuteError::into_inner)?;
                    std::future::pending::<()>().await;
                    Ok::<_, lambda_runtime::Error>(())
                }
            })
            .await;
        assert!(report.records[0].result.is_err(), "cut by the deadline");
    });
    assert_eq!(
        outcomes(&all),
        BTreeMap::from([("executed".into(), 1)]),
        "the executed call counted though its record never answered"
    );
}

/// Records the fields of every `idempotency` span, as text.
#[derive(Clone, Default)]
struct SpanFields(std::sync::Arc<std::sync::Mutex<Vec<BTreeMap<String, String>>>>);

struct Visit<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Visit<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S> tracing_subscriber::Layer<S> for SpanFields
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if matches!(attrs.metadata().name(), "idempotency" | "handler") {
            let mut fields = BTreeMap::new();
            attrs.record(&mut Visit(&mut fields));
            let mut all = self.0.lock().unwrap();
            all.push(fields);
            ctx.span(id).unwrap().extensions_mut().insert(all.len() - 1);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let span = ctx.span(id).unwrap();
        if let Some(index) = span.extensions().get::<usize>() {
            values.record(&mut Visit(&mut self.0.lock().unwrap()[*index]));
        }
    }
}

#[test]
fn the_span_carries_the_key_the_outcome_and_each_store_requests_time() {
    use tracing_subscriber::layer::SubscriberExt;
    let fields = SpanFields::default();
    let subscriber = tracing_subscriber::registry().with(fields.clone());
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let idempotency = Idempotency::new(MemoryStore::new());
                let op = Operation::new("send", KeyStrategy::field("id"));
                for _ in 0..2 {
                    let answer: Result<String, lambda_idempotency::Error> = idempotency
                        .run(&op, &json!({"id": "k-1"}), || async {
                            Ok("done".to_owned())
                        })
                        .await;
                    answer.unwrap();
                }
            });
    });
    let spans = fields.0.lock().unwrap().clone();
    assert_eq!(spans.len(), 2);
    let (first, second) = (&spans[0], &spans[1]);
    assert_eq!(first["operation"], "send");
    assert!(first["key"].ends_with("#k-1"), "{first:?}");
    assert_eq!(
        (first["outcome"].as_str(), second["outcome"].as_str()),
        ("executed", "replayed")
    );
    for field in ["claim_ms", "complete_ms"] {
        let ms: f64 = first[field].parse().unwrap();
        assert!((0.0..1000.0).contains(&ms), "{field} = {ms}");
    }
    assert!(second.contains_key("claim_ms") && !second.contains_key("complete_ms"));
}

// ---- Hostile review (issue 20) ----

/// One HTTP request that waits for its twin elsewhere and is answered with the twin's
/// stored response is one call: counted once, as a replay. Today the layer's first
/// `execute_inner` counts `in_progress` (which the SAM in-progress alarm sums), the replay
/// found by the wait is never counted, and a wait that finds the key released runs the
/// handler and counts a second outcome for the same request.
#[test]
fn an_http_request_that_waits_for_its_twin_is_counted_once_by_its_answer() {
    use lambda_http::tower::{Service, ServiceBuilder, service_fn};
    use lambda_http::{Body, Request, Response};
    use lambda_idempotency::http::{CallerScope, IdempotencyKeyLayer};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let all = recorded(|| async move {
        let store = FaultyStore::new(MemoryStore::new());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let app = {
            let (gate, calls) = (gate.clone(), calls.clone());
            service_fn(move |request: Request| {
                let (gate, calls) = (gate.clone(), calls.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if request.headers().contains_key("x-gate") {
                        gate.acquire().await.unwrap().forget();
                    }
                    let status = request
                        .headers()
                        .get("x-status")
                        .map_or(200, |v| v.to_str().unwrap().parse().unwrap());
                    Ok::<_, lambda_http::Error>(
                        Response::builder()
                            .status(status)
                            .body(Body::from("done"))
                            .unwrap(),
                    )
                }
            })
        };
        let build = |wait: Option<Duration>| {
            let idempotency = Idempotency::builder(store.clone())
                .function_name("fn")
                .build();
            let mut builder = IdempotencyKeyLayer::builder(idempotency, "generate")
                .scope(CallerScope::unscoped());
            if let Some(wait) = wait {
                builder = builder.wait_for_in_progress(wait);
            }
            ServiceBuilder::new()
                .layer(builder.build().unwrap())
                .service(app.clone())
        };
        let here = build(None);
        let elsewhere = build(Some(Duration::from_secs(10)));
        let request = |key: &str, status: Option<&str>| {
            let mut r = lambda_http::http::Request::builder()
                .method("POST")
                .uri("/x")
                .header("idempotency-key", key);
            if let Some(status) = status {
                r = r.header("x-status", status).header("x-gate", "1");
            }
            r.body(Body::from("{}")).unwrap()
        };
        // k-1: the twin waits, then replays the first's response.
        // k-2: the first answers 503 (released), the waiting twin then runs the handler.
        for (key, first_status, twin_status) in
            [("k-1", Some("200"), 200), ("k-2", Some("503"), 200)]
        {
            let before = calls.load(Ordering::SeqCst);
            let first = tokio::spawn({
                let mut here = here.clone();
                let request = request(key, first_status);
                async move { here.call(request).await.unwrap() }
            });
            while calls.load(Ordering::SeqCst) == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let twin = tokio::spawn({
                let mut elsewhere = elsewhere.clone();
                let request = request(key, None);
                async move { elsewhere.call(request).await.unwrap() }
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            gate.add_permits(1);
            first.await.unwrap();
            assert_eq!(twin.await.unwrap().status().as_u16(), twin_status);
        }
    });
    // Four requests, four answers: k-1 executed + replayed; k-2 failed (503) + executed.
    let expected: BTreeMap<String, u64> = [("executed", 2), ("replayed", 1), ("failed", 1)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(outcomes(&all), expected);
}

/// A call whose function panics is a call: it is counted (as failed, or a kind of its
/// own). Today the counter is incremented after the awaited future returns, so a panic
/// unwinding through `execute_inner` leaves no count, while its claim was counted in the
/// store requests.
#[test]
fn a_call_whose_function_panics_is_counted() {
    let all = recorded(|| async move {
        let idempotency = Idempotency::builder(MemoryStore::new())
            .function_name("fn")
            .build();
        let op = Operation::new("send", KeyStrategy::field("id"));
        let call = tokio::spawn(async move {
            let _: Result<String, lambda_idempotency::Error> = idempotency
                .run(&op, &json!({"id": "p"}), || async {
                    panic!("the function panicked")
                })
                .await;
        });
        assert!(call.await.unwrap_err().is_panic());
    });
    assert_eq!(
        counter(
            &all,
            STORE_REQUESTS,
            &[
                ("store", "memory"),
                ("operation", "claim"),
                ("result", "ok")
            ]
        ),
        1,
        "the claim was made"
    );
    assert_eq!(
        outcomes(&all).values().sum::<u64>(),
        1,
        "{:?}",
        outcomes(&all)
    );
}

/// A call cut off by its caller (a timeout around it, a batch answering at its deadline)
/// after its claim: the claim is counted, the call never is.
#[test]
fn a_call_cut_off_after_its_claim_is_counted() {
    let all = recorded(|| async move {
        let idempotency = Idempotency::builder(MemoryStore::new())
            .function_name("fn")
            .build();
        let op = Operation::new("send", KeyStrategy::field("id"));
        let payload = json!({"id": "t"});
        let call = idempotency.execute(&op, &payload, || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, String>(1u8)
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
    });
    assert_eq!(
        outcomes(&all).values().sum::<u64>(),
        1,
        "{:?}",
        outcomes(&all)
    );
}

/// The span fields are recorded on `Span::current()`: when the `idempotency` span is
/// filtered out (`RUST_LOG=info,lambda_idempotency=warn`), the current span is the
/// caller's, and the library writes the idempotency key and its timings into the
/// caller's own fields of the same names.
#[test]
fn with_the_idempotency_span_filtered_out_the_callers_span_is_left_alone() {
    use tracing::Instrument;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    let fields = SpanFields::default();
    let filter =
        tracing_subscriber::filter::filter_fn(|m| !m.target().starts_with("lambda_idempotency"));
    let subscriber = tracing_subscriber::registry().with(fields.clone().with_filter(filter));
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let idempotency = Idempotency::new(MemoryStore::new());
                let op = Operation::new("send", KeyStrategy::field("id"));
                let span = tracing::info_span!(
                    "handler",
                    key = tracing::field::Empty,
                    claim_ms = tracing::field::Empty
                );
                let answer: Result<String, lambda_idempotency::Error> = idempotency
                    .run(&op, &json!({"id": "secret-key"}), || async {
                        Ok("done".to_owned())
                    })
                    .instrument(span)
                    .await;
                answer.unwrap();
            });
    });
    let spans = fields.0.lock().unwrap().clone();
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert!(
        !spans[0].contains_key("key") && !spans[0].contains_key("claim_ms"),
        "the caller's span was written to: {:?}",
        spans[0]
    );
}

/// A delivery that finds an at-most-once key's crashed claim is counted as
/// `claim_abandoned` (what the template's alarm watches), once per delivery.
#[test]
fn an_abandoned_claim_is_counted_as_claim_abandoned() {
    let all = recorded(|| async move {
        let idempotency = Idempotency::builder(MemoryStore::new())
            .function_name("fn")
            .build();
        let op = Operation::new("pay", KeyStrategy::field("id"))
            .at_most_once()
            .lease(Duration::from_secs(1));
        let payload = json!({"id": "p"});
        let crashed = idempotency.run(&op, &payload, || async {
            std::future::pending::<Result<(), lambda_idempotency::Error>>().await
        });
        let _ = tokio::time::timeout(Duration::from_millis(20), crashed).await;
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for _ in 0..2 {
            let again: Result<(), lambda_idempotency::Error> =
                idempotency.run(&op, &payload, || async { Ok(()) }).await;
            assert!(matches!(
                again,
                Err(lambda_idempotency::Error::ClaimAbandoned { .. })
            ));
        }
    });
    assert_eq!(
        counter(
            &all,
            OUTCOMES,
            &[
                ("function", "fn"),
                ("operation", "pay"),
                ("outcome", "claim_abandoned")
            ]
        ),
        2
    );
}

/// One operation used by the handles of two functions (a shared `static`, as the macro
/// keeps one) counts each call under its own handle's function, never the first's.
#[test]
fn an_operation_shared_by_two_functions_counts_each_under_its_own_name() {
    let op = Operation::new("send", KeyStrategy::field("id"));
    let all = recorded(|| {
        let op = op.clone();
        async move {
            for function in ["first", "second", "first", "second", "second"] {
                let idempotency = Idempotency::builder(MemoryStore::new())
                    .function_name(function)
                    .build();
                idempotency
                    .execute(&op, &json!({"id": "a"}), || async { Ok::<_, String>(1u8) })
                    .await
                    .unwrap();
            }
        }
    });
    let executed = |function| {
        counter(
            &all,
            OUTCOMES,
            &[
                ("function", function),
                ("operation", "send"),
                ("outcome", "executed"),
            ],
        )
    };
    assert_eq!((executed("first"), executed("second")), (2, 3));
    let series = all.keys().filter(|(name, _)| name == OUTCOMES).count();
    assert_eq!(series, 2, "one series per function, nothing else: {all:?}");
}

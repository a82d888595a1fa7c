//! The metrics feature: a known mix of calls counted by a recorder in the test
//! (metrics-util's `DebuggingRecorder`, local to this thread, so each test runs on a
//! current-thread runtime), and the tracing span's fields, read by a layer in the test.
#![cfg(feature = "metrics")]

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::metrics::{
    BATCH_FAILURES, OUTCOMES, STORE_REQUEST_SECONDS, STORE_REQUESTS,
};
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::{Claim, IdempotencyStore, StoreOp};
use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, SqsBatch};
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
        if attrs.metadata().name() == "idempotency" {
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

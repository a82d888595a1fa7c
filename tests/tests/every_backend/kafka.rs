//! The model worker behind a Kafka event source mapping (Amazon MSK), over every store and
//! a real local HTTP provider: duplicates across offsets and partitions call the provider
//! once, a poison record costs only itself, and a worker that dies after its call is
//! taken over.

use super::redelivery::setup;
use lambda_idempotency::store::epoch_millis;
use lambda_idempotency::{FailureKind, KafkaEvent};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};
use test_support::stores::Backend;

const KAFKA: &str = include_str!("../../../events/kafka-batch.json");

/// The sample's records of `partition` at `offsets` (all partitions when `None`).
fn deliver(pick: Option<(&str, &[usize])>, deadline: Duration) -> LambdaEvent<KafkaEvent> {
    let mut event: Value = serde_json::from_str(KAFKA).unwrap();
    if let Some((partition, indexes)) = pick {
        let records = event["records"][partition].as_array().unwrap().clone();
        let kept: Vec<Value> = indexes.iter().map(|i| records[*i].clone()).collect();
        event["records"] = json!({ partition: kept });
    }
    let mut context = Context::default();
    context.deadline = epoch_millis(SystemTime::now() + deadline);
    LambdaEvent::new(serde_json::from_value(event).unwrap(), context)
}

async fn a_kafka_batch_calls_once_per_request_and_names_the_poison_offset(backend: Backend) {
    let s = setup(backend, "kafka-batch").await;
    // Through `handle_any`, as deployed: the source read off `eventSource`.
    let event = deliver(None, Duration::from_secs(30));
    let payload = serde_json::to_value(&event.payload).unwrap();
    let response = s
        .worker
        .handle_any(LambdaEvent::new(payload, event.context))
        .await
        .unwrap();
    assert_eq!(
        response,
        json!({"batchItemFailures": [{"itemIdentifier": {"partition": "model-requests-0", "offset": 16}}]})
    );
    // Two requests ran; the re-send in the other partition did not call again.
    assert_eq!(s.provider.completion_calls(), 2);
    // The batch again, as Lambda resends it: everything replayed, no call.
    let again = s
        .worker
        .process_kafka(deliver(None, Duration::from_secs(30)))
        .await;
    assert_eq!(s.provider.completion_calls(), 2);
    let failed: Vec<_> = again
        .records
        .iter()
        .filter_map(|r| {
            r.result
                .as_ref()
                .err()
                .map(|f| (r.item_id.clone().unwrap(), f.kind))
        })
        .collect();
    assert_eq!(
        failed,
        vec![("model-requests-0@16".to_owned(), FailureKind::MalformedBody)]
    );
    assert_eq!(again.skipped.len(), 1, "the tombstone");
}

async fn a_worker_that_dies_after_its_kafka_call_is_taken_over_after_its_lease(backend: Backend) {
    let s = setup(backend, "kafka-dies").await;
    s.provider.set_delay(Duration::from_secs(3));
    let first = Some(("model-requests-0", &[0usize][..]));
    let dying = s
        .worker
        .process_kafka(deliver(first, Duration::from_millis(2500)));
    let dropped = tokio::time::timeout(Duration::from_millis(700), dying).await;
    assert!(dropped.is_err(), "the worker died mid-call");
    assert_eq!(s.provider.completion_calls(), 1);
    s.provider.set_delay(Duration::ZERO);
    // The re-send in the other partition, while the lease lives: in progress, reported.
    let resend = Some(("model-requests-1", &[0usize][..]));
    let early = s
        .worker
        .process_kafka(deliver(resend, Duration::from_secs(1)))
        .await;
    assert_eq!(
        early.records[0].result.as_ref().unwrap_err().kind,
        FailureKind::InProgress
    );
    tokio::time::sleep(Duration::from_millis(1900)).await;
    let next = s
        .worker
        .process_kafka(deliver(first, Duration::from_secs(30)))
        .await;
    assert!(
        next.records[0]
            .result
            .as_ref()
            .expect("taken over")
            .called_model
    );
    assert_eq!(s.provider.completion_calls(), 2);
    let replay = s
        .worker
        .process_kafka(deliver(resend, Duration::from_secs(30)))
        .await;
    assert!(!replay.records[0].result.as_ref().unwrap().called_model);
    assert_eq!(s.provider.completion_calls(), 2);
}

test_support::every_backend!(
    a_kafka_batch_calls_once_per_request_and_names_the_poison_offset,
    a_worker_that_dies_after_its_kafka_call_is_taken_over_after_its_lease,
);

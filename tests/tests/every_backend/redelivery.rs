//! The model worker under every kind of redelivery, over every store and a real local
//! HTTP provider. Each test asserts the provider's request log: one call, not one result
//! row.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::epoch_millis;
use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::{FailureKind, Idempotency};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{ModelClient, Worker};
use provider_stub::ProviderStub;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use test_support::stores::{Backend, TestStore};

const SINGLE: &str = include_str!("../../../events/single-request.json");
const SAME_MESSAGE_AGAIN: &str = include_str!("../../../events/same-message-twice.json");
const PRODUCER_DUPLICATE: &str = include_str!("../../../events/producer-duplicate-send.json");
const HASH_ALIKE: &str = include_str!("../../../events/hash-alike-retry.json");
const POISON: &str = include_str!("../../../events/poison-batch-of-ten.json");
const FIFO: &str = include_str!("../../../events/fifo-two-groups.json");

pub(crate) struct Setup {
    /// Held while the test runs: no chaos run meanwhile.
    _shared: tokio::sync::RwLockReadGuard<'static, ()>,
    /// The store, as a user builds it.
    pub(crate) test_store: TestStore,
    /// The store as the worker sees it: its requests are counted.
    pub(crate) store: FaultyStore<Arc<dyn IdempotencyStore>>,
    pub(crate) provider: ProviderStub,
    pub(crate) worker: Worker,
}

/// The model worker over `backend`'s store (its requests counted) and a provider stand-in.
pub(crate) async fn setup(backend: Backend, test: &str) -> Setup {
    let shared = super::MACHINE.read().await;
    let test_store = TestStore::open(backend, test).await;
    let store = FaultyStore::new(test_store.store.clone());
    let provider = ProviderStub::start().await.expect("provider stub");
    let idempotency = Idempotency::builder(store.clone())
        .function_name("model-worker")
        .build();
    let model = ModelClient::new(&provider.base_url(), Some("test-key".into())).unwrap();
    Setup {
        _shared: shared,
        test_store,
        store,
        provider,
        worker: Worker::new(idempotency, model),
    }
}

/// An invocation of `records` (all records of `fixture`, or those at `pick`) with a deadline.
pub(crate) fn invocation(
    fixture: &str,
    pick: Option<&[usize]>,
    deadline: Duration,
) -> LambdaEvent<SqsEvent> {
    let mut event: SqsEvent = serde_json::from_str(fixture).expect("fixture");
    if let Some(pick) = pick {
        event.records = pick.iter().map(|i| event.records[*i].clone()).collect();
    }
    let mut context = Context::default();
    context.deadline = epoch_millis(SystemTime::now() + deadline);
    LambdaEvent::new(event, context)
}

fn deliver(fixture: &str) -> LambdaEvent<SqsEvent> {
    invocation(fixture, None, Duration::from_secs(30))
}

pub(crate) fn failures(response: &SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

async fn the_same_message_delivered_twice_calls_the_provider_once(backend: Backend) {
    let s = setup(backend, "same-message").await;
    let first = s.worker.handle(deliver(SINGLE)).await.unwrap();
    let second = s.worker.handle(deliver(SAME_MESSAGE_AGAIN)).await.unwrap();
    assert!(
        failures(&first).is_empty() && failures(&second).is_empty(),
        "both deliveries succeed"
    );
    assert_eq!(s.provider.completion_calls(), 1);
    let request = &s.provider.requests()[0];
    assert_eq!(request.authorization.as_deref(), Some("Bearer test-key"));
    assert_eq!(
        request.body,
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Summarise document 4471 at version 9."}
            ],
            "temperature": 0.2,
            "max_tokens": 64
        }),
        "exactly the contract's fields reach the provider"
    );
}

async fn a_producers_duplicate_send_calls_the_provider_once(backend: Backend) {
    let s = setup(backend, "producer-duplicate").await;
    for record in [0, 1] {
        let report = s
            .worker
            .process(invocation(
                PRODUCER_DUPLICATE,
                Some(&[record]),
                Duration::from_secs(30),
            ))
            .await;
        let delivery = report.records[0]
            .result
            .as_ref()
            .expect("delivery succeeds");
        assert_eq!(delivery.called_model, record == 0);
    }
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn both_copies_of_a_send_in_one_batch_wait_for_one_slow_call(backend: Backend) {
    // The producer's re-send lands next to the original, and the model takes 2 s: the
    // copy waits for its twin in the same invocation instead of being handed back to SQS.
    let s = setup(backend, "twins-in-a-batch").await;
    s.provider.set_delay(Duration::from_secs(2));
    s.store.reset_requests();
    let started = std::time::Instant::now();
    let response = s.worker.handle(deliver(PRODUCER_DUPLICATE)).await.unwrap();
    assert!(failures(&response).is_empty(), "both acked: {response:?}");
    assert_eq!(
        s.provider.completion_calls(),
        1,
        "one call in the provider's log"
    );
    assert_eq!(
        (s.store.requests(StoreOp::Claim), s.store.total_requests()),
        (1, 2),
        "one claim and one completion: the twin asked the store nothing"
    );
    // Both settled with the call, long before an 8 s visibility timeout could pass.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    let report = s.worker.process(deliver(PRODUCER_DUPLICATE)).await;
    assert!(
        report
            .records
            .iter()
            .all(|r| matches!(&r.result, Ok(d) if !d.called_model)),
        "a later delivery of both is replayed"
    );
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn requests_without_an_id_that_hash_alike_call_the_provider_once(backend: Backend) {
    let s = setup(backend, "hash-alike").await;
    for record in [0, 1] {
        let response = s
            .worker
            .handle(invocation(
                HASH_ALIKE,
                Some(&[record]),
                Duration::from_secs(30),
            ))
            .await
            .unwrap();
        assert!(failures(&response).is_empty());
    }
    assert_eq!(
        s.provider.completion_calls(),
        1,
        "0.7 and 0.70, other submitted_at: one key"
    );
}

async fn a_redelivery_during_the_call_is_handed_back_then_replayed(backend: Backend) {
    let s = setup(backend, "during-call").await;
    s.provider.set_delay(Duration::from_millis(800));
    let first = {
        let worker = s.worker.clone();
        tokio::spawn(async move { worker.handle(deliver(SINGLE)).await.unwrap() })
    };
    s.provider.wait_for_requests(1).await;

    let second = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    let failure = second.records[0]
        .result
        .as_ref()
        .expect_err("handed back while in progress");
    assert_eq!(failure.kind, FailureKind::InProgress, "{}", failure.reason);
    assert_eq!(
        s.provider.completion_calls(),
        1,
        "the second delivery made no call"
    );

    assert!(failures(&first.await.unwrap()).is_empty());
    let third = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    let delivery = third.records[0]
        .result
        .as_ref()
        .expect("the third delivery replays");
    assert!(!delivery.called_model);
    assert_eq!(
        delivery.completion["choices"][0]["message"]["content"],
        "stub completion #1 for: Summarise document 4471 at version 9."
    );
    assert_eq!(s.provider.completion_calls(), 1, "one call in total");
}

async fn a_lost_acknowledgement_replays_the_whole_batch(backend: Backend) {
    let s = setup(backend, "lost-ack").await;
    let first = s.worker.handle(deliver(POISON)).await.unwrap();
    assert_eq!(s.provider.completion_calls(), 9);
    s.store.reset_requests();
    // The batch succeeded but the ack was lost: SQS delivers all ten again.
    let again = s.worker.handle(deliver(POISON)).await.unwrap();
    assert_eq!(failures(&again), failures(&first));
    assert_eq!(s.provider.completion_calls(), 9, "replayed, no call");
    assert_eq!(
        s.store.requests(StoreOp::Claim),
        9,
        "one request per replay"
    );
    assert_eq!(s.store.total_requests(), 9, "and nothing else");
}

async fn a_worker_that_dies_mid_call_is_taken_over_after_its_lease(backend: Backend) {
    let s = setup(backend, "dies-mid-call").await;
    s.provider.set_delay(Duration::from_secs(3));
    // The invocation's deadline is the lease: 2.5 s from now.
    let dying = s
        .worker
        .handle(invocation(SINGLE, None, Duration::from_millis(2500)));
    let dropped = tokio::time::timeout(Duration::from_millis(700), dying).await;
    assert!(
        dropped.is_err(),
        "the worker died mid-call (its future was dropped)"
    );
    assert_eq!(
        s.provider.completion_calls(),
        1,
        "it had called the provider"
    );

    s.provider.set_delay(Duration::ZERO);
    let early = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    assert_eq!(
        early.records[0].result.as_ref().unwrap_err().kind,
        FailureKind::InProgress
    );

    tokio::time::sleep(Duration::from_millis(1900)).await;
    let next = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    let delivery = next.records[0]
        .result
        .as_ref()
        .expect("the next delivery takes over");
    assert!(delivery.called_model);
    assert_eq!(
        s.provider.completion_calls(),
        2,
        "the dead worker's call and the takeover's"
    );
    let replay = s.worker.process(deliver(SINGLE)).await;
    assert!(
        !replay.records[0].result.as_ref().unwrap().called_model,
        "the job is done, not lost"
    );
}

async fn the_same_key_with_a_different_payload_is_refused(backend: Backend) {
    let s = setup(backend, "mismatch").await;
    let first = s.worker.handle(deliver(SINGLE)).await.unwrap();
    assert!(first.batch_item_failures.is_empty());
    let mut event: Value = serde_json::from_str(SINGLE).unwrap();
    let body = event["Records"][0]["body"]
        .as_str()
        .unwrap()
        .replace("version 9", "version 10");
    event["Records"][0]["body"] = json!(body);
    event["Records"][0]["messageId"] = json!("another-message");
    let report = s
        .worker
        .process(invocation(
            &event.to_string(),
            None,
            Duration::from_secs(30),
        ))
        .await;
    let failure = report.records[0].result.as_ref().expect_err("refused");
    assert_eq!(failure.kind, FailureKind::Rejected);
    assert!(
        failure
            .reason
            .contains("already used with a different payload"),
        "{}",
        failure.reason
    );
    assert!(
        !failure.reason.contains("stub completion"),
        "the first result is not returned"
    );
    assert_eq!(s.provider.completion_calls(), 1, "no call for the mismatch");
}

async fn a_poison_body_fails_only_its_record(backend: Backend) {
    let s = setup(backend, "poison").await;
    let response = s.worker.handle(deliver(POISON)).await.unwrap();
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({"batchItemFailures": [{"itemIdentifier": "06a7c4e2-0000-4000-8000-000000000006"}]})
    );
    assert_eq!(s.provider.completion_calls(), 9, "nine succeed");
}

async fn a_fifo_poison_message_fails_alone_and_a_transient_failure_holds_back_its_group(
    backend: Backend,
) {
    let s = setup(backend, "fifo").await;
    let response = s.worker.handle(deliver(FIFO)).await.unwrap();
    assert_eq!(
        failures(&response),
        vec!["f1f00000-aaaa-4bbb-8ccc-dddddddddd00"],
        "customer-17's first request can never be sent: its second runs now"
    );
    assert_eq!(s.provider.completion_calls(), 3, "every valid request ran");

    // A provider error a retry can fix stops customer-42's group at its first message.
    let s = setup(backend, "fifo-transient").await;
    s.provider.fail_next(1);
    let response = s
        .worker
        .handle(invocation(FIFO, Some(&[1, 3]), Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        failures(&response),
        vec![
            "f1f01000-aaaa-4bbb-8ccc-dddddddddd01",
            "f1f03000-aaaa-4bbb-8ccc-dddddddddd03"
        ],
        "the group's second message waits for its first"
    );
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn a_provider_error_releases_the_record_and_the_next_delivery_calls_again(backend: Backend) {
    let s = setup(backend, "provider-error").await;
    s.provider.fail_next(1);
    let report = s.worker.process(deliver(SINGLE)).await;
    let failure = report.records[0]
        .result
        .as_ref()
        .expect_err("the item fails");
    assert!(failure.reason.contains("HTTP 500"), "{}", failure.reason);
    assert_eq!(
        s.store.requests(StoreOp::Release),
        1,
        "the record was released"
    );
    let next = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    assert!(next.records[0].result.as_ref().unwrap().called_model);
    assert_eq!(s.provider.completion_calls(), 2);
}

async fn a_provider_refusal_is_stored_and_costs_one_call_however_often_it_comes_back(
    backend: Backend,
) {
    let s = setup(backend, "provider-refusal").await;
    let mut event: Value = serde_json::from_str(SINGLE).unwrap();
    let mut body: Value =
        serde_json::from_str(event["Records"][0]["body"].as_str().unwrap()).unwrap();
    body["messages"][1]["content"] = json!("Summarise this. [[status=400]]");
    event["Records"][0]["body"] = json!(body.to_string());
    let fixture = event.to_string();
    for delivery in 1..=4 {
        let report = s.worker.process(deliver(&fixture)).await;
        let failure = report.records[0].result.as_ref().expect_err("refused");
        assert_eq!(
            failure.kind,
            FailureKind::Permanent,
            "delivery {delivery}: {failure}"
        );
        assert!(failure.reason.contains("HTTP 400"), "{}", failure.reason);
    }
    assert_eq!(s.provider.completion_calls(), 1, "the refusal was stored");
    assert_eq!(
        s.store.requests(StoreOp::Release),
        0,
        "not released: stored"
    );
}

async fn a_provider_that_never_answers_is_cut_off_before_the_deadline(backend: Backend) {
    let s = setup(backend, "provider-hangs").await;
    s.provider.set_delay(Duration::from_secs(30));
    let started = std::time::Instant::now();
    let response = s
        .worker
        .handle(invocation(SINGLE, None, Duration::from_millis(2500)))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "answered before the deadline, after {:?}",
        started.elapsed()
    );
    assert_eq!(failures(&response).len(), 1, "the record is handed back");
    assert_eq!(s.provider.completion_calls(), 1);
    // The claim was released: the next delivery asks again at once.
    s.provider.set_delay(Duration::ZERO);
    let next = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    assert!(next.records[0].result.as_ref().unwrap().called_model);
}

/// The store drops the worker's connection while the provider is answering (a server
/// restart, a failover, an idle timeout after a freeze): the completion goes out on a new
/// connection, and a duplicate replays it. One provider call.
async fn a_store_connection_dropped_mid_call_still_completes_once(backend: Backend) {
    let s = setup(backend, "connection-dropped").await;
    s.provider.set_delay(Duration::from_millis(300));
    let first = {
        let worker = s.worker.clone();
        tokio::spawn(async move { worker.handle(deliver(SINGLE)).await.unwrap() })
    };
    s.provider.wait_for_requests(1).await;
    let killed = s.test_store.kill_connections().await;
    assert_eq!(
        killed,
        matches!(backend, Backend::Redis | Backend::Postgres),
        "the backends with connections to drop"
    );
    assert!(failures(&first.await.unwrap()).is_empty(), "completed");
    let again = s.worker.process(deliver(SAME_MESSAGE_AGAIN)).await;
    assert!(!again.records[0].result.as_ref().unwrap().called_model);
    assert_eq!(s.provider.completion_calls(), 1);
}

test_support::every_backend!(
    the_same_message_delivered_twice_calls_the_provider_once,
    a_producers_duplicate_send_calls_the_provider_once,
    both_copies_of_a_send_in_one_batch_wait_for_one_slow_call,
    requests_without_an_id_that_hash_alike_call_the_provider_once,
    a_redelivery_during_the_call_is_handed_back_then_replayed,
    a_lost_acknowledgement_replays_the_whole_batch,
    a_worker_that_dies_mid_call_is_taken_over_after_its_lease,
    the_same_key_with_a_different_payload_is_refused,
    a_poison_body_fails_only_its_record,
    a_fifo_poison_message_fails_alone_and_a_transient_failure_holds_back_its_group,
    a_provider_error_releases_the_record_and_the_next_delivery_calls_again,
    a_provider_refusal_is_stored_and_costs_one_call_however_often_it_comes_back,
    a_provider_that_never_answers_is_cut_off_before_the_deadline,
    a_store_connection_dropped_mid_call_still_completes_once,
);

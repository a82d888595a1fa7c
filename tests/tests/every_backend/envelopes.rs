//! The model worker behind a queue fed by SNS or EventBridge (`REQUEST_ENVELOPE`), over
//! every store and a real local HTTP provider: two publishes of one request differ in
//! their envelopes, and the provider is called once.

use super::redelivery::{failures, invocation, setup};
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::Envelope;
use lambda_idempotency::store::epoch_millis;
use lambda_runtime::LambdaEvent;
use serde_json::json;
use std::time::{Duration, SystemTime};
use test_support::stores::Backend;

const SNS: &str = include_str!("../../../events/sns-to-sqs.json");
const EVENTBRIDGE: &str = include_str!("../../../events/eventbridge-to-sqs.json");

/// The records of `fixture` at `pick` (all when `None`), as one invocation.
fn deliver(fixture: &str, pick: Option<&[usize]>) -> LambdaEvent<SqsEvent> {
    invocation(fixture, pick, Duration::from_secs(30))
}

async fn two_sns_publishes_in_one_batch_call_the_provider_once(backend: Backend) {
    let s = setup(backend, "sns-twins").await;
    let worker = s.worker.clone().with_envelope(Envelope::sns());
    let response = worker.handle(deliver(SNS, None)).await.unwrap();
    assert!(failures(&response).is_empty(), "{:?}", failures(&response));
    assert_eq!(s.provider.completion_calls(), 1);
    // The provider saw the request, not the notification.
    let body = &s.provider.requests()[0].body;
    assert_eq!(body["model"], "gpt-4o-mini");
    assert!(body.get("MessageId").is_none());
}

async fn sns_publishes_in_separate_batches_call_the_provider_once(backend: Backend) {
    let s = setup(backend, "sns-apart").await;
    let worker = s.worker.clone().with_envelope(Envelope::sns());
    for record in [0, 1, 1] {
        let response = worker.handle(deliver(SNS, Some(&[record]))).await.unwrap();
        assert!(failures(&response).is_empty(), "publish {record}");
    }
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn eventbridge_deliveries_call_the_provider_once(backend: Backend) {
    let s = setup(backend, "eventbridge").await;
    let worker = s.worker.clone().with_envelope(Envelope::eventbridge());
    for pick in [&[0usize][..], &[1], &[0, 1]] {
        let response = worker
            .handle(deliver(EVENTBRIDGE, Some(pick)))
            .await
            .unwrap();
        assert!(failures(&response).is_empty(), "{pick:?}");
    }
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn a_body_that_is_no_notification_fails_alone_and_never_reaches_the_provider(
    backend: Backend,
) {
    let s = setup(backend, "sns-poison").await;
    let worker = s.worker.clone().with_envelope(Envelope::sns());
    let mut event = deliver(SNS, Some(&[0]));
    let mut poison = event.payload.records[0].clone();
    poison.message_id = Some("poison".into());
    // The request itself, not wrapped: raw message delivery turned on by mistake.
    poison.body = Some(json!({"model": "gpt-4o-mini", "messages": []}).to_string());
    event.payload.records.insert(0, poison);
    let report = worker.process(event).await;
    let kinds: Vec<_> = report
        .records
        .iter()
        .map(|r| r.result.as_ref().err().map(|f| f.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![Some(lambda_idempotency::FailureKind::MalformedBody), None]
    );
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn a_worker_that_dies_after_its_call_is_taken_over_by_the_next_publish(backend: Backend) {
    let s = setup(backend, "sns-dies").await;
    let worker = s.worker.clone().with_envelope(Envelope::sns());
    s.provider.set_delay(Duration::from_secs(3));
    let mut dying_event = deliver(SNS, Some(&[0]));
    dying_event.context.deadline = epoch_millis(SystemTime::now() + Duration::from_millis(2500));
    let dropped =
        tokio::time::timeout(Duration::from_millis(700), worker.handle(dying_event)).await;
    assert!(dropped.is_err(), "the worker died mid-call");
    assert_eq!(s.provider.completion_calls(), 1);
    s.provider.set_delay(Duration::ZERO);
    // The second publish while the lease lives: handed back for redelivery.
    let early = worker.handle(deliver(SNS, Some(&[1]))).await.unwrap();
    assert_eq!(failures(&early).len(), 1);
    tokio::time::sleep(Duration::from_millis(1900)).await;
    let next = worker.handle(deliver(SNS, Some(&[1]))).await.unwrap();
    assert!(failures(&next).is_empty(), "taken over after the lease");
    assert_eq!(
        s.provider.completion_calls(),
        2,
        "the dead worker's call and the takeover's"
    );
    let replay = worker.handle(deliver(SNS, Some(&[0]))).await.unwrap();
    assert!(failures(&replay).is_empty());
    assert_eq!(s.provider.completion_calls(), 2);
}

test_support::every_backend!(
    a_worker_that_dies_after_its_call_is_taken_over_by_the_next_publish,
    two_sns_publishes_in_one_batch_call_the_provider_once,
    sns_publishes_in_separate_batches_call_the_provider_once,
    eventbridge_deliveries_call_the_provider_once,
    a_body_that_is_no_notification_fails_alone_and_never_reaches_the_provider,
);

//! The worker's handler as a user tests theirs: `Context::default()`, the in-memory store
//! and the provider stand-in. No AWS, no Python server.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::{Idempotency, MemoryStore};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{ModelClient, Worker};
use provider_stub::ProviderStub;

fn event(fixture: &str) -> LambdaEvent<SqsEvent> {
    let payload: SqsEvent = serde_json::from_str(fixture).expect("an SQS event");
    LambdaEvent::new(payload, Context::default())
}

#[tokio::test]
async fn the_same_message_twice_calls_the_provider_once() {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let worker = Worker::new(Idempotency::new(MemoryStore::new()), model);
    let single = include_str!("../../../events/single-request.json");

    let first = worker.process(event(single)).await;
    let first = first.records[0]
        .result
        .as_ref()
        .expect("the first delivery");
    assert!(first.called_model, "the first delivery calls the model");

    let second = worker.process(event(single)).await;
    let second = second.records[0].result.as_ref().expect("the duplicate");
    assert!(!second.called_model, "the duplicate is replayed");
    assert_eq!(first.completion, second.completion, "the same completion");
    assert_eq!(
        provider.completion_calls(),
        1,
        "one call in the provider's log"
    );

    let response = worker.handle(event(single)).await.unwrap();
    assert!(response.batch_item_failures.is_empty());
}

#[tokio::test]
async fn a_request_that_cannot_be_sent_fails_its_record_with_its_reason() {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let worker = Worker::new(Idempotency::new(MemoryStore::new()), model);
    let empty = r#"{"Records": [{"messageId": "m1",
        "body": "{\"request_id\": \"r\", \"model\": \"m\", \"messages\": []}"}]}"#;
    let report = worker.process(event(empty)).await;
    let failure = report.records[0].result.as_ref().unwrap_err();
    assert!(
        failure.reason.contains("`messages` is empty"),
        "{}",
        failure.reason
    );
    assert_eq!(provider.completion_calls(), 0, "nothing was sent");
}

/// `Worker::operation()` is the operation `#[idempotent]` builds: both store under one id.
#[tokio::test]
async fn the_workers_operation_gives_the_macros_ids() {
    let provider = ProviderStub::start().await.unwrap();
    let store = MemoryStore::new();
    let idempotency = Idempotency::new(store.clone());
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let worker = Worker::new(idempotency.clone(), model);
    for body in [
        r#"{"request_id": "r-7", "model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        r#"{"model": "m", "messages": [{"role": "user", "content": "no id"}], "temperature": 0.5}"#,
    ] {
        let fixture = serde_json::json!({"Records": [{"messageId": "m1", "body": body}]});
        worker.process(event(&fixture.to_string())).await;
        let request: serde_json::Value = serde_json::from_str(body).unwrap();
        let typed: model_worker::ChatRequest = serde_json::from_value(request).unwrap();
        let id = idempotency
            .idempotency_id(&Worker::operation(), &serde_json::to_value(&typed).unwrap())
            .unwrap();
        assert!(store.record(&id).is_some(), "no record under {id}");
    }
}

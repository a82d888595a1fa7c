//! The worker's handler as a user tests theirs: `Context::default()`, the in-memory store
//! and the provider stand-in. No AWS, no Python server.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::{Idempotency, MemoryStore};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{AnswersTable, ModelClient, Worker};
use provider_stub::ProviderStub;
use serde_json::Value;

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
async fn each_answer_is_written_with_its_record_once_and_only_with_it() {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let store = MemoryStore::new();
    let worker = Worker::new(Idempotency::new(store.clone()), model)
        .with_answers(AnswersTable::Memory("answers".into()))
        .unwrap();
    let single = include_str!("../../../events/single-request.json");
    for _ in 0..3 {
        worker.process(event(single)).await.records[0]
            .result
            .as_ref()
            .expect("delivered");
    }
    assert_eq!(provider.completion_calls(), 1);
    let answers = store.table("answers");
    assert_eq!(answers.len(), 1, "one row for one request: {answers:?}");
    let (id, row) = answers.iter().next().unwrap();
    let record = store.record(id).expect("the row's id is its record's");
    assert_eq!(record.status, lambda_idempotency::store::Status::Completed);
    assert_eq!(
        serde_json::from_str::<Value>(record.data.as_deref().unwrap()).unwrap(),
        row["answer"],
        "the row holds what the record stores"
    );

    // A failed provider call writes neither.
    let failing = r#"{"Records": [{"messageId": "m2",
        "body": "{\"request_id\": \"r-5xx\", \"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"[[status=503]]\"}]}"}]}"#;
    let report = worker.process(event(failing)).await;
    assert!(report.records[0].result.is_err());
    assert_eq!(store.table("answers").len(), 1, "no row without a record");
}

#[tokio::test]
async fn a_store_that_cannot_commit_the_answers_table_fails_at_start_up() {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let redis_like =
        lambda_idempotency::store::faulty::FaultyStore::new(Renamed(MemoryStore::new()));
    let err = Worker::new(Idempotency::new(redis_like), model)
        .with_answers(AnswersTable::Memory("answers".into()))
        .unwrap_err();
    assert!(err.to_string().contains("cannot commit writes"), "{err}");
}

/// A store that is not the in-memory one (by name), holding its records in memory.
#[derive(Debug, Clone)]
struct Renamed(MemoryStore);

impl lambda_idempotency::store::IdempotencyStore for Renamed {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn claim<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<lambda_idempotency::store::ClaimOutcome, lambda_idempotency::Error>,
    > {
        self.0.claim(claim)
    }
    fn complete<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
        data: Option<&'a str>,
        expiration: std::time::SystemTime,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), lambda_idempotency::Error>> {
        self.0.complete(claim, data, expiration)
    }
    fn release<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), lambda_idempotency::Error>> {
        self.0.release(claim)
    }
    fn get<'a>(
        &'a self,
        id: &'a str,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<Option<lambda_idempotency::store::Record>, lambda_idempotency::Error>,
    > {
        self.0.get(id)
    }
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
        let _ = worker.process(event(&fixture.to_string())).await;
        let request: serde_json::Value = serde_json::from_str(body).unwrap();
        let typed: model_worker::ChatRequest = serde_json::from_value(request).unwrap();
        let id = idempotency
            .idempotency_id(&Worker::operation(), &serde_json::to_value(&typed).unwrap())
            .unwrap();
        assert!(store.record(&id).is_some(), "no record under {id}");
    }
}

/// A worker over memory and a fresh provider stand-in.
async fn worker() -> (Worker, ProviderStub) {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    (
        Worker::new(Idempotency::new(MemoryStore::new()), model),
        provider,
    )
}

/// An event of any source as the runtime hands it to `handle_any`, keeping the records at
/// `from` and after (Lambda resends a stream from the lowest reported record).
fn any_event(fixture: &str, from: usize) -> LambdaEvent<Value> {
    let mut event: Value = serde_json::from_str(fixture).unwrap();
    let records = event["Records"].as_array_mut().unwrap();
    records.drain(..from);
    LambdaEvent::new(event, Context::default())
}

fn reported(response: &Value) -> Vec<String> {
    response["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

fn sequence_numbers(fixture: &str, path: &str) -> Vec<String> {
    let event: Value = serde_json::from_str(fixture).unwrap();
    event["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.pointer(path).unwrap().as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_kinesis_batch_runs_each_request_once_and_reports_what_no_retry_fixes() {
    let (worker, provider) = worker().await;
    let fixture = include_str!("../../../events/kinesis-batch.json");
    let seq = sequence_numbers(fixture, "/kinesis/sequenceNumber");
    let response = worker.handle_any(any_event(fixture, 0)).await.unwrap();
    // The record that is not UTF-8 and the request the provider refuses (HTTP 400) fail for
    // good; the shard goes on past them; the producer's re-put of req-kinesis-1 is replayed.
    assert_eq!(reported(&response), [seq[3].clone(), seq[4].clone()]);
    assert_eq!(provider.completion_calls(), 4, "k1, k2, the refused k3, k4");

    // Lambda resends from the lowest reported record: nothing is asked again.
    let again = worker.handle_any(any_event(fixture, 3)).await.unwrap();
    assert_eq!(reported(&again), [seq[3].clone(), seq[4].clone()]);
    assert_eq!(
        provider.completion_calls(),
        4,
        "the refusal is stored, the rest replayed"
    );
}

#[tokio::test]
async fn a_dynamodb_stream_batch_runs_each_request_once() {
    let (worker, provider) = worker().await;
    let fixture = include_str!("../../../events/dynamodb-stream-batch.json");
    let seq = sequence_numbers(fixture, "/dynamodb/SequenceNumber");
    let report = worker
        .process_dynamodb(LambdaEvent::new(
            serde_json::from_str(fixture).unwrap(),
            Context::default(),
        ))
        .await;
    let reason = |i: usize| {
        report.records[i]
            .result
            .as_ref()
            .unwrap_err()
            .reason
            .clone()
    };
    assert!(reason(3).contains("expected a sequence"), "{}", reason(3));
    // The REMOVE (an expiry) is acknowledged without running.
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].item_id, Some(seq[4].clone()));
    assert!(report.records[4].result.is_ok(), "the last INSERT ran");
    let replayed = report.records[2].result.as_ref().unwrap();
    assert!(
        !replayed.called_model,
        "the MODIFY that changed nothing is replayed"
    );
    assert_eq!(provider.completion_calls(), 3);

    let response = worker.handle_any(any_event(fixture, 0)).await.unwrap();
    assert_eq!(
        reported(&response),
        [seq[3].clone()],
        "the REMOVE is no failure"
    );
    assert_eq!(
        provider.completion_calls(),
        3,
        "a redelivery asks nothing again"
    );
}

#[tokio::test]
async fn an_event_from_another_source_fails_the_invocation_naming_it() {
    let (worker, _provider) = worker().await;
    let event = serde_json::json!({"Records": [{"eventSource": "aws:s3"}]});
    let err = worker
        .handle_any(LambdaEvent::new(event, Context::default()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"aws:s3\""), "{err}");
    let empty = serde_json::json!({"Records": []});
    let ok = worker
        .handle_any(LambdaEvent::new(empty, Context::default()))
        .await
        .unwrap();
    assert_eq!(ok, serde_json::json!({"batchItemFailures": []}));
}

/// A one-message SQS event whose request asks the stand-in for `marker`.
fn asking(marker: &str) -> String {
    let body = serde_json::json!({"request_id": format!("r-{marker}"), "model": "m",
        "messages": [{"role": "user", "content": format!("hi {marker}")}]});
    serde_json::json!({"Records": [{"messageId": "m1", "body": body.to_string()}]}).to_string()
}

#[tokio::test]
async fn a_provider_refusal_costs_one_call_however_often_the_message_comes_back() {
    for (status, permanent) in [
        (400, true),
        (413, true),
        (422, true),
        // The deployment's fault (a wrong URL, a revoked key, billing): fixing it heals.
        (401, false),
        (402, false),
        (403, false),
        (404, false),
        (408, false),
        (429, false),
    ] {
        let (worker, provider) = worker().await;
        let fixture = asking(&format!("[[status={status}]]"));
        for delivery in 1..=3 {
            let report = worker.process(event(&fixture)).await;
            let failure = report.records[0].result.as_ref().unwrap_err();
            assert_eq!(
                failure.kind.is_permanent(),
                permanent,
                "{status}: {failure}"
            );
            assert!(
                failure.reason.contains(&status.to_string()),
                "{}",
                failure.reason
            );
            let calls = if permanent { 1 } else { delivery };
            assert_eq!(
                provider.completion_calls(),
                calls,
                "HTTP {status}, delivery {delivery}"
            );
        }
    }
}

#[test]
fn a_completion_stored_before_refusals_were_stored_still_reads() {
    let completion = serde_json::json!({"id": "chatcmpl-1", "choices": []});
    let answer: model_worker::Answer = serde_json::from_value(completion.clone()).unwrap();
    assert_eq!(answer, model_worker::Answer::Completion(completion));
    let refused = serde_json::json!({"provider_refused": {"status": 400, "body": "no"}});
    let answer: model_worker::Answer = serde_json::from_value(refused.clone()).unwrap();
    assert!(matches!(answer, model_worker::Answer::Refused { .. }));
    assert_eq!(serde_json::to_value(answer).unwrap(), refused);
    // A completion that merely carries such a field, or a status that is no refusal, is a
    // completion.
    for completion in [
        serde_json::json!({"id": "x", "choices": [], "provider_refused": {"status": 400, "body": "no"}}),
        serde_json::json!({"provider_refused": {"status": 200, "body": "ok"}}),
        serde_json::json!({"provider_refused": {"status": 404, "body": "misconfigured"}}),
    ] {
        let answer: model_worker::Answer = serde_json::from_value(completion.clone()).unwrap();
        assert_eq!(answer, model_worker::Answer::Completion(completion));
    }
}

/// The worker under `IDEMPOTENCY_AT_MOST_ONCE=true` (the handle's `at_most_once(true)`,
/// as the binary builds it): `event`'s request, delivered twice, with `first` shaping the
/// first delivery, and the redelivery once the first claim's lease is over.
struct AtMostOnce {
    worker: Worker,
    clock: lambda_idempotency::clock::TestClock,
}

impl AtMostOnce {
    fn new(base_url: &str, at_most_once: bool) -> Self {
        let model = ModelClient::new(base_url, None).unwrap();
        let clock = lambda_idempotency::clock::TestClock::new(std::time::SystemTime::now());
        let idempotency = Idempotency::builder(MemoryStore::new())
            .at_most_once(at_most_once)
            .clock(clock.clone())
            .build();
        Self {
            worker: Worker::new(idempotency, model),
            clock,
        }
    }

    /// A delivery of `fixture` whose invocation has `left` before the provider call's own
    /// deadline (the invocation's, less `DEADLINE_MARGIN`).
    async fn deliver(
        &self,
        fixture: &str,
        left: std::time::Duration,
    ) -> lambda_idempotency::BatchReport<model_worker::Delivery> {
        let mut event = event(fixture);
        let deadline =
            std::time::SystemTime::now() + model_worker::provider::DEADLINE_MARGIN + left;
        event.context.deadline = deadline
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        self.worker.process(event).await
    }

    /// The redelivery after the first claim's lease (the invocation's deadline) is over.
    async fn redeliver(
        &self,
        fixture: &str,
    ) -> lambda_idempotency::BatchReport<model_worker::Delivery> {
        self.clock.advance(std::time::Duration::from_secs(60));
        self.deliver(fixture, std::time::Duration::from_secs(30))
            .await
    }
}

/// `IDEMPOTENCY_AT_MOST_ONCE=true` never asks the provider twice for one request: a first
/// delivery whose provider call timed out after it was sent (its answer still to come)
/// keeps its claim (the reason says the outcome is unknown), a redelivery within its
/// lease is in progress, and one after it is refused for good (`ClaimAbandoned`, for
/// an operator): one call in the provider's log. Without the setting, the timed-out call
/// releases its claim and the redelivery asks again, as before.
#[tokio::test]
async fn at_most_once_a_provider_call_that_timed_out_is_never_asked_again() {
    let single = include_str!("../../../events/single-request.json");
    for at_most_once in [true, false] {
        let provider = ProviderStub::start().await.unwrap();
        let worker = AtMostOnce::new(&provider.base_url(), at_most_once);
        // Sent, and answered only long after the worker stopped waiting.
        provider.set_delay(std::time::Duration::from_secs(30));
        let first = worker
            .deliver(single, std::time::Duration::from_millis(1200))
            .await;
        let failure = first.records[0].result.as_ref().expect_err("timed out");
        assert_eq!(
            failure.kind,
            lambda_idempotency::FailureKind::Error,
            "retryable"
        );
        assert!(
            failure.reason.contains("did not answer"),
            "{}",
            failure.reason
        );
        assert_eq!(
            provider.completion_calls(),
            1,
            "the request reached the provider"
        );
        provider.set_delay(std::time::Duration::ZERO);
        if at_most_once {
            assert!(
                failure.reason.contains("outcome unknown"),
                "{}",
                failure.reason
            );
            let within = worker
                .deliver(single, std::time::Duration::from_secs(30))
                .await;
            let within = within.records[0].result.as_ref().unwrap_err();
            assert_eq!(within.kind, lambda_idempotency::FailureKind::InProgress);
            let after = worker.redeliver(single).await;
            let after = after.records[0].result.as_ref().unwrap_err();
            assert_eq!(
                after.kind,
                lambda_idempotency::FailureKind::Rejected,
                "{after}"
            );
            assert!(
                after.reason.contains("outcome is unknown"),
                "{}",
                after.reason
            );
            assert_eq!(provider.completion_calls(), 1, "never asked twice");
        } else {
            let again = worker
                .deliver(single, std::time::Duration::from_secs(30))
                .await;
            assert!(again.records[0].result.as_ref().unwrap().called_model);
            assert_eq!(provider.completion_calls(), 2, "released: asked again");
        }
    }
}

/// Under at most once, which provider failures keep the claim: those after which the
/// provider may have run the request (a 5xx; a connection reset after the request was
/// sent) keep it, and the redelivery after the lease is refused without asking; those
/// known not to have run (a 429, a 4xx the deployment causes, a connection refused)
/// release it, and the next delivery asks at once.
#[tokio::test]
async fn at_most_once_keeps_the_claim_only_when_the_provider_may_have_run_the_request() {
    // Answered with a status every time.
    for (status, kept) in [(500, true), (503, true), (429, false), (401, false)] {
        let provider = ProviderStub::start().await.unwrap();
        let worker = AtMostOnce::new(&provider.base_url(), true);
        let fixture = asking(&format!("[[status={status}]]"));
        let left = std::time::Duration::from_secs(30);
        let first = worker.deliver(&fixture, left).await;
        let first = first.records[0].result.as_ref().unwrap_err();
        assert_eq!(
            first.reason.contains("outcome unknown"),
            kept,
            "{status}: {first}"
        );
        let next = worker.redeliver(&fixture).await;
        let next = next.records[0].result.as_ref().unwrap_err();
        if kept {
            assert_eq!(
                next.kind,
                lambda_idempotency::FailureKind::Rejected,
                "{status}"
            );
            assert_eq!(
                provider.completion_calls(),
                1,
                "{status}: never asked twice"
            );
        } else {
            assert!(
                next.reason.contains(&status.to_string()),
                "{status}: {next}"
            );
            assert_eq!(
                provider.completion_calls(),
                2,
                "{status}: released, asked again"
            );
        }
    }

    // Nothing sent, so the claim is released, and the next delivery asks again (and is
    // not sent either): a connection refused, and a TLS handshake that never ends (a
    // listener that takes the connection and says nothing), which is no call that may
    // have run.
    let single = include_str!("../../../events/single-request.json");
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let handshake_never_ends = format!("https://{}", test_support::servers::silent_listener());
    for url in [refused, handshake_never_ends] {
        let worker = AtMostOnce::new(&url, true);
        for delivery in [
            worker
                .deliver(single, std::time::Duration::from_secs(30))
                .await,
            worker.redeliver(single).await,
        ] {
            let failure = delivery.records[0].result.as_ref().unwrap_err();
            assert_eq!(
                failure.kind,
                lambda_idempotency::FailureKind::Error,
                "{url}: {failure}"
            );
            assert!(
                failure.reason.contains("not sent"),
                "{url}: {}",
                failure.reason
            );
        }
    }

    // A connection reset once the request was read: it may have run.
    let resetting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", resetting.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let server = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            loop {
                let (mut socket, _) = resetting.accept().await.unwrap();
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
                drop(socket);
            }
        }
    });
    let worker = AtMostOnce::new(&url, true);
    let first = worker
        .deliver(single, std::time::Duration::from_secs(30))
        .await;
    let first = first.records[0].result.as_ref().unwrap_err();
    assert!(first.reason.contains("outcome unknown"), "{first}");
    let next = worker.redeliver(single).await;
    let next = next.records[0].result.as_ref().unwrap_err();
    assert_eq!(
        next.kind,
        lambda_idempotency::FailureKind::Rejected,
        "{next}"
    );
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked once"
    );
    server.abort();
}

/// `IDEMPOTENCY_AT_MOST_ONCE=true` with a record expiry shorter than Lambda's longest
/// invocation starts: the worker's lease is its invocation's remaining time, which a
/// 30 s function keeps far under a 5-minute expiry, and only the invocation knows it
/// (the engine refuses a claim whose own lease outlives the expiry).
#[tokio::test]
async fn at_most_once_starts_with_an_expiry_shorter_than_lambda_s_longest_timeout() {
    let config = |expiry: &str| {
        let vars = [
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://127.0.0.1:9"),
            ("IDEMPOTENCY_AT_MOST_ONCE", "true"),
            ("IDEMPOTENCY_EXPIRES_AFTER_SECONDS", expiry),
        ];
        model_worker::WorkerConfig::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    };
    for expiry in ["300", "86400"] {
        let started = model_worker::idempotency_from_config(&config(expiry)).await;
        assert!(started.unwrap().is_at_most_once(), "{expiry}");
    }
}

//! Durable executions through the SDK's in-memory runner (`LocalRunner`, the real entry
//! path), over every store and a real local HTTP provider: an execution that waits and
//! resumes keeps one claim, a crash before its first checkpoint re-enters it, another
//! execution with the same request gets the stored result, and the provider is called
//! once for all of them.

use aws_durable_execution_sdk::test_util::{LocalRunner, TestResult};
use aws_durable_execution_sdk::{BoxError, DurableContext};
use lambda_idempotency::durable::{IdempotentExecution, step};
use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::Status;
use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::{Idempotency, KeyStrategy, Operation};
use model_worker::{ChatMessage, ChatRequest, ModelClient};
use provider_stub::ProviderStub;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use test_support::stores::{Backend, TestStore};

/// The function's execution timeout: each execution's claim lasts this long.
const TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

struct Durable {
    _shared: tokio::sync::RwLockReadGuard<'static, ()>,
    _test_store: TestStore,
    store: FaultyStore<Arc<dyn IdempotencyStore>>,
    provider: ProviderStub,
    idempotency: Idempotency,
    model: ModelClient,
    /// How many times a handler started (every invocation of every execution).
    handler_runs: Arc<AtomicUsize>,
}

async fn setup(backend: Backend, test: &str, at_most_once: bool) -> Durable {
    let shared = super::MACHINE.read().await;
    let test_store = TestStore::open(backend, test).await;
    let store = FaultyStore::new(test_store.store.clone());
    let provider = ProviderStub::start().await.expect("provider stub");
    let mut builder = Idempotency::builder(store.clone()).function_name("durable-worker");
    if at_most_once {
        builder = builder.at_most_once(true).expires_after(TIMEOUT * 2);
    }
    Durable {
        _shared: shared,
        _test_store: test_store,
        store,
        model: ModelClient::new(&provider.base_url(), None).unwrap(),
        provider,
        idempotency: builder.build(),
        handler_runs: Arc::default(),
    }
}

fn request(id: &str) -> ChatRequest {
    ChatRequest {
        request_id: Some(id.into()),
        model: "gpt-4o-mini".into(),
        messages: vec![ChatMessage {
            role: "user".into(),
            content: format!("Summarise {id}."),
        }],
        temperature: Some(0.2),
        max_tokens: Some(64),
    }
}

fn execution_op() -> Operation {
    Operation::new("summarise", KeyStrategy::field("request_id"))
}

impl Durable {
    /// The execution as deployed: a step that calls the provider once per request, a
    /// wait (the execution suspends; the runner invokes it again), a step after it.
    /// `owner` names the execution (the runner gives every one the same ARN).
    async fn run(&self, runner: LocalRunner, owner: &str, id: &str) -> TestResult<Value> {
        let owner = owner.to_owned();
        let execution = IdempotentExecution::new(self.idempotency.clone(), execution_op(), TIMEOUT)
            .unwrap()
            .owner(move |_| owner.clone());
        let (idempotency, model, runs) = (
            self.idempotency.clone(),
            self.model.clone(),
            Arc::clone(&self.handler_runs),
        );
        let handler = execution.handler(move |request: ChatRequest, ctx: DurableContext| {
            let (idempotency, model) = (idempotency.clone(), model.clone());
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                let completion_op = Operation::new("completion", KeyStrategy::field("request_id"));
                let asked = request.clone();
                let answer: Value = step(
                    &idempotency,
                    &ctx,
                    &completion_op,
                    &request,
                    move || async move { model.complete(&asked, None).await },
                )
                .await?;
                ctx.wait(Duration::from_secs(60)).await?;
                let words = ctx
                    .step(|_| async { Ok::<_, BoxError>(3) })
                    .name("count")
                    .await?;
                Ok::<_, BoxError>(json!({"answer": answer, "words": words}))
            }
        });
        runner.run(handler, request(id)).await
    }

    async fn record(&self, id: &str) -> Option<lambda_idempotency::store::Record> {
        let payload = serde_json::to_value(request(id)).unwrap();
        let key = self
            .idempotency
            .idempotency_id(&execution_op(), &payload)
            .unwrap();
        self.store.get(&key).await.unwrap()
    }
}

fn output(result: &TestResult<Value>) -> &Value {
    assert!(
        result.is_success(),
        "the execution succeeds: {:?} {:?}",
        result.error_type(),
        result.error_message()
    );
    result.output().unwrap()
}

async fn an_execution_that_waits_calls_the_provider_once_and_completes_one_record(
    backend: Backend,
) {
    let s = setup(backend, "durable-wait", false).await;
    let result = s.run(LocalRunner::new(), "execution-1", "r-1").await;
    let answer = output(&result).clone();
    assert!(
        result.invocation_count() >= 2,
        "the wait suspended it: {}",
        result.invocation_count()
    );
    assert_eq!(
        s.handler_runs.load(Ordering::SeqCst),
        result.invocation_count()
    );
    assert_eq!(s.provider.completion_calls(), 1);
    assert_eq!(answer["words"], 3);
    let record = s.record("r-1").await.expect("the execution's record");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(
        serde_json::from_str::<Value>(record.data.as_deref().unwrap()).unwrap(),
        answer
    );
}

async fn a_crash_before_the_first_checkpoint_re_enters_the_executions_own_claim(backend: Backend) {
    for at_most_once in [false, true] {
        let s = setup(backend, "durable-crash", at_most_once).await;
        // The first invocation's first checkpoint fails as a crash would: the service
        // invokes again, and the SDK does not say it is replaying.
        let runner = LocalRunner::new().fail_checkpoints_after_retryable(0, 1);
        let result = s.run(runner, "execution-1", "r-crash").await;
        output(&result);
        assert!(
            result.invocation_count() >= 3,
            "crashed, resumed, waited: {}",
            result.invocation_count()
        );
        assert_eq!(
            s.provider.completion_calls(),
            1,
            "at most once: {at_most_once}"
        );
        assert_eq!(s.record("r-crash").await.unwrap().status, Status::Completed);
    }
}

async fn the_same_execution_run_again_replays_its_stored_result(backend: Backend) {
    let s = setup(backend, "durable-again", false).await;
    let first = output(&s.run(LocalRunner::new(), "execution-1", "r-2").await).clone();
    let runs = s.handler_runs.load(Ordering::SeqCst);
    let again = s.run(LocalRunner::new(), "execution-1", "r-2").await;
    assert_eq!(output(&again), &first);
    assert_eq!(
        again.invocation_count(),
        1,
        "no wait: the handler did not run"
    );
    assert_eq!(s.handler_runs.load(Ordering::SeqCst), runs);
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn another_execution_finds_the_request_in_progress_then_gets_the_stored_result(
    backend: Backend,
) {
    let s = setup(backend, "durable-other", false).await;
    // The first execution suspends on its wait and is not invoked again yet.
    let suspended = s
        .run(LocalRunner::new().max_invocations(1), "execution-1", "r-3")
        .await;
    assert!(suspended.is_suspended(), "{:?}", suspended.error_message());
    let record = s.record("r-3").await.unwrap();
    assert_eq!(record.status, Status::InProgress);
    let lease_left = record
        .in_progress_expiration
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        lease_left > TIMEOUT - Duration::from_secs(60),
        "the claim lasts the execution timeout: {lease_left:?}"
    );
    // A second execution of the same request (the message delivered again) is a true
    // duplicate: refused while the first may still run, its handler never started.
    let runs = s.handler_runs.load(Ordering::SeqCst);
    let duplicate = s.run(LocalRunner::new(), "execution-2", "r-3").await;
    assert!(duplicate.is_failure());
    assert!(
        duplicate.error_message().unwrap().contains("in progress"),
        "{:?}",
        duplicate.error_message()
    );
    assert_eq!(s.handler_runs.load(Ordering::SeqCst), runs);
    // The first execution resumes (from scratch here: the runner kept no checkpoints) and
    // completes; its step replays the stored completion.
    let resumed = output(&s.run(LocalRunner::new(), "execution-1", "r-3").await).clone();
    let later = s.run(LocalRunner::new(), "execution-2", "r-3").await;
    assert_eq!(output(&later), &resumed);
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn a_failed_execution_releases_its_claim_and_its_step_keeps_its_answer(backend: Backend) {
    let s = setup(backend, "durable-failed", false).await;
    // The provider fails once: the step retries (a durable retry, no invocation waits)
    // and the execution still succeeds with one answered call.
    s.provider.fail_next(1);
    let result = s.run(LocalRunner::new(), "execution-1", "r-4").await;
    output(&result);
    assert_eq!(
        s.provider.completion_calls(),
        2,
        "the failed call and its retry"
    );
    // A handler that fails after its step: the execution's claim is released, the step's
    // completed record stays.
    let execution = IdempotentExecution::new(s.idempotency.clone(), execution_op(), TIMEOUT)
        .unwrap()
        .owner(|_| "execution-2".into());
    let (idempotency, model) = (s.idempotency.clone(), s.model.clone());
    let failing = execution.handler(move |request: ChatRequest, ctx: DurableContext| {
        let (idempotency, model) = (idempotency.clone(), model.clone());
        async move {
            let op = Operation::new("completion", KeyStrategy::field("request_id"));
            let asked = request.clone();
            let _: Value = step(&idempotency, &ctx, &op, &request, move || async move {
                model.complete(&asked, None).await
            })
            .await?;
            Err::<Value, BoxError>("the order was cancelled".into())
        }
    });
    let failed = LocalRunner::new().run(failing, request("r-5")).await;
    assert!(failed.is_failure());
    assert_eq!(s.record("r-5").await.map(|r| r.status), None, "released");
    let result = s.run(LocalRunner::new(), "execution-3", "r-5").await;
    output(&result);
    assert_eq!(
        s.provider.completion_calls(),
        3,
        "r-4 twice (it failed once), r-5 once"
    );
}

test_support::every_backend!(
    an_execution_that_waits_calls_the_provider_once_and_completes_one_record,
    a_crash_before_the_first_checkpoint_re_enters_the_executions_own_claim,
    the_same_execution_run_again_replays_its_stored_result,
    another_execution_finds_the_request_in_progress_then_gets_the_stored_result,
    a_failed_execution_releases_its_claim_and_its_step_keeps_its_answer,
);

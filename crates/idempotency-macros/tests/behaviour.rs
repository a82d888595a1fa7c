//! What `#[idempotent]` does at run time, over the in-memory store.

use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::memory::MemoryWrites;
use lambda_idempotency::{Error, Idempotency, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Request {
    request_id: String,
    prompt: String,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Answer {
    text: String,
    call: u32,
}

struct Worker {
    idempotency: Idempotency,
    calls: AtomicU32,
    fail: bool,
}

impl Worker {
    fn new(store: impl IdempotencyStore + 'static) -> Self {
        Self {
            idempotency: Idempotency::new(store),
            calls: AtomicU32::new(0),
            fail: false,
        }
    }

    #[idempotent(handle = self.idempotency, payload = request, key = "request_id", validate = ["prompt"], operation = "generate")]
    async fn generate(&self, request: Request) -> Result<Answer, lambda_runtime::Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail {
            return Err(format!("provider failed on call {call}").into());
        }
        Ok(Answer {
            text: format!("echo {}", request.prompt),
            call,
        })
    }
}

fn request(id: &str, prompt: &str) -> Request {
    Request {
        request_id: id.into(),
        prompt: prompt.into(),
    }
}

#[tokio::test]
async fn second_call_returns_the_stored_value_without_running_the_body() {
    let worker = Worker::new(MemoryStore::new());
    let first = worker.generate(request("r1", "hi")).await.unwrap();
    let second = worker.generate(request("r1", "hi")).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(second.call, 1, "the stored value of call 1");
    assert_eq!(worker.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_error_releases_the_record_and_is_returned_as_is() {
    let store = FaultyStore::new(MemoryStore::new());
    let mut worker = Worker::new(store.clone());
    worker.fail = true;
    let err = worker.generate(request("r1", "hi")).await.unwrap_err();
    assert_eq!(err.to_string(), "provider failed on call 1");
    assert!(store.inner().is_empty(), "released");
    worker.fail = false;
    let answer = worker.generate(request("r1", "hi")).await.unwrap();
    assert_eq!(answer.call, 2, "the next call runs the body again");
}

#[tokio::test]
async fn a_different_payload_under_the_same_key_is_refused() {
    let worker = Worker::new(MemoryStore::new());
    worker.generate(request("r1", "hi")).await.unwrap();
    let err = worker.generate(request("r1", "other")).await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::PayloadMismatch { .. })
        ),
        "{err}"
    );
    assert_eq!(worker.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn store_errors_reach_the_caller_as_its_error_type() {
    let store = FaultyStore::new(MemoryStore::new());
    let worker = Worker::new(store.clone());
    store.inject(StoreOp::Claim, Fault::Unavailable, 3);
    let err = worker.generate(request("r1", "hi")).await.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::Store { .. })),
        "{err}"
    );
    assert_eq!(worker.calls.load(Ordering::SeqCst), 0);
}

static GENERIC_CALLS: AtomicU32 = AtomicU32::new(0);

#[idempotent(handle = handle, payload = item, hash = ["id", "value"], operation = "store_item")]
async fn store_item<T>(handle: &Idempotency, item: T) -> Result<T, Error>
where
    T: Serialize + serde::de::DeserializeOwned + Clone,
{
    GENERIC_CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(item.clone())
}

#[tokio::test]
async fn generic_functions_store_and_replay_each_type() {
    let handle = Idempotency::new(MemoryStore::new());
    let a = json!({"id": 1, "value": "x", "noise": 1});
    let b = json!({"id": 1, "value": "x", "noise": 2});
    assert_eq!(store_item(&handle, a.clone()).await.unwrap(), a);
    assert_eq!(
        store_item(&handle, b).await.unwrap(),
        a,
        "replayed: noise is not hashed"
    );
    assert_eq!(GENERIC_CALLS.load(Ordering::SeqCst), 1);
    let missing = store_item(&handle, json!({"value": "x"}))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::KeyMissing { .. }), "{missing}");
}

#[tokio::test]
async fn the_lease_ends_with_the_context_deadline() {
    static IDEM: std::sync::LazyLock<(MemoryStore, Idempotency)> = std::sync::LazyLock::new(|| {
        let store = MemoryStore::new();
        (
            store.clone(),
            Idempotency::builder(store).function_name("fn").build(),
        )
    });
    // Nested in a test function, so not a module's item: it names its operation.
    #[idempotent(handle = IDEM.1, key = "request_id", context = ctx, operation = "with_ctx")]
    async fn with_ctx(request: Request, ctx: &lambda_runtime::Context) -> Result<u64, Error> {
        let record = IDEM
            .0
            .record(&format!("fn.with_ctx#{}", request.request_id))
            .unwrap();
        let lease = lambda_idempotency::store::epoch_millis(record.in_progress_expiration.unwrap());
        Ok(lease - ctx.deadline)
    }
    let mut ctx = lambda_runtime::Context::default();
    ctx.deadline = lambda_idempotency::store::epoch_millis(std::time::SystemTime::now()) + 5_000;
    assert_eq!(with_ctx(request("c1", "p"), &ctx).await.unwrap(), 0);
}

/// Lambda's tenant isolation mode: the context's tenant keys the call. The same request
/// under two tenants runs once for each; again under one of them it replays.
#[tokio::test]
async fn the_context_s_tenant_keys_the_call() {
    static IDEM: std::sync::LazyLock<(MemoryStore, Idempotency)> = std::sync::LazyLock::new(|| {
        let store = MemoryStore::new();
        (
            store.clone(),
            Idempotency::builder(store).function_name("fn").build(),
        )
    });
    static CALLS: AtomicU32 = AtomicU32::new(0);
    #[idempotent(handle = IDEM.1, key = "request_id", context = ctx, operation = "tenanted")]
    async fn tenanted(request: Request, ctx: &lambda_runtime::Context) -> Result<u32, Error> {
        let _ = (request, ctx);
        Ok(CALLS.fetch_add(1, Ordering::SeqCst) + 1)
    }
    let mut answers = Vec::new();
    for tenant in [Some("a"), Some("b"), Some("a"), Some("b"), None] {
        let mut ctx = lambda_runtime::Context::default();
        ctx.tenant_id = tenant.map(str::to_owned);
        answers.push(tenanted(request("t1", "p"), &ctx).await.unwrap());
    }
    assert_eq!(answers, [1, 2, 1, 2, 3]);
    for id in ["#a#fn.tenanted#t1", "#b#fn.tenanted#t1", "fn.tenanted#t1"] {
        assert!(IDEM.0.record(id).is_some(), "{id}");
    }
}

/// At most once through `#[idempotent]`: on a handle built `at_most_once(true)`, a call
/// whose earlier run crashed is refused with `ClaimAbandoned` and does not run again.
#[tokio::test]
async fn an_at_most_once_handle_refuses_a_call_whose_run_crashed() {
    static IDEM: std::sync::LazyLock<Idempotency> = std::sync::LazyLock::new(|| {
        Idempotency::builder(MemoryStore::new())
            .function_name("fn")
            .at_most_once(true)
            .lease(std::time::Duration::from_secs(1))
            .build()
    });
    static CALLS: AtomicU32 = AtomicU32::new(0);
    #[idempotent(handle = IDEM, key = "request_id", operation = "charge")]
    async fn charge(request: Request) -> Result<u32, Error> {
        let _ = request;
        if CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(1)
    }
    let crashed = tokio::time::timeout(
        std::time::Duration::from_millis(20),
        charge(request("c", "p")),
    );
    assert!(crashed.await.is_err(), "the first run never ends");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let refused = charge(request("c", "p")).await;
    assert!(
        matches!(refused, Err(Error::ClaimAbandoned { .. })),
        "{refused:?}"
    );
    assert_eq!(CALLS.load(Ordering::SeqCst), 1, "not run again");
}

struct Chat;

impl Chat {
    /// Written once, for the key and for validation.
    const CANONICAL_FIELDS: [&'static str; 2] = ["model", "prompt"];
}

static CHAT_CALLS: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    handle = handle,
    payload = request,
    key = "request_id",
    hash = Chat::CANONICAL_FIELDS,
    validate = Chat::CANONICAL_FIELDS,
    operation = "chat"
)]
async fn chat(handle: &Idempotency, request: serde_json::Value) -> Result<u32, Error> {
    let _ = request;
    Ok(CHAT_CALLS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn a_field_list_constant_is_hashed_and_validated() {
    let store = MemoryStore::new();
    let handle = Idempotency::new(store.clone());
    // No request_id: the hash of the constant's fields is the key; `noise` is not in it.
    let first = json!({"model": "m", "prompt": "p", "noise": 1});
    let same = json!({"model": "m", "prompt": "p", "noise": 2});
    assert_eq!(chat(&handle, first).await.unwrap(), 1);
    assert_eq!(chat(&handle, same).await.unwrap(), 1, "replayed");
    // A reused request_id with another prompt is refused: the constant's fields are validated.
    chat(
        &handle,
        json!({"request_id": "r", "model": "m", "prompt": "p"}),
    )
    .await
    .unwrap();
    let err = chat(
        &handle,
        json!({"request_id": "r", "model": "m", "prompt": "q"}),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::PayloadMismatch { .. }), "{err}");
    assert_eq!(CHAT_CALLS.load(Ordering::SeqCst), 2);
}

/// A function whose answer is persisted by writes of its own: the macro commits them with
/// the record, once.
struct Answers {
    idempotency: Idempotency,
    calls: AtomicU32,
}

impl Answers {
    #[idempotent(handle = self.idempotency, payload = request, key = "request_id", operation = "answer")]
    async fn answer(
        &self,
        request: Request,
    ) -> Result<lambda_idempotency::WithWrites<String, MemoryWrites>, lambda_runtime::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let text = format!("echo {}", request.prompt);
        let writes = MemoryWrites::new().put_new("answers", &request.request_id, json!(text));
        Ok(lambda_idempotency::WithWrites::new(text, writes))
    }
}

#[tokio::test]
async fn a_function_returning_its_writes_commits_them_with_its_record_once() {
    let store = MemoryStore::new();
    let answers = Answers {
        idempotency: Idempotency::new(store.clone()),
        calls: AtomicU32::new(0),
    };
    for _ in 0..2 {
        let answer = answers.answer(request("r-1", "hi")).await.unwrap();
        assert_eq!(answer.value, "echo hi");
    }
    assert_eq!(answers.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.table("answers").get("r-1"),
        Some(&json!("echo hi")),
        "written with the record, once (a second put_new would be refused)"
    );
    let id = answers
        .idempotency
        .idempotency_id(
            &lambda_idempotency::Operation::new(
                "answer",
                lambda_idempotency::KeyStrategy::field("request_id"),
            ),
            &json!({"request_id": "r-1", "prompt": "hi"}),
        )
        .unwrap();
    assert!(store.record(&id).is_some());
}

/// A store that commits no writes: the memory store's record requests, and nothing else.
#[derive(Debug, Clone)]
struct WithoutWrites(FaultyStore<MemoryStore>);

impl IdempotencyStore for WithoutWrites {
    fn name(&self) -> &'static str {
        "without-writes"
    }
    fn claim<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<lambda_idempotency::store::ClaimOutcome, Error>,
    > {
        self.0.claim(claim)
    }
    fn complete<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
        data: Option<&'a str>,
        expiration: std::time::SystemTime,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), Error>> {
        self.0.complete(claim, data, expiration)
    }
    fn release<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), Error>> {
        self.0.release(claim)
    }
    fn get<'a>(
        &'a self,
        id: &'a str,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<Option<lambda_idempotency::store::Record>, Error>,
    > {
        self.0.get(id)
    }
}

/// Writes the handle's store cannot commit are refused before the claim: the paid body
/// never runs only to have its writes refused, on every delivery.
#[tokio::test]
async fn writes_the_store_cannot_commit_are_refused_before_the_body_runs() {
    let store = FaultyStore::new(MemoryStore::new());
    let answers = Answers {
        idempotency: Idempotency::new(WithoutWrites(store.clone())),
        calls: AtomicU32::new(0),
    };
    let err = answers.answer(request("r-2", "hi")).await.unwrap_err();
    assert!(err.to_string().contains("cannot commit writes"), "{err}");
    assert_eq!(
        answers.calls.load(Ordering::SeqCst),
        0,
        "the body did not run"
    );
    assert_eq!(store.total_requests(), 0, "nothing claimed");
}

/// Orders committed with their record, as a new user's app does: a plain insert of the
/// order's row, refused when the row is there already (an operator forgot the record).
struct Orders {
    idempotency: Idempotency,
    calls: AtomicU32,
}

impl Orders {
    #[idempotent(handle = self.idempotency, payload = request, key = "request_id", operation = "order")]
    async fn order(
        &self,
        request: Request,
    ) -> Result<lambda_idempotency::WithWrites<String, MemoryWrites>, lambda_runtime::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let writes = MemoryWrites::new().put_new("orders", &request.request_id, json!(1));
        Ok(lambda_idempotency::WithWrites::new(
            "ordered".into(),
            writes,
        ))
    }

    #[idempotent(handle = self.idempotency, payload = request, key = "request_id",
                 operation = "order_retried", refused_writes_retryable)]
    async fn order_retried(
        &self,
        request: Request,
    ) -> Result<lambda_idempotency::WithWrites<String, MemoryWrites>, lambda_runtime::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let writes = MemoryWrites::new().put_new("orders", &request.request_id, json!(1));
        Ok(lambda_idempotency::WithWrites::new(
            "ordered".into(),
            writes,
        ))
    }
}

/// Writes refused by their own condition are the answer: the body runs once and every
/// later delivery answers the refusal; `refused_writes_retryable` runs the body again.
#[tokio::test]
async fn refused_writes_are_the_answer_unless_declared_retryable() {
    let store = MemoryStore::new();
    let orders = Orders {
        idempotency: Idempotency::new(store.clone()),
        calls: AtomicU32::new(0),
    };
    // The rows are there already (committed before an operator forgot their records).
    for id in ["o-1", "o-2"] {
        let taken = MemoryWrites::new().put("orders", id, json!(0));
        let claim_free = Idempotency::new(store.clone());
        let op = lambda_idempotency::Operation::new(
            "setup",
            lambda_idempotency::KeyStrategy::field("id"),
        );
        claim_free
            .execute_committing(&op, &json!({"id": id}), || async {
                Ok::<_, Error>(lambda_idempotency::WithWrites::new(0, taken))
            })
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let err = orders.order(request("o-1", "hi")).await.unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
    }
    assert_eq!(orders.calls.swap(0, Ordering::SeqCst), 1, "kept: run once");
    for _ in 0..2 {
        let err = orders
            .order_retried(request("o-2", "hi"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
    }
    assert_eq!(
        orders.calls.load(Ordering::SeqCst),
        2,
        "retryable: run each time"
    );
}

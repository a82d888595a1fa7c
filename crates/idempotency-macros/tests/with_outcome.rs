//! `with_outcome`: the generated `<name>_with_outcome` says how each call was answered.

use lambda_idempotency::{Error, Idempotency, MemoryStore, Outcome, idempotent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};

/// A store and a handle whose stored ids are `fn.{operation}#{key}`.
fn setup() -> (MemoryStore, Idempotency) {
    let store = MemoryStore::new();
    let handle = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    (store, handle)
}

fn payload(id: &str, text: &str) -> Value {
    json!({"id": id, "text": text})
}

mod orders {
    use super::*;

    #[idempotent(handle = handle, payload = request, key = "id", validate = ["text"], with_outcome)]
    pub(crate) async fn process(
        handle: &Idempotency,
        request: Value,
        calls: &AtomicU32,
    ) -> Result<String, Error> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(format!("processed {}", request["text"]))
    }
}

#[tokio::test]
async fn the_first_call_runs_and_a_duplicate_is_replayed() {
    let (_, handle) = setup();
    let calls = AtomicU32::new(0);
    let (first, outcome) = orders::process_with_outcome(&handle, payload("k1", "a"), &calls)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert!(outcome.ran());
    let (again, outcome) = orders::process_with_outcome(&handle, payload("k1", "a"), &calls)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert!(!outcome.ran());
    assert_eq!(first, again);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_function_and_its_companion_share_stored_ids() {
    let (store, handle) = setup();
    let calls = AtomicU32::new(0);
    let plain = orders::process(&handle, payload("k1", "a"), &calls)
        .await
        .unwrap();
    let (replayed, outcome) = orders::process_with_outcome(&handle, payload("k1", "a"), &calls)
        .await
        .unwrap();
    assert_eq!((replayed, outcome), (plain, Outcome::Replayed));
    // The default operation is the function's own path, as without `with_outcome`: adding
    // the flag does not change stored ids.
    assert!(
        store
            .record("fn.with_outcome::orders::process#k1")
            .is_some()
    );
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn errors_of_the_body_and_of_the_engine_are_returned_as_they_are() {
    let (store, handle) = setup();
    let calls = AtomicU32::new(0);
    orders::process_with_outcome(&handle, payload("k1", "a"), &calls)
        .await
        .unwrap();
    let mismatch = orders::process_with_outcome(&handle, payload("k1", "b"), &calls)
        .await
        .unwrap_err();
    assert!(
        matches!(mismatch, Error::PayloadMismatch { .. }),
        "{mismatch}"
    );

    #[derive(Debug, PartialEq)]
    struct BodyError(String);
    impl From<Error> for BodyError {
        fn from(err: Error) -> Self {
            BodyError(err.to_string())
        }
    }
    impl std::fmt::Display for BodyError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    struct Failing;
    impl Failing {
        #[idempotent(handle = handle, payload = request, key = "id", with_outcome, operation = "Failing::run")]
        async fn run(&self, handle: &Idempotency, request: Value) -> Result<u32, BodyError> {
            let _ = request;
            Err(BodyError("the body failed".into()))
        }
    }
    let err = Failing
        .run_with_outcome(&handle, payload("k2", "a"))
        .await
        .unwrap_err();
    assert_eq!(err, BodyError("the body failed".into()));
    assert_eq!(store.len(), 1, "the failed call's claim is released");
}

struct Worker {
    idempotency: Idempotency,
    calls: AtomicU32,
}

impl Worker {
    #[idempotent(handle = self.idempotency, payload = request, key = "id", with_outcome, operation = "Worker::handle")]
    async fn handle(&self, mut request: Value) -> Result<u32, Error> {
        request["seen"] = json!(true);
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[tokio::test]
async fn a_method_and_its_companion() {
    let (store, handle) = setup();
    let worker = Worker {
        idempotency: handle,
        calls: AtomicU32::new(0),
    };
    assert_eq!(
        worker
            .handle_with_outcome(payload("k1", "a"))
            .await
            .unwrap(),
        (1, Outcome::Executed)
    );
    assert_eq!(worker.handle(payload("k1", "a")).await.unwrap(), 1);
    assert_eq!(
        worker
            .handle_with_outcome(payload("k1", "a"))
            .await
            .unwrap(),
        (1, Outcome::Replayed)
    );
    assert!(store.record("fn.Worker::handle#k1").is_some());
}

#[tokio::test]
async fn a_duplicate_answered_from_the_local_cache_says_so() {
    let store = MemoryStore::new();
    let worker = Worker {
        idempotency: Idempotency::builder(store).local_cache(8).build(),
        calls: AtomicU32::new(0),
    };
    let (_, first) = worker
        .handle_with_outcome(payload("k1", "a"))
        .await
        .unwrap();
    let (_, again) = worker
        .handle_with_outcome(payload("k1", "a"))
        .await
        .unwrap();
    assert_eq!(
        (first, again),
        (Outcome::Executed, Outcome::ReplayedFromCache)
    );
}

#[tokio::test]
async fn disabled_idempotency_runs_every_call() {
    let worker = Worker {
        idempotency: Idempotency::builder(MemoryStore::new())
            .disabled(true)
            .build(),
        calls: AtomicU32::new(0),
    };
    for call in 1..=2 {
        let (n, outcome) = worker
            .handle_with_outcome(payload("k1", "a"))
            .await
            .unwrap();
        assert_eq!((n, outcome), (call, Outcome::Disabled));
        assert!(outcome.ran());
    }
}

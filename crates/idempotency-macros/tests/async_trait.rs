//! `#[idempotent]` on the methods of an `#[async_trait]` impl: `#[async_trait]` expands
//! first, and `#[idempotent]` wraps the boxed future it makes.

use async_trait::async_trait;
use lambda_idempotency::{Error, Idempotency, MemoryStore, idempotent};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[async_trait]
trait Handler: Send + Sync {
    async fn handle(&self, request: Value) -> Result<u32, Error>;
    async fn consume(self, request: Value) -> Result<u32, Error>;
}

#[derive(Clone)]
struct Worker {
    idempotency: Idempotency,
    calls: Arc<AtomicU32>,
}

#[async_trait]
impl Handler for Worker {
    #[idempotent(handle = self.idempotency, key = "id", validate = ["text"], operation = "Worker::handle")]
    async fn handle(&self, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(handle = self.idempotency, key = "id", operation = "consume")]
    async fn consume(self, request: Value) -> Result<u32, Error> {
        if request["fail"] == json!(true) {
            return Err(Error::KeyMissing {
                field: "fail".into(),
            });
        }
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

fn setup() -> (MemoryStore, Worker) {
    let store = MemoryStore::new();
    let worker = Worker {
        idempotency: Idempotency::builder(store.clone())
            .function_name("fn")
            .build(),
        calls: Arc::new(AtomicU32::new(0)),
    };
    (store, worker)
}

#[tokio::test]
async fn an_async_trait_method_runs_once_per_key() {
    let (store, worker) = setup();
    let handler: &dyn Handler = &worker;
    let request = json!({"id": "k1", "text": "a"});
    assert_eq!(handler.handle(request.clone()).await.unwrap(), 1);
    assert_eq!(handler.handle(request).await.unwrap(), 1, "replayed");
    assert_eq!(worker.calls.load(Ordering::SeqCst), 1);
    let mismatch = handler
        .handle(json!({"id": "k1", "text": "b"}))
        .await
        .unwrap_err();
    assert!(
        matches!(mismatch, Error::PayloadMismatch { .. }),
        "{mismatch}"
    );
    // Named as a native `async fn` in a trait impl would be.
    assert!(store.record("fn.Worker::handle#k1").is_some());
}

#[tokio::test]
async fn an_async_trait_method_taking_self_by_value_releases_on_error() {
    let (store, worker) = setup();
    let failing = json!({"id": "k1", "fail": true});
    assert!(worker.clone().consume(failing).await.is_err());
    assert!(store.is_empty(), "released");
    assert_eq!(
        worker.clone().consume(json!({"id": "k1"})).await.unwrap(),
        1
    );
    assert_eq!(
        worker.clone().consume(json!({"id": "k1"})).await.unwrap(),
        1
    );
    assert!(store.record("fn.consume#k1").is_some());
}

#[tokio::test]
async fn the_future_is_send() {
    let (_, worker) = setup();
    let task = tokio::spawn(async move { worker.handle(json!({"id": "k1"})).await });
    assert_eq!(task.await.unwrap().unwrap(), 1);
}

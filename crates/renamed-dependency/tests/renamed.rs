//! `crate = "idem"`: every path the macro generates goes through the renamed dependency.

use idem::{Error, Idempotency, MemoryStore, Outcome, idempotent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};

const FIELDS: [&str; 1] = ["text"];

struct Worker {
    idempotency: Idempotency,
    calls: AtomicU32,
}

impl Worker {
    #[idempotent(
        crate = "idem",
        handle = self.idempotency,
        payload = request,
        key = "id",
        hash = FIELDS,
        validate = FIELDS,
        context = ctx,
        operation = "Worker::handle",
        with_outcome
    )]
    async fn handle(&self, request: Value, ctx: &lambda_runtime::Context) -> Result<u32, Error> {
        let _ = (request, ctx);
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[idempotent(crate = "::idem", handle = handle, payload = request, key = "id")]
async fn free(handle: &Idempotency, request: Value) -> Result<String, Error> {
    Ok(request["id"].to_string())
}

#[tokio::test(flavor = "current_thread")]
async fn every_argument_works_through_a_renamed_dependency() {
    let store = MemoryStore::new();
    let worker = Worker {
        idempotency: Idempotency::builder(store.clone())
            .function_name("fn")
            .build(),
        calls: AtomicU32::new(0),
    };
    let ctx = lambda_runtime::Context::default();
    let request = json!({"id": "k1", "text": "a"});
    let first = worker
        .handle_with_outcome(request.clone(), &ctx)
        .await
        .unwrap();
    assert_eq!(first, (1, Outcome::Executed));
    assert_eq!(worker.handle(request, &ctx).await.unwrap(), 1);
    assert!(store.record("fn.Worker::handle#k1").is_some());

    let handle = Idempotency::new(MemoryStore::new());
    assert_eq!(free(&handle, json!({"id": 7})).await.unwrap(), "7");
}

//! `#[idempotent]` over the DynamoDB store on the local test server.

use lambda_idempotency::{DynamoDbStore, Error, Idempotency, idempotent};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, Ordering};
use test_support::TestTable;

#[derive(Serialize, Deserialize)]
struct Request {
    request_id: String,
    prompt: String,
}

struct Worker {
    idempotency: Idempotency,
    calls: AtomicU32,
    fail: bool,
}

impl Worker {
    #[idempotent(handle = self.idempotency, payload = request, key = "request_id", validate = ["prompt"], operation = "Worker::generate")]
    async fn generate(&self, request: Request) -> Result<String, lambda_runtime::Error> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail {
            return Err("provider error".into());
        }
        Ok(format!("{} #{n}", request.prompt))
    }
}

#[idempotent(handle = handle, payload = value, hash = ["id"])]
async fn generic_echo<T>(handle: &Idempotency, value: T, calls: &AtomicU32) -> Result<T, Error>
where
    T: Serialize + serde::de::DeserializeOwned,
{
    calls.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

async fn worker(test: &str) -> (TestTable, Worker) {
    let table = TestTable::create(test).await;
    let store = DynamoDbStore::new(table.client.clone(), &table.name);
    let worker = Worker {
        idempotency: Idempotency::new(store),
        calls: AtomicU32::new(0),
        fail: false,
    };
    (table, worker)
}

fn request(prompt: &str) -> Request {
    Request {
        request_id: "r1".into(),
        prompt: prompt.into(),
    }
}

#[tokio::test]
async fn the_second_call_replays_from_dynamodb() {
    let (table, worker) = worker("macro-replay").await;
    assert_eq!(worker.generate(request("hi")).await.unwrap(), "hi #1");
    table.reset().await;
    assert_eq!(worker.generate(request("hi")).await.unwrap(), "hi #1");
    assert_eq!(worker.calls.load(Ordering::SeqCst), 1);
    assert_eq!(table.item_requests().await, 1);
}

#[tokio::test]
async fn an_error_deletes_the_claim_and_a_mismatch_is_refused() {
    let (table, mut worker) = worker("macro-errors").await;
    worker.fail = true;
    assert!(worker.generate(request("hi")).await.is_err());
    assert_eq!(table.counts().await.get("DeleteItem"), Some(&1), "released");
    worker.fail = false;
    assert_eq!(worker.generate(request("hi")).await.unwrap(), "hi #2");
    let err = worker.generate(request("changed")).await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::PayloadMismatch { .. })
        ),
        "{err}"
    );
    assert_eq!(worker.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn generic_functions_work_over_dynamodb() {
    let table = TestTable::create("macro-generic").await;
    let handle = Idempotency::new(DynamoDbStore::new(table.client.clone(), &table.name));
    let calls = AtomicU32::new(0);
    let v = serde_json::json!({"id": 7, "x": [1, 2]});
    assert_eq!(generic_echo(&handle, v.clone(), &calls).await.unwrap(), v);
    assert_eq!(generic_echo(&handle, v.clone(), &calls).await.unwrap(), v);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

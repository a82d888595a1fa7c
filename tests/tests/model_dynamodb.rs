//! The model-based test over the DynamoDB store and the local test server: the same
//! seeded histories as the in-memory run (`crates/idempotency/tests/model.rs`), fewer of
//! them, in real time (the test clock jumps for leases and expiry).
//!
//! `MODEL_SEEDS=n` runs n histories per setup (default 12); `MODEL_SEED=s` replays one.

use lambda_idempotency::DynamoDbStore;
use lambda_idempotency::store::conformance::model::{self, Setup};
use std::time::Duration;
use test_support::TestTable;

async fn run(name: &str, setup: Setup) {
    let table = TestTable::create(name).await;
    let store = DynamoDbStore::new(table.client.clone(), &table.name);
    for seed in model::seeds(12) {
        model::run_seed(store.clone(), seed, setup, 40).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_histories_with_a_queue_sized_expiry_keep_every_invariant() {
    run(
        "model-long",
        Setup {
            expires_after: Duration::from_secs(3_600),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_histories_with_an_expiry_shorter_than_a_call_keep_every_invariant() {
    run(
        "model-short",
        Setup {
            expires_after: Duration::from_secs(3),
        },
    )
    .await;
}

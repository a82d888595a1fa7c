//! The model-based test over the in-memory store: seeded histories of deliveries, store
//! faults, crashes, duplicates and clock steps, on tokio's paused clock, so every history
//! is deterministic and replays from its seed.
//!
//! `MODEL_SEEDS=n` runs n histories per setup (default 300); `MODEL_SEED=s` replays one.

use lambda_idempotency::MemoryStore;
use lambda_idempotency::store::conformance::model::{self, Setup};
use std::time::Duration;

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("MODEL_SEED") {
        return vec![seed.parse().expect("MODEL_SEED is a number")];
    }
    let n = std::env::var("MODEL_SEEDS")
        .ok()
        .map(|n| n.parse().expect("MODEL_SEEDS is a number"))
        .unwrap_or(300);
    (0..n).collect()
}

async fn run(setup: Setup) {
    for seed in seeds() {
        model::run_seed(MemoryStore::new(), seed, setup, 40).await;
    }
}

#[tokio::test(start_paused = true)]
async fn histories_with_a_queue_sized_expiry_keep_every_invariant() {
    run(Setup {
        expires_after: Duration::from_secs(3_600),
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn histories_with_an_expiry_shorter_than_a_call_keep_every_invariant() {
    run(Setup {
        expires_after: Duration::from_secs(3),
    })
    .await;
}

//! The in-memory store: the whole contract, and what only it has.
//!
//! The contract runs on tokio's paused clock, so every model history is deterministic and
//! replays from its seed (`MODEL_SEEDS=n` runs n histories per setup, default 300;
//! `MODEL_SEED=s` replays one).

use lambda_idempotency::store::conformance;
use lambda_idempotency::store::conformance::writes::MemoryKit;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::{Error, Idempotency, KeyStrategy, MemoryStore, Operation};
use serde_json::json;

#[tokio::test(start_paused = true)]
async fn the_memory_store_keeps_the_whole_contract() {
    let store = FaultyStore::new(MemoryStore::new());
    let faults = store.clone();
    let kit_store = store.inner().clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        300,
        Some(&MemoryKit(kit_store)),
    )
    .await;
}

#[tokio::test]
async fn the_memory_store_counts_its_records() {
    let store = MemoryStore::new();
    assert!(store.is_empty());
    assert_eq!(store.len(), 0);
    let idem = Idempotency::new(store.clone());
    let op = Operation::new("generate", KeyStrategy::field("request_id"));
    idem.run(&op, &json!({"request_id": "one"}), || async {
        Ok::<_, Error>(1)
    })
    .await
    .unwrap();
    assert_eq!((store.len(), store.is_empty()), (1, false));
}

//! The library's conformance suite over a store written outside it.

use custom_store::TextStore;
use lambda_idempotency::store::conformance;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};

#[tokio::test]
async fn a_store_written_outside_the_crate_passes_the_whole_contract() {
    let store = FaultyStore::new(TextStore::new());
    let faults = store.clone();
    conformance::run_all(&store, async |op| faults.inject(op, Fault::Unavailable, 1)).await;
    conformance::engine::run_all(TextStore::new()).await;
}

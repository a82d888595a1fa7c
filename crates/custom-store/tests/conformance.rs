//! The library's whole conformance suite (the store contract, the engine over the store,
//! the model's histories) over a store written outside it: the one entry point every
//! backend calls.

use custom_store::TextStore;
use lambda_idempotency::store::conformance;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};

#[tokio::test]
async fn a_store_written_outside_the_crate_passes_the_whole_contract() {
    let store = FaultyStore::new(TextStore::new());
    let faults = store.clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        20,
        None,
    )
    .await;
}

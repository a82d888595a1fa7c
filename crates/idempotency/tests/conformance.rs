//! The conformance suite itself: its model catches a store that breaks the contract.
//!
//! On tokio's paused clock, so every history is deterministic.

use futures_util::FutureExt;
use lambda_idempotency::store::conformance::model::{self, Setup};
use lambda_idempotency::store::{BoxFuture, Claim, ClaimOutcome, IdempotencyStore, Record};
use lambda_idempotency::{Error, MemoryStore};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

/// A store whose leases end 1.5 s early: the test of the model itself. Some history must
/// catch the takeover of a call that may still run.
#[derive(Debug, Clone)]
struct ShortLeases(MemoryStore);

impl IdempotencyStore for ShortLeases {
    fn name(&self) -> &'static str {
        "short-leases"
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let mut claim = claim.clone();
            claim.lease_until = (claim.lease_until - Duration::from_millis(1_500))
                .max(claim.now + Duration::from_millis(1));
            self.0.claim(&claim).await
        })
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.0.complete(claim, data, expiration)
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        self.0.release(claim)
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.0.get(id)
    }
}

#[tokio::test(start_paused = true)]
async fn the_model_notices_leases_that_end_early() {
    let mut caught = 0;
    for seed in 0..100 {
        let run = model::run_seed(
            ShortLeases(MemoryStore::new()),
            seed,
            Setup::QUEUE_SIZED_EXPIRY,
            model::STEPS,
        );
        if AssertUnwindSafe(run).catch_unwind().await.is_err() {
            caught += 1;
        }
    }
    assert!(
        caught >= 10,
        "only {caught} of 100 histories over leases that end 1.5 s early broke an invariant"
    );
}

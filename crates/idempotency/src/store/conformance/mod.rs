//! The behaviour every [`IdempotencyStore`] must show, one `pub async fn` per behaviour.
//!
//! Each function panics with a message naming the broken rule. Backends run them all with
//! [`run_all`]; capabilities that need the backend's help (fault injection) are passed in
//! explicitly, never skipped.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use lambda_idempotency::MemoryStore;
//! use lambda_idempotency::store::conformance;
//! use lambda_idempotency::store::faulty::{Fault, FaultyStore};
//! let store = FaultyStore::new(MemoryStore::new());
//! let faults = store.clone();
//! conformance::run_all(&store, async |op| faults.inject(op, Fault::Unavailable, 1)).await;
//! # }
//! ```

pub mod engine;
pub mod model;

pub use engine::{
    engine_keeps_leases, engine_replays_without_running, engine_request_counts,
    engine_under_faults, payload_mismatch,
};

use super::{ClaimOutcome, IdempotencyStore, StoreOp};
use crate::error::Error;
use crate::record::{Claim, Status};
use std::time::{Duration, SystemTime};

/// Runs every behaviour of the store contract below. `inject_failure(op)` must make the
/// next call of `op` fail as a throttled backend does. [`engine::run_all`] runs the
/// engine's behaviours over the same store.
pub async fn run_all<S>(store: &S, inject_failure: impl AsyncFn(StoreOp))
where
    S: IdempotencyStore + Clone + 'static,
{
    first_claim(store).await;
    completed_duplicate(store).await;
    in_progress_duplicate(store).await;
    lease_takeover(store).await;
    expired_record(store).await;
    release_frees_the_key(store).await;
    fencing(store).await;
    claim_boundaries(store).await;
    expiry_never_ends_a_live_lease(store).await;
    retried_claim_finds_its_own_record(store).await;
    completion_is_repeatable_and_never_upserts(store).await;
    concurrent_claims_have_one_winner(store, 16).await;
    store_errors_surface(store, inject_failure).await;
}

fn unique(name: &str) -> String {
    format!("conformance.{}#{:016x}", op_name(name), fastrand::u64(..))
}

/// A unique operation name (no `#`: it ends the stored id's prefix).
fn op_name(name: &str) -> String {
    format!("conformance-{name}-{:016x}", fastrand::u64(..))
}

/// A claim on `id` at `now` with a lease of `lease`, token `token`, validation `"v1"` and
/// an expiration an hour after `now`: what the contract's tests write, for a backend's
/// own tests.
pub fn claim_at(id: &str, now: SystemTime, lease: Duration, token: &str) -> Claim {
    Claim {
        id: id.to_owned(),
        now,
        expiration: now + Duration::from_secs(3600),
        lease_until: now + lease,
        lease_token: token.to_owned(),
        validation: Some("v1".into()),
    }
}

/// The claim a completion or release names: its id and token (the rest is unused).
fn lease(id: &str, token: &str) -> Claim {
    claim_at(id, SystemTime::UNIX_EPOCH, Duration::ZERO, token)
}

fn now_ms() -> SystemTime {
    // Whole milliseconds, the precision stores keep.
    crate::record::from_epoch_millis(crate::record::epoch_millis(SystemTime::now()))
}

/// A claim on a free key succeeds and leaves an in-progress record with its token,
/// lease and validation hash.
pub async fn first_claim(store: &dyn IdempotencyStore) {
    let id = unique("first_claim");
    let now = now_ms();
    let claim = claim_at(&id, now, Duration::from_secs(30), "t1");
    let outcome = store.claim(&claim).await.expect("claim on a free key");
    assert_eq!(
        outcome,
        ClaimOutcome::Claimed { previous: None },
        "a free key is claimed"
    );
    let record = store
        .get(&id)
        .await
        .expect("get")
        .expect("the claim is stored");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.lease_token.as_deref(), Some("t1"));
    assert_eq!(
        record.in_progress_expiration,
        Some(now + Duration::from_secs(30))
    );
    assert_eq!(record.validation.as_deref(), Some("v1"));
    assert_eq!(
        crate::record::epoch_secs(record.expiration),
        crate::record::epoch_secs(claim.expiration)
    );
}

/// A claim on a completed key is refused and returns the completed record with its data.
pub async fn completed_duplicate(store: &dyn IdempotencyStore) {
    let id = unique("completed_duplicate");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    store
        .complete(
            &lease(&id, "t1"),
            Some(r#"{"answer":42}"#),
            now + Duration::from_secs(3600),
        )
        .await
        .expect("the owner completes");
    let again = store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t2"))
        .await
        .unwrap();
    match again {
        ClaimOutcome::Exists(r) => {
            assert_eq!(r.status, Status::Completed);
            assert_eq!(r.data.as_deref(), Some(r#"{"answer":42}"#));
        }
        other => panic!("a completed key must not be claimed again, got {other:?}"),
    }
    // Even long after the lease, a completed record is not claimable until it expires.
    let later = store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(600),
            Duration::from_secs(30),
            "t3",
        ))
        .await
        .unwrap();
    assert!(
        matches!(later, ClaimOutcome::Exists(_)),
        "a completed record outlives its lease"
    );
}

/// A claim on a key whose lease is live is refused and returns the in-progress record.
pub async fn in_progress_duplicate(store: &dyn IdempotencyStore) {
    let id = unique("in_progress_duplicate");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    let again = store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(29),
            Duration::from_secs(30),
            "t2",
        ))
        .await
        .unwrap();
    match again {
        ClaimOutcome::Exists(r) => {
            assert_eq!(r.status, Status::InProgress);
            assert_eq!(
                r.lease_token.as_deref(),
                Some("t1"),
                "the holder keeps its lease"
            );
        }
        other => panic!("a live lease must refuse the claim, got {other:?}"),
    }
}

/// Once the lease has passed, the next claim takes the record over.
pub async fn lease_takeover(store: &dyn IdempotencyStore) {
    let id = unique("lease_takeover");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(1), "t1"))
        .await
        .unwrap();
    let later = now + Duration::from_secs(2);
    let outcome = store
        .claim(&claim_at(&id, later, Duration::from_secs(30), "t2"))
        .await
        .unwrap();
    match outcome {
        ClaimOutcome::Claimed { previous } => {
            if let Some(prev) = previous {
                assert_eq!(
                    prev.lease_token.as_deref(),
                    Some("t1"),
                    "previous is the old claim"
                );
            }
        }
        other => panic!("a passed lease must be taken over, got {other:?}"),
    }
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.lease_token.as_deref(), Some("t2"));
}

/// A record past its `expiration` is claimable even though it is still stored (TTL
/// deletes late), whatever its status.
pub async fn expired_record(store: &dyn IdempotencyStore) {
    let id = unique("expired_record");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    store
        .complete(&lease(&id, "t1"), Some("1"), now + Duration::from_secs(10))
        .await
        .unwrap();
    let outcome = store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(12),
            Duration::from_secs(30),
            "t2",
        ))
        .await
        .unwrap();
    assert!(
        matches!(outcome, ClaimOutcome::Claimed { .. }),
        "an expired completed record must be claimable, got {outcome:?}"
    );
}

/// A released claim leaves no record, so the next delivery runs again.
pub async fn release_frees_the_key(store: &dyn IdempotencyStore) {
    let id = unique("release");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    store
        .release(&lease(&id, "t1"))
        .await
        .expect("the owner releases");
    assert!(
        store.get(&id).await.unwrap().is_none(),
        "release deletes the record"
    );
    let outcome = store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t2"))
        .await
        .unwrap();
    assert_eq!(outcome, ClaimOutcome::Claimed { previous: None });
}

/// A worker whose lease was taken over can neither complete nor release: the new owner's
/// record stays intact.
pub async fn fencing(store: &dyn IdempotencyStore) {
    let id = unique("fencing");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(1), "zombie"))
        .await
        .unwrap();
    store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(2),
            Duration::from_secs(30),
            "owner",
        ))
        .await
        .unwrap();
    let complete = store
        .complete(
            &lease(&id, "zombie"),
            Some("\"stale\""),
            now + Duration::from_secs(60),
        )
        .await;
    assert!(
        matches!(complete, Err(Error::LeaseLost { .. })),
        "a zombie's completion must be refused with LeaseLost, got {complete:?}"
    );
    let release = store.release(&lease(&id, "zombie")).await;
    assert!(
        matches!(release, Err(Error::LeaseLost { .. })),
        "a zombie's release must be refused with LeaseLost, got {release:?}"
    );
    let record = store
        .get(&id)
        .await
        .unwrap()
        .expect("the owner's record survives");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.lease_token.as_deref(), Some("owner"));
    assert_eq!(record.data, None);
    store
        .complete(
            &lease(&id, "owner"),
            Some("\"fresh\""),
            now + Duration::from_secs(60),
        )
        .await
        .expect("the owner completes");
    // Completion by a missing record is refused too.
    let gone = store
        .release(&lease(&unique("never_claimed"), "owner"))
        .await;
    assert!(matches!(gone, Err(Error::LeaseLost { .. })), "got {gone:?}");
}

/// The claim's time boundaries: a lease that ends at `now` still holds (it ends *before*
/// a later millisecond), an expiration in `now`'s second still holds.
pub async fn claim_boundaries(store: &dyn IdempotencyStore) {
    let now = now_ms();
    // Lease: held at its last millisecond, free one millisecond later.
    let id = unique("lease_boundary");
    store
        .claim(&claim_at(&id, now, Duration::from_secs(5), "t1"))
        .await
        .unwrap();
    let lease_end = now + Duration::from_secs(5);
    let at_end = store
        .claim(&claim_at(&id, lease_end, Duration::from_secs(5), "t2"))
        .await
        .unwrap();
    assert!(
        matches!(at_end, ClaimOutcome::Exists(_)),
        "a lease is live at its own end millisecond, got {at_end:?}"
    );
    let after = store
        .claim(&claim_at(
            &id,
            lease_end + Duration::from_millis(1),
            Duration::from_secs(5),
            "t3",
        ))
        .await
        .unwrap();
    assert!(
        matches!(after, ClaimOutcome::Claimed { .. }),
        "a lease is over one millisecond after its end, got {after:?}"
    );

    // Expiry: held through its second, free from the next one.
    let id = unique("expiry_boundary");
    let second = crate::record::from_epoch_secs(crate::record::epoch_secs(now));
    store
        .claim(&claim_at(&id, now, Duration::from_secs(1), "t1"))
        .await
        .unwrap();
    store
        .complete(
            &lease(&id, "t1"),
            Some("1"),
            second + Duration::from_secs(10),
        )
        .await
        .unwrap();
    let last_ms = second + Duration::from_millis(10_999);
    let held = store
        .claim(&claim_at(&id, last_ms, Duration::from_secs(5), "t2"))
        .await
        .unwrap();
    assert!(
        matches!(held, ClaimOutcome::Exists(_)),
        "a record counts through its expiration second, got {held:?}"
    );
    let next = store
        .claim(&claim_at(
            &id,
            second + Duration::from_secs(11),
            Duration::from_secs(5),
            "t3",
        ))
        .await
        .unwrap();
    assert!(
        matches!(next, ClaimOutcome::Claimed { .. }),
        "a record is expired from the second after its expiration, got {next:?}"
    );
}

/// A record whose `expiration` has passed while its lease is live is held: an expiry
/// shorter than a call must not let a duplicate run the call a second time.
pub async fn expiry_never_ends_a_live_lease(store: &dyn IdempotencyStore) {
    let id = unique("short_expiry");
    let now = now_ms();
    let mut claim = claim_at(&id, now, Duration::from_secs(300), "t1");
    // As another library (or an old version) would write it: expiry before the lease end.
    claim.expiration = now + Duration::from_secs(60);
    store.claim(&claim).await.unwrap();
    let later = store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(120),
            Duration::from_secs(300),
            "t2",
        ))
        .await
        .unwrap();
    match later {
        ClaimOutcome::Exists(r) => assert_eq!(r.lease_token.as_deref(), Some("t1")),
        other => panic!("an expired record with a live lease must hold, got {other:?}"),
    }
    let after_lease = store
        .claim(&claim_at(
            &id,
            now + Duration::from_secs(301),
            Duration::from_secs(30),
            "t3",
        ))
        .await
        .unwrap();
    assert!(
        matches!(after_lease, ClaimOutcome::Claimed { .. }),
        "once the lease has ended too, the record is free, got {after_lease:?}"
    );
}

/// A claim repeated with the same token (its first answer was lost) succeeds on its own
/// in-progress record, and says so through `previous`; it never reopens the record once
/// completed, and never takes another worker's live lease.
pub async fn retried_claim_finds_its_own_record(store: &dyn IdempotencyStore) {
    let id = unique("own_claim");
    let now = now_ms();
    let claim = claim_at(&id, now, Duration::from_secs(30), "mine");
    store.claim(&claim).await.unwrap();
    let retried = store.claim(&claim).await.expect("the retried claim");
    match retried {
        ClaimOutcome::Claimed { previous } => {
            if let Some(previous) = previous {
                assert_eq!(previous.lease_token.as_deref(), Some("mine"));
            }
        }
        other => panic!("a retried claim must find its own record, got {other:?}"),
    }
    let other = store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "theirs"))
        .await
        .unwrap();
    assert!(
        matches!(other, ClaimOutcome::Exists(_)),
        "another token is refused, got {other:?}"
    );
    store
        .complete(
            &lease(&id, "mine"),
            Some("\"done\""),
            now + Duration::from_secs(60),
        )
        .await
        .unwrap();
    let late = store.claim(&claim).await.unwrap();
    assert!(
        matches!(&late, ClaimOutcome::Exists(r) if r.status == Status::Completed),
        "a late retry of the claim must not reopen its completed record, got {late:?}"
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.data.as_deref(), Some("\"done\""));
}

/// A completion repeated after its answer was lost succeeds again; a completion or
/// release for a key that holds no record fails with `LeaseLost` and creates nothing.
pub async fn completion_is_repeatable_and_never_upserts(store: &dyn IdempotencyStore) {
    let id = unique("repeat_complete");
    let now = now_ms();
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    for _ in 0..2 {
        store
            .complete(&lease(&id, "t1"), Some("7"), now + Duration::from_secs(60))
            .await
            .expect("a repeated completion succeeds");
    }
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.data.as_deref()),
        (Status::Completed, Some("7"))
    );

    let missing = unique("never_claimed");
    let complete = store
        .complete(
            &lease(&missing, "t1"),
            Some("7"),
            now + Duration::from_secs(60),
        )
        .await;
    assert!(
        matches!(complete, Err(Error::LeaseLost { .. })),
        "completing a missing record is LeaseLost, got {complete:?}"
    );
    assert!(
        store.get(&missing).await.unwrap().is_none(),
        "completing a missing record must not create it"
    );
}

/// Many concurrent claimers on one key: exactly one wins.
pub async fn concurrent_claims_have_one_winner(store: &dyn IdempotencyStore, claimers: usize) {
    for round in 0..3 {
        let id = unique(&format!("race{round}"));
        let now = now_ms();
        let claims: Vec<Claim> = (0..claimers)
            .map(|i| claim_at(&id, now, Duration::from_secs(30), &format!("t{i}")))
            .collect();
        let outcomes = futures_util::future::join_all(claims.iter().map(|c| store.claim(c))).await;
        let winners = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::Claimed { .. })))
            .count();
        assert_eq!(
            winners, 1,
            "exactly one of {claimers} concurrent claims must win: {outcomes:?}"
        );
        assert!(
            outcomes.iter().all(|o| o.is_ok()),
            "no claim may fail: {outcomes:?}"
        );
    }
}

/// Backend failures come back as [`Error::Store`] naming the backend, marked retryable
/// for throttling.
pub async fn store_errors_surface(
    store: &dyn IdempotencyStore,
    inject_failure: impl AsyncFn(StoreOp),
) {
    let id = unique("store_errors");
    let now = now_ms();
    let check = |what: &str, err: Option<Error>| match err {
        Some(Error::Store {
            backend, retryable, ..
        }) => {
            assert_eq!(backend, store.name(), "{what}: the error names the backend");
            assert!(retryable, "{what}: throttling is retryable");
        }
        other => panic!("{what}: an injected failure must surface as Error::Store, got {other:?}"),
    };
    inject_failure(StoreOp::Claim).await;
    check(
        "claim",
        store
            .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
            .await
            .err(),
    );
    store
        .claim(&claim_at(&id, now, Duration::from_secs(30), "t1"))
        .await
        .unwrap();
    inject_failure(StoreOp::Complete).await;
    check(
        "complete",
        store
            .complete(&lease(&id, "t1"), Some("1"), now + Duration::from_secs(60))
            .await
            .err(),
    );
    inject_failure(StoreOp::Release).await;
    check("release", store.release(&lease(&id, "t1")).await.err());
    inject_failure(StoreOp::Get).await;
    check("get", store.get(&id).await.err());
    // The failed requests changed nothing.
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.lease_token.as_deref()),
        (Status::InProgress, Some("t1"))
    );
}

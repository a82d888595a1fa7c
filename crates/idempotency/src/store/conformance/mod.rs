//! The behaviour every [`IdempotencyStore`] must show, and the one call that checks it.
//!
//! A backend's test calls [`run_whole_contract`] and nothing else: it runs the store
//! contract below ([`run_all`], one `pub async fn` per behaviour), the engine over the
//! store ([`engine::run_all`]: every single fault, request counts, leases, validation and
//! replay) and the seeded histories of the [`model`]. A check added to any of the three is
//! run by every backend. What needs the backend's help (fault injection) is a parameter,
//! never skipped.
//!
//! Each check panics with a message naming the broken rule.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use lambda_idempotency::MemoryStore;
//! use lambda_idempotency::store::conformance;
//! use lambda_idempotency::store::faulty::{Fault, FaultyStore};
//! let store = FaultyStore::new(MemoryStore::new());
//! let faults = store.clone();
//! let kit = conformance::writes::MemoryKit(store.inner().clone());
//! conformance::run_whole_contract(
//!     store,
//!     async |op| faults.inject(op, Fault::Unavailable, 1),
//!     2,
//!     Some(&kit),
//! )
//! .await;
//! # }
//! ```

mod at_most_once;
pub mod engine;
pub mod model;
pub mod records;
mod refusals;
mod support;
pub mod writes;

pub use at_most_once::{at_most_once_claims, at_most_once_races};
pub use support::claim_at;
use support::{Key, now_ms, op_name, unique};

use super::{ClaimOutcome, IdempotencyStore, StoreOp};
use crate::error::Error;
use crate::record::{Claim, Status};
use std::time::Duration;

/// Runs the whole contract over `store`: the store contract ([`run_all`]), the engine's
/// behaviours over the store ([`engine::run_all`]), the operators' requests
/// ([`records::run_all`]), the writes ([`writes::run_all`]) and `histories` seeded histories per
/// setup of the [`model`] ([`model::run_all`]; `MODEL_SEEDS` and `MODEL_SEED` override
/// the count). The one entry point a backend's test calls.
///
/// `inject_failure(op)` must make the next call of `op` on `store` fail as a throttled
/// backend does (a [`FaultyStore`](super::faulty::FaultyStore) around the store, the
/// backend's own fault injection, or a connection the server drops).
///
/// `writes` is how the store's own writes are built and read back
/// ([`writes::WritesKit`]), for a store that commits them with a completion; `None` for a
/// store that does not, which the suite then checks refuses them ([`writes::run_all`]).
pub async fn run_whole_contract<S>(
    store: S,
    inject_failure: impl AsyncFn(StoreOp),
    histories: u64,
    writes: Option<&dyn writes::WritesKit>,
) where
    S: IdempotencyStore + Clone + 'static,
{
    run_all(&store, inject_failure).await;
    engine::run_all(store.clone()).await;
    records::run_all(store.clone()).await;
    self::writes::run_all(store.clone(), writes).await;
    model::run_all(store, histories).await;
}

/// Runs every behaviour of the store contract below. `inject_failure(op)` must make the
/// next call of `op` fail as a throttled backend does. Part of [`run_whole_contract`].
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
    at_most_once_claims(store).await;
    at_most_once_races(store, 8).await;
    store_errors_surface(store, inject_failure).await;
}

const LEASE: Duration = Duration::from_secs(30);

/// A claim on a free key succeeds and leaves an in-progress record with its token,
/// lease and validation hash.
pub async fn first_claim(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "first_claim");
    let now = now_ms();
    let previous = key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    assert_eq!(previous, None, "a free key has no previous record");
    let record = key.get().await.expect("the claim is stored");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.lease_token.as_deref(), Some("t1"));
    assert_eq!(record.in_progress_expiration, Some(now + LEASE));
    assert_eq!(record.validation.as_deref(), Some("v1"));
    assert_eq!(
        crate::record::epoch_secs(record.expiration),
        crate::record::epoch_secs(claim_at(&key.id, now, LEASE, "t1").expiration)
    );
}

/// A claim on a completed key is refused and returns the completed record with its data.
pub async fn completed_duplicate(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "completed_duplicate");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    key.complete(
        "t1",
        Some(r#"{"answer":42}"#),
        now + Duration::from_secs(3600),
    )
    .await
    .expect("the owner completes");
    let again = key
        .refused(
            now,
            LEASE,
            "t2",
            "a completed key must not be claimed again",
        )
        .await;
    assert_eq!(again.status, Status::Completed);
    assert_eq!(again.data.as_deref(), Some(r#"{"answer":42}"#));
    // Even long after the lease, a completed record is not claimable until it expires.
    key.refused(
        now + Duration::from_secs(600),
        LEASE,
        "t3",
        "a completed record outlives its lease",
    )
    .await;
}

/// A claim on a key whose lease is live is refused and returns the in-progress record.
pub async fn in_progress_duplicate(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "in_progress_duplicate");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    let held = key
        .refused(
            now + Duration::from_secs(29),
            LEASE,
            "t2",
            "a live lease must refuse the claim",
        )
        .await;
    assert_eq!(held.status, Status::InProgress);
    assert_eq!(
        held.lease_token.as_deref(),
        Some("t1"),
        "the holder keeps its lease"
    );
}

/// Once the lease has passed, the next claim takes the record over.
pub async fn lease_takeover(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "lease_takeover");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(1), "t1", "a free key is claimed")
        .await;
    let previous = key
        .claimed(
            now + Duration::from_secs(2),
            LEASE,
            "t2",
            "a passed lease must be taken over",
        )
        .await;
    if let Some(previous) = previous {
        assert_eq!(
            previous.lease_token.as_deref(),
            Some("t1"),
            "previous is the old claim"
        );
    }
    let record = key.get().await.expect("the new claim");
    assert_eq!(record.lease_token.as_deref(), Some("t2"));
}

/// A record past its `expiration` is claimable even though it is still stored (TTL
/// deletes late), whatever its status.
pub async fn expired_record(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "expired_record");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    key.complete("t1", Some("1"), now + Duration::from_secs(10))
        .await
        .unwrap();
    key.claimed(
        now + Duration::from_secs(12),
        LEASE,
        "t2",
        "an expired completed record must be claimable",
    )
    .await;
}

/// A released claim leaves no record, so the next delivery runs again.
pub async fn release_frees_the_key(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "release");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    key.release("t1").await.expect("the owner releases");
    assert!(key.get().await.is_none(), "release deletes the record");
    let previous = key
        .claimed(now, LEASE, "t2", "a released key is claimed again")
        .await;
    assert_eq!(previous, None, "nothing is left to replace");
}

/// A worker whose lease was taken over can neither complete nor release: the new owner's
/// record stays intact.
pub async fn fencing(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "fencing");
    let now = now_ms();
    key.claimed(
        now,
        Duration::from_secs(1),
        "zombie",
        "a free key is claimed",
    )
    .await;
    key.claimed(
        now + Duration::from_secs(2),
        LEASE,
        "owner",
        "a passed lease is taken over",
    )
    .await;
    let complete = key
        .complete("zombie", Some("\"stale\""), now + Duration::from_secs(60))
        .await;
    assert!(
        matches!(complete, Err(Error::LeaseLost { .. })),
        "a zombie's completion must be refused with LeaseLost, got {complete:?}"
    );
    let release = key.release("zombie").await;
    assert!(
        matches!(release, Err(Error::LeaseLost { .. })),
        "a zombie's release must be refused with LeaseLost, got {release:?}"
    );
    let record = key.get().await.expect("the owner's record survives");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.lease_token.as_deref(), Some("owner"));
    assert_eq!(record.data, None);
    key.complete("owner", Some("\"fresh\""), now + Duration::from_secs(60))
        .await
        .expect("the owner completes");
    // Release of a missing record is refused too.
    let gone = Key::new(store, "never_claimed").release("owner").await;
    assert!(matches!(gone, Err(Error::LeaseLost { .. })), "got {gone:?}");
}

/// The claim's time boundaries: a lease that ends at `now` still holds (it ends *before*
/// a later millisecond), an expiration in `now`'s second still holds.
pub async fn claim_boundaries(store: &dyn IdempotencyStore) {
    let now = now_ms();
    let five = Duration::from_secs(5);
    // Lease: held at its last millisecond, free one millisecond later.
    let key = Key::new(store, "lease_boundary");
    key.claimed(now, five, "t1", "a free key is claimed").await;
    let lease_end = now + five;
    key.refused(
        lease_end,
        five,
        "t2",
        "a lease is live at its own end millisecond",
    )
    .await;
    key.claimed(
        lease_end + Duration::from_millis(1),
        five,
        "t3",
        "a lease is over one millisecond after its end",
    )
    .await;

    // Expiry: held through its second, free from the next one.
    let key = Key::new(store, "expiry_boundary");
    let second = crate::record::from_epoch_secs(crate::record::epoch_secs(now));
    key.claimed(now, Duration::from_secs(1), "t1", "a free key is claimed")
        .await;
    key.complete("t1", Some("1"), second + Duration::from_secs(10))
        .await
        .unwrap();
    key.refused(
        second + Duration::from_millis(10_999),
        five,
        "t2",
        "a record counts through its expiration second",
    )
    .await;
    key.claimed(
        second + Duration::from_secs(11),
        five,
        "t3",
        "a record is expired from the second after its expiration",
    )
    .await;
}

/// A record whose `expiration` has passed while its lease is live is held: an expiry
/// shorter than a call must not let a duplicate run the call a second time.
pub async fn expiry_never_ends_a_live_lease(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "short_expiry");
    let now = now_ms();
    let long = Duration::from_secs(300);
    let mut claim = claim_at(&key.id, now, long, "t1");
    // As another library (or an old version) would write it: expiry before the lease end.
    claim.expiration = now + Duration::from_secs(60);
    store.claim(&claim).await.unwrap();
    let held = key
        .refused(
            now + Duration::from_secs(120),
            long,
            "t2",
            "an expired record with a live lease must hold",
        )
        .await;
    assert_eq!(held.lease_token.as_deref(), Some("t1"));
    key.claimed(
        now + Duration::from_secs(301),
        LEASE,
        "t3",
        "once the lease has ended too, the record is free",
    )
    .await;
}

/// A claim repeated with the same token (its first answer was lost) succeeds on its own
/// in-progress record, and says so through `previous`; it never reopens the record once
/// completed, and never takes another worker's live lease.
pub async fn retried_claim_finds_its_own_record(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "own_claim");
    let now = now_ms();
    key.claimed(now, LEASE, "mine", "a free key is claimed")
        .await;
    let previous = key
        .claimed(
            now,
            LEASE,
            "mine",
            "a retried claim must find its own record",
        )
        .await;
    if let Some(previous) = previous {
        assert_eq!(previous.lease_token.as_deref(), Some("mine"));
    }
    key.refused(now, LEASE, "theirs", "another token is refused")
        .await;
    key.complete("mine", Some("\"done\""), now + Duration::from_secs(60))
        .await
        .unwrap();
    let late = key
        .refused(
            now,
            LEASE,
            "mine",
            "a late retry of the claim must not reopen its completed record",
        )
        .await;
    assert_eq!(late.status, Status::Completed, "{late:?}");
    let record = key.get().await.expect("the completed record");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.data.as_deref(), Some("\"done\""));
}

/// A completion repeated after its answer was lost succeeds again; a completion or
/// release for a key that holds no record fails with `LeaseLost` and creates nothing.
pub async fn completion_is_repeatable_and_never_upserts(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "repeat_complete");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    for _ in 0..2 {
        key.complete("t1", Some("7"), now + Duration::from_secs(60))
            .await
            .expect("a repeated completion succeeds");
    }
    let record = key.get().await.expect("the completed record");
    assert_eq!(
        (record.status, record.data.as_deref()),
        (Status::Completed, Some("7"))
    );

    let missing = Key::new(store, "never_claimed");
    let complete = missing
        .complete("t1", Some("7"), now + Duration::from_secs(60))
        .await;
    assert!(
        matches!(complete, Err(Error::LeaseLost { .. })),
        "completing a missing record is LeaseLost, got {complete:?}"
    );
    assert!(
        missing.get().await.is_none(),
        "completing a missing record must not create it"
    );
}

/// Many concurrent claimers on one key: exactly one wins.
pub async fn concurrent_claims_have_one_winner(store: &dyn IdempotencyStore, claimers: usize) {
    for round in 0..3 {
        let id = unique(&format!("race{round}"));
        let now = now_ms();
        let claims: Vec<Claim> = (0..claimers)
            .map(|i| claim_at(&id, now, LEASE, &format!("t{i}")))
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
    let key = Key::new(store, "store_errors");
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
            .claim(&claim_at(&key.id, now, LEASE, "t1"))
            .await
            .err(),
    );
    key.claimed(now, LEASE, "t1", "the claim after the failure is written")
        .await;
    inject_failure(StoreOp::Complete).await;
    check(
        "complete",
        key.complete("t1", Some("1"), now + Duration::from_secs(60))
            .await
            .err(),
    );
    inject_failure(StoreOp::Release).await;
    check("release", key.release("t1").await.err());
    inject_failure(StoreOp::Get).await;
    check("get", store.get(&key.id).await.err());
    // The failed requests changed nothing.
    let record = key.get().await.expect("the claim survives");
    assert_eq!(
        (record.status, record.lease_token.as_deref()),
        (Status::InProgress, Some("t1"))
    );
}

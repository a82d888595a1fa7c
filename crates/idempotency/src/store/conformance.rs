//! The behaviour every [`IdempotencyStore`] must show, one `pub async fn` per behaviour.
//!
//! Each function panics with a message naming the broken rule. Backends run them all with
//! [`run_all`]; capabilities that need the backend's help (fault injection) are passed in
//! explicitly, never skipped.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use lambda_idempotency::{MemoryStore, store::conformance};
//! let store = MemoryStore::new();
//! let faults = store.clone();
//! conformance::run_all(&store, async |op| faults.inject_failures(op, 1)).await;
//! # }
//! ```

use super::memory::StoreOp;
use super::{ClaimOutcome, IdempotencyStore};
use crate::engine::{Idempotency, Operation, Outcome};
use crate::error::{Error, ExecuteError};
use crate::key::KeyStrategy;
use crate::record::{Claim, Status};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Runs every behaviour below. `inject_failure(op)` must make the next call of `op` fail
/// as a throttled backend does.
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
    concurrent_claims_have_one_winner(store, 16).await;
    payload_mismatch(store.clone()).await;
    engine_replays_without_running(store.clone()).await;
    store_errors_surface(store, inject_failure).await;
}

fn unique(name: &str) -> String {
    format!("conformance.{name}#{:016x}", fastrand::u64(..))
}

fn claim_at(id: &str, now: SystemTime, lease: Duration, token: &str) -> Claim {
    Claim {
        id: id.to_owned(),
        now,
        expiration: now + Duration::from_secs(3600),
        lease_until: now + lease,
        lease_token: token.to_owned(),
        validation: Some("v1".into()),
    }
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
            &id,
            "t1",
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
        .complete(&id, "t1", Some("1"), now + Duration::from_secs(10))
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
    store.release(&id, "t1").await.expect("the owner releases");
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
            &id,
            "zombie",
            Some("\"stale\""),
            now + Duration::from_secs(60),
        )
        .await;
    assert!(
        matches!(complete, Err(Error::LeaseLost { .. })),
        "a zombie's completion must be refused with LeaseLost, got {complete:?}"
    );
    let release = store.release(&id, "zombie").await;
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
            &id,
            "owner",
            Some("\"fresh\""),
            now + Duration::from_secs(60),
        )
        .await
        .expect("the owner completes");
    // Completion by a missing record is refused too.
    let gone = store.release(&unique("never_claimed"), "owner").await;
    assert!(matches!(gone, Err(Error::LeaseLost { .. })), "got {gone:?}");
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

/// Through the engine: the same key with a different payload is refused, and the first
/// call's result is not returned.
pub async fn payload_mismatch<S: IdempotencyStore + 'static>(store: S) {
    let idempotency = Idempotency::new(store);
    let op = Operation::new(unique("mismatch"), KeyStrategy::field("id")).validate(["prompt"]);
    let first = json!({"id": "k", "prompt": "a"});
    let (v, _) = idempotency
        .execute(&op, &first, None, || async {
            Ok::<_, Error>("first".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "first");
    let second = json!({"id": "k", "prompt": "b"});
    let result = idempotency
        .execute(&op, &second, None, || async {
            Ok::<_, Error>("second".to_string())
        })
        .await;
    assert!(
        matches!(
            result,
            Err(ExecuteError::Idempotency(Error::PayloadMismatch { .. }))
        ),
        "a different payload under one key must be refused, got {result:?}"
    );
}

/// Through the engine: a duplicate returns the stored result without running the function.
pub async fn engine_replays_without_running<S: IdempotencyStore + 'static>(store: S) {
    let idempotency = Idempotency::new(store);
    let op = Operation::new(unique("replay"), KeyStrategy::field("id"));
    let payload = json!({"id": "k"});
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    for expected in [Outcome::Executed, Outcome::Replayed] {
        let calls = calls.clone();
        let (v, outcome) = idempotency
            .execute(&op, &payload, None, || async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, Error>(vec![1u8, 2, 3])
            })
            .await
            .unwrap();
        assert_eq!((v, outcome), (vec![1, 2, 3], expected));
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the function ran once"
    );
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
            .complete(&id, "t1", Some("1"), now + Duration::from_secs(60))
            .await
            .err(),
    );
    inject_failure(StoreOp::Release).await;
    check("release", store.release(&id, "t1").await.err());
    inject_failure(StoreOp::Get).await;
    check("get", store.get(&id).await.err());
    // The failed requests changed nothing.
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.lease_token.as_deref()),
        (Status::InProgress, Some("t1"))
    );
}

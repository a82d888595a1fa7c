//! The operators' requests: `forget` deletes a record only as it was read, and `list`
//! pages through a prefix. Both are checked through the store and through the handle,
//! under the fault table (an answer lost, a hang, a race with a claim).

use super::support::{Key, claim_at, now_ms, unique};
use crate::error::Error;
use crate::handle::Idempotency;
use crate::store::faulty::{Fault, FaultyStore};
use crate::store::{ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, StoreOp};
use std::collections::BTreeSet;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

/// Runs every check below over `store`.
pub async fn run_all<S: IdempotencyStore + Clone + 'static>(store: S) {
    forget_deletes_only_the_record_as_read(&store).await;
    forget_never_deletes_a_claim_that_raced_it(&store, 8).await;
    list_pages_through_a_prefix(&store).await;
    forget_and_list_under_faults(store).await;
}

/// A record is forgotten only while it is as read: a completion, a takeover or a release
/// since the read leaves it (or its absence) alone, and the key is free after.
pub async fn forget_deletes_only_the_record_as_read(store: &dyn IdempotencyStore) {
    let key = Key::new(store, "forget");
    let now = now_ms();
    key.claimed(now, LEASE, "t1", "a free key is claimed").await;
    let claimed = key.get().await.expect("the claim is stored");
    key.complete("t1", Some("\"done\""), now + Duration::from_secs(3600))
        .await
        .expect("the owner completes");
    assert_eq!(
        store.forget(&claimed).await.expect("forget"),
        Forgotten::Changed,
        "a record completed since it was read is not forgotten"
    );
    let completed = key.get().await.expect("the completion is kept");
    assert_eq!(completed.data.as_deref(), Some("\"done\""));
    assert_eq!(
        store.forget(&completed).await.expect("forget"),
        Forgotten::Deleted,
        "a completed record as read is forgotten"
    );
    assert_eq!(key.get().await, None, "forgotten means gone");
    assert_eq!(
        store.forget(&completed).await.expect("forget"),
        Forgotten::Absent,
        "forgetting twice finds nothing"
    );
    key.claimed(now, LEASE, "t2", "a forgotten key is claimed again")
        .await;

    // A stuck claim (lease ended) read by the operator, then taken over by a delivery.
    let stuck = key.get().await.expect("the claim is stored");
    let later = now + LEASE + Duration::from_secs(1);
    key.claimed(later, LEASE, "t3", "a lapsed lease is taken over")
        .await;
    assert_eq!(
        store.forget(&stuck).await.expect("forget"),
        Forgotten::Changed,
        "the takeover since the read is not forgotten"
    );
    assert_eq!(
        key.get().await.and_then(|r| r.lease_token).as_deref(),
        Some("t3")
    );
    let mut wrong = key.get().await.expect("stored");
    wrong.lease_token = None;
    assert_eq!(
        store.forget(&wrong).await.expect("forget"),
        Forgotten::Changed,
        "a token read as absent does not match a stored one"
    );
    wrong.lease_token = Some("t3".into());
    wrong.in_progress_expiration = None;
    assert_eq!(
        store.forget(&wrong).await.expect("forget"),
        Forgotten::Changed,
        "a lease read as absent does not match a stored one"
    );
    let live = key.get().await.expect("stored");
    assert_eq!(
        store.forget(&live).await.expect("forget"),
        Forgotten::Deleted
    );
    assert!(
        matches!(
            key.complete("t3", None, later).await,
            Err(Error::LeaseLost { .. })
        ),
        "the forgotten claim's worker cannot complete it"
    );
    assert_eq!(
        key.get().await,
        None,
        "and its completion did not recreate it"
    );
}

/// An operator forgets a stuck claim while a delivery takes it over, `rounds` times: the
/// delivery's claim is written either way, and is never the one deleted.
pub async fn forget_never_deletes_a_claim_that_raced_it(store: &dyn IdempotencyStore, rounds: u32) {
    for round in 0..rounds {
        let key = Key::new(store, "forget-race");
        let now = now_ms();
        key.claimed(now, LEASE, "stuck", "a free key is claimed")
            .await;
        let stuck = key.get().await.expect("stored");
        let later = now + LEASE + Duration::from_secs(1);
        let claim = claim_at(&key.id, later, LEASE, "next");
        let (forgot, claimed) = tokio::join!(store.forget(&stuck), store.claim(&claim));
        let forgot = forgot.expect("forget");
        assert!(
            matches!(claimed, Ok(ClaimOutcome::Claimed { .. })),
            "round {round}: the delivery claims whichever came first, got {claimed:?}"
        );
        assert_ne!(
            forgot,
            Forgotten::Absent,
            "round {round}: the record was there"
        );
        assert_eq!(
            key.get().await.and_then(|r| r.lease_token).as_deref(),
            Some("next"),
            "round {round}: the delivery's claim survives the forget ({forgot:?})"
        );
    }
}

/// Pages of a few items at a time find every record under a prefix, and none outside it.
pub async fn list_pages_through_a_prefix(store: &dyn IdempotencyStore) {
    let prefix = unique("list");
    let now = now_ms();
    let mut written = BTreeSet::new();
    for i in 0..5 {
        let id = format!("{prefix}-{i}");
        let outcome = store
            .claim(&claim_at(&id, now, LEASE, "t"))
            .await
            .expect("claim");
        assert!(matches!(outcome, ClaimOutcome::Claimed { .. }));
        written.insert(id);
    }
    // A neighbour whose id the prefix does not start.
    let outside = format!("{}-other", unique("list"));
    store
        .claim(&claim_at(&outside, now, LEASE, "t"))
        .await
        .expect("claim");
    let mut found = BTreeSet::new();
    let mut request = ListRequest::new(prefix.clone(), 2);
    for page_number in 0.. {
        assert!(page_number < 100_000, "a listing ends");
        let page = store.list(&request).await.expect("list");
        assert!(
            page.records.len() <= 2 || store.name() == "redis",
            "a page holds at most its limit, got {}",
            page.records.len()
        );
        assert!(
            page.examined >= page.records.len() + page.unreadable.len(),
            "a page examined at least what it holds: {} for {} records",
            page.examined,
            page.records.len()
        );
        for record in page.records {
            assert!(
                record.id.starts_with(&prefix),
                "{:?} is outside the prefix",
                record.id
            );
            found.insert(record.id);
        }
        assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
        match page.next {
            Some(next) => request = request.after(Some(next)),
            None => break,
        }
    }
    assert_eq!(found, written, "every record under the prefix is listed");

    // Every record: an operator's `list --stuck` names no prefix. One page is enough to
    // know the request is well formed (the store may hold much more than this run's).
    let page = store
        .list(&ListRequest::new("", 2))
        .await
        .expect("a listing without a prefix");
    assert!(page.examined >= page.records.len() + page.unreadable.len());
}

/// Through the handle, over the fault wrapper: a forget whose answer was lost is retried
/// and finds the record gone; a hung one is cut off and retried; a refused listing is
/// retried.
pub async fn forget_and_list_under_faults<S: IdempotencyStore + Clone + 'static>(store: S) {
    let faulty = FaultyStore::new(store);
    let idempotency = Idempotency::builder(faulty.clone())
        .store_attempt_timeout(Duration::from_millis(300))
        .build();
    let key = Key::new(&faulty, "forget-faults");
    let now = now_ms();
    for (fault, answer) in [
        (Fault::AnswerLost, Forgotten::Absent),
        (Fault::Hang, Forgotten::Deleted),
        (Fault::Unavailable, Forgotten::Deleted),
    ] {
        key.claimed(now, LEASE, "t", "a free key is claimed").await;
        let read = idempotency
            .record_by_id(&key.id)
            .await
            .expect("read")
            .expect("stored");
        faulty.inject(StoreOp::Forget, fault, 1);
        let before = faulty.requests(StoreOp::Forget);
        assert_eq!(
            idempotency.forget(&read).await.expect("retried"),
            answer,
            "{fault:?}"
        );
        assert_eq!(
            faulty.requests(StoreOp::Forget) - before,
            2,
            "{fault:?}: one retry"
        );
        assert_eq!(key.get().await, None, "{fault:?}: forgotten");
    }
    // A refused listing is retried, and the pages through the handle find the record.
    key.claimed(now, LEASE, "t", "a free key is claimed").await;
    faulty.inject(StoreOp::List, Fault::Unavailable, 1);
    let mut request = ListRequest::new(key.id.clone(), 100);
    let mut found = Vec::new();
    for _ in 0..100_000 {
        let page = idempotency
            .list(&request)
            .await
            .expect("a refused listing is retried");
        found.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            Some(next) => request = request.after(Some(next)),
            None => break,
        }
    }
    assert_eq!(
        found,
        std::slice::from_ref(&key.id),
        "the handle lists the record"
    );
    let by_id = idempotency.record_by_id(&key.id).await.expect("read");
    assert_eq!(by_id.and_then(|r| r.lease_token).as_deref(), Some("t"));
}

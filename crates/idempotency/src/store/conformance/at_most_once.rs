//! At most once, over the store and through the engine: a lapsed lease is never taken
//! over, and a delivery that finds one fails for good.

use super::LEASE;
use super::op_name;
use super::support::{Key, claim_at, now_ms, unique};
use crate::clock::{Clock, TestClock};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::{Operation, Outcome};
use crate::record::{Claim, Status, epoch_secs};
use crate::store::{ClaimOutcome, IdempotencyStore};
use serde_json::json;
use std::time::{Duration, SystemTime};

/// An at-most-once claim ([`Claim::at_most_once`]) never takes over a lapsed lease: it
/// gets the abandoned record back, unchanged. It takes a free key, an expired record
/// (lapsed lease and all) and its own record (a retry after a lost answer, even once its
/// lease has ended), as any claim does.
pub async fn at_most_once_claims(store: &dyn IdempotencyStore) {
    let once = |id: &str, now, lease, token: &str| claim_at(id, now, lease, token).at_most_once();
    let second = Duration::from_secs(1);
    let now = now_ms();

    let key = Key::new(store, "amo_lapsed");
    key.claimed(now, second, "t1", "a free key is claimed")
        .await;
    let later = now + Duration::from_secs(2);
    match store.claim(&once(&key.id, later, LEASE, "t2")).await {
        Ok(ClaimOutcome::Exists(record)) => {
            assert_eq!(record.lease_token.as_deref(), Some("t1"), "{record:?}");
            assert!(record.is_abandoned_at(later), "{record:?}");
        }
        other => panic!("an at-most-once claim must not take over a lapsed lease, got {other:?}"),
    }
    let kept = key.get().await.expect("the abandoned record stays");
    assert_eq!(
        (kept.status, kept.lease_token.as_deref()),
        (Status::InProgress, Some("t1")),
        "the refused claim changed nothing"
    );
    key.claimed(
        later,
        LEASE,
        "t3",
        "a claim that is not at-most-once still takes it over",
    )
    .await;

    let key = Key::new(store, "amo_expired");
    let mut short = claim_at(&key.id, now, second, "t1");
    short.expiration = now + Duration::from_secs(5);
    store.claim(&short).await.expect("a free key is claimed");
    let outcome = store
        .claim(&once(&key.id, now + Duration::from_secs(7), LEASE, "t2"))
        .await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "an expired record is free for an at-most-once claim, lapsed lease and all, got {outcome:?}"
    );
    assert_eq!(key.get().await.unwrap().lease_token.as_deref(), Some("t2"));

    let key = Key::new(store, "amo_own");
    let own = once(&key.id, now, second, "mine");
    for attempt in ["first", "retried after a lost answer"] {
        let outcome = store.claim(&own).await;
        assert!(
            matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
            "the {attempt} at-most-once claim is written, got {outcome:?}"
        );
    }
    let late = once(&key.id, now + Duration::from_secs(2), second, "mine");
    let outcome = store.claim(&late).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "an at-most-once claim finds its own record after its lease ended, got {outcome:?}"
    );
    let outcome = store.claim(&once(&key.id, now, LEASE, "theirs")).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Exists(_))),
        "another token is refused, got {outcome:?}"
    );

    let key = Key::new(store, "amo_completed");
    key.claimed(now, second, "t1", "a free key is claimed")
        .await;
    key.complete("t1", Some("1"), now + Duration::from_secs(60))
        .await
        .unwrap();
    let outcome = store
        .claim(&once(&key.id, now + Duration::from_secs(2), LEASE, "t2"))
        .await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Exists(ref r)) if r.status == Status::Completed),
        "a completed record answers an at-most-once claim, got {outcome:?}"
    );
}

/// Concurrent at-most-once claims: on a free key and on an expired record exactly one
/// wins; on a lapsed lease none does, and the record is left as it was.
pub async fn at_most_once_races(store: &dyn IdempotencyStore, claimers: usize) {
    let now = now_ms();
    let later = now + Duration::from_secs(7);
    for (name, expires_in, winners) in [
        ("amo_race_free", None, 1),
        ("amo_race_expired", Some(Duration::from_secs(5)), 1),
        ("amo_race_lapsed", Some(Duration::from_secs(60)), 0),
    ] {
        let id = unique(name);
        if let Some(expires_in) = expires_in {
            let mut first = claim_at(&id, now, Duration::from_secs(1), "first");
            first.expiration = now + expires_in;
            store.claim(&first).await.expect("a free key is claimed");
        }
        let claims: Vec<Claim> = (0..claimers)
            .map(|i| claim_at(&id, later, LEASE, &format!("t{i}")).at_most_once())
            .collect();
        let outcomes = futures_util::future::join_all(claims.iter().map(|c| store.claim(c))).await;
        let won = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::Claimed { .. })))
            .count();
        assert_eq!(
            won, winners,
            "{name}: {winners} of {claimers} concurrent at-most-once claims win: {outcomes:?}"
        );
        assert!(
            outcomes.iter().all(|o| o.is_ok()),
            "{name}: no claim may fail: {outcomes:?}"
        );
        if winners == 0 {
            let record = store.get(&id).await.unwrap().expect("the abandoned record");
            assert_eq!(record.lease_token.as_deref(), Some("first"), "{name}");
        }
    }
}

/// Through the engine over `store`, an [at-most-once](Operation::at_most_once)
/// operation: a delivery that finds a crashed run's lapsed claim fails for good with
/// [`Error::ClaimAbandoned`] (when it was claimed, when its lease ended) and runs nothing,
/// however often it comes and however many come at once; one whose function failed runs
/// again; once the record expires the key runs again. A plain operation on the same
/// store still takes over.
pub async fn engine_at_most_once<S: IdempotencyStore + Clone + 'static>(store: S) {
    let clock = TestClock::new(crate::record::from_epoch_secs(
        epoch_secs(SystemTime::now()),
    ));
    let expires_after = Duration::from_secs(3600);
    let idempotency = Idempotency::builder(store.clone())
        .expires_after(expires_after)
        .lease(Duration::from_secs(30))
        .clock(clock.clone())
        .build();
    let op = Operation::new(op_name("at_most_once"), KeyStrategy::field("id"))
        .at_most_once()
        .lease(Duration::from_secs(20));
    let payload = json!({"id": "k"});
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let claimed_at = clock.now();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let crashing = idempotency.execute(&op, &payload, || async move {
        let _ = started_tx.send(());
        std::future::pending::<Result<String, Error>>().await
    });
    tokio::select! {
        _ = crashing => panic!("the crashed call never returns"),
        _ = started_rx => {}
    }
    let claim = store
        .get(&id)
        .await
        .unwrap()
        .expect("the crashed run's claim");
    let lease_end = claim.in_progress_expiration.expect("a lease");
    let lease = lease_end.duration_since(claimed_at).unwrap_or_default();
    assert!(
        (Duration::from_millis(19_999)..Duration::from_secs(21)).contains(&lease),
        "the operation's lease replaces the handle's: {lease:?}"
    );
    clock.advance(Duration::from_secs(21));
    let calls = std::sync::atomic::AtomicU32::new(0);
    let deliver = || async {
        idempotency
            .execute(&op, &payload, || async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, Error>("again".to_string())
            })
            .await
    };
    let (one, two) = tokio::join!(deliver(), deliver());
    for result in [one, two, deliver().await] {
        match result {
            Err(ExecuteError::Idempotency(
                e @ Error::ClaimAbandoned {
                    lease_ended,
                    claimed_at: at,
                    ..
                },
            )) => {
                assert_eq!(lease_ended, lease_end);
                assert_eq!(
                    at.map(epoch_secs),
                    Some(epoch_secs(claimed_at)),
                    "claimed at, to the second"
                );
                assert!(e.is_permanent() && !e.is_retryable());
                let text = e.to_string();
                assert!(text.contains("outcome is unknown"), "{text}");
                assert!(text.contains("lambda-idempotency forget"), "{text}");
            }
            other => panic!("an abandoned claim must fail as ClaimAbandoned, got {other:?}"),
        }
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing ran again"
    );
    let kept = store
        .get(&id)
        .await
        .unwrap()
        .expect("the abandoned claim stays");
    assert_eq!(kept, claim, "the refused deliveries changed nothing");

    // A plain operation of the same name (the same stored id) takes it over.
    let plain = Operation::new(op.name().to_owned(), KeyStrategy::field("id"));
    let (_, outcome) = idempotency
        .execute(&plain, &payload, || async {
            Ok::<_, Error>("took".to_string())
        })
        .await
        .expect("a plain operation takes over");
    assert_eq!(outcome, Outcome::TookOver);

    // A function that fails releases its claim: the next delivery runs.
    let failing = json!({"id": "fails"});
    let failed = idempotency
        .execute(&op, &failing, || async {
            Err::<String, _>(std::io::Error::other("the provider refused"))
        })
        .await;
    assert!(
        matches!(failed, Err(ExecuteError::Function(_))),
        "{failed:?}"
    );
    let (_, outcome) = idempotency
        .execute(&op, &failing, || async {
            Ok::<_, Error>("ran".to_string())
        })
        .await
        .expect("a released key runs again");
    assert_eq!(outcome, Outcome::Executed);

    // An expired abandoned claim frees its key.
    let expiring = json!({"id": "expires"});
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let crashing = idempotency.execute(&op, &expiring, || async move {
        let _ = started_tx.send(());
        std::future::pending::<Result<String, Error>>().await
    });
    tokio::select! {
        _ = crashing => panic!("the crashed call never returns"),
        _ = started_rx => {}
    }
    clock.advance(expires_after + Duration::from_secs(2));
    let (_, outcome) = idempotency
        .execute(&op, &expiring, || async {
            Ok::<_, Error>("fresh".to_string())
        })
        .await
        .expect("an expired claim is free");
    assert_eq!(outcome, Outcome::TookOver);
}

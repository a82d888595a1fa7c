//! The engine over a store: what a backend must make possible for the protocol as a
//! whole (payload validation, replay, request counts, every store fault, leases that an
//! expiry never ends). Each function takes the store by value and wraps it as it needs.

pub use super::at_most_once::engine_at_most_once;
use super::op_name;
use crate::clock::TestClock;
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::{Operation, Outcome};
use crate::record::{Status, epoch_secs};
use crate::store::faulty::{Fault, FaultyStore};
use crate::store::{IdempotencyStore, StoreOp};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Runs every engine behaviour below over `store`.
pub async fn run_all<S: IdempotencyStore + Clone + 'static>(store: S) {
    payload_mismatch(store.clone()).await;
    engine_replays_without_running(store.clone()).await;
    engine_request_counts(store.clone()).await;
    engine_keeps_leases(store.clone()).await;
    engine_at_most_once(store.clone()).await;
    engine_under_faults(store).await;
}

/// Through the engine: the same key with a different payload is refused, and the first
/// call's result is not returned.
pub async fn payload_mismatch<S: IdempotencyStore + 'static>(store: S) {
    let idempotency = Idempotency::new(store);
    let op = Operation::new(op_name("mismatch"), KeyStrategy::field("id")).validate(["prompt"]);
    let first = json!({"id": "k", "prompt": "a"});
    let (v, _) = idempotency
        .execute(&op, &first, || async {
            Ok::<_, Error>("first".to_string())
        })
        .await
        .unwrap();
    assert_eq!(v, "first");
    let second = json!({"id": "k", "prompt": "b"});
    let result = idempotency
        .execute(&op, &second, || async {
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
    let op = Operation::new(op_name("replay"), KeyStrategy::field("id"));
    let payload = json!({"id": "k"});
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    for expected in [Outcome::Executed, Outcome::Replayed] {
        let calls = calls.clone();
        let (v, outcome) = idempotency
            .execute(&op, &payload, || async move {
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

    // The result type changed since the result was stored: a permanent, named failure,
    // and the function does not run again.
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Grown {
        #[allow(dead_code)]
        text: String,
    }
    let changed = idempotency
        .execute(&op, &payload, || async {
            Ok::<_, Error>(Grown {
                text: "again".into(),
            })
        })
        .await;
    match changed {
        Err(ExecuteError::Idempotency(e @ Error::StoredResultIncompatible { .. })) => {
            assert!(e.is_permanent());
            assert!(e.to_string().contains("#[serde(default)]"), "{e}");
            let cause = crate::report(&e);
            assert!(cause.contains("invalid type"), "the serde error: {cause}");
            assert!(!cause.contains("[1,2,3]"), "never the stored data: {cause}");
        }
        other => {
            panic!("an unreadable stored result must be StoredResultIncompatible, got {other:?}")
        }
    }
}

/// What the engine must do under one fault of [`engine_under_faults`].
#[derive(Debug, Clone, Copy)]
enum Then {
    /// The function runs once and its result is stored.
    Completes,
    /// The function fails: its own error comes back, the claim is released (no record is
    /// left), and the next delivery runs the function again.
    ReleasesAfterTheFunctionFails,
    /// Nothing runs: a store error, retryable or not, and no record.
    Refuses {
        /// Whether the error is retryable.
        retryable: bool,
    },
}

/// One row of [`engine_under_faults`]: `fault` on the next `times` requests of `op`, the
/// requests of `op` the engine then makes, and what it must do.
#[derive(Debug, Clone, Copy)]
struct FaultCase {
    name: &'static str,
    op: StoreOp,
    fault: Fault,
    times: u32,
    requests: u64,
    then: Then,
}

/// The engine over `store` under every fault between the store and its caller, each
/// injected by a [`FaultyStore`] around it: the function runs once, the record ends as it
/// should, and the request counts are exact.
///
/// Uses real time with a short attempt timeout: a few seconds in all.
pub async fn engine_under_faults<S: IdempotencyStore + Clone + 'static>(store: S) {
    use Fault::{AnswerLost, Hang, LateApply, Rejected, Unavailable};
    use StoreOp::{Claim, Complete, Release};
    use Then::{Completes, Refuses, ReleasesAfterTheFunctionFails as Released};
    let case = |name, op, fault, times, requests, then| FaultCase {
        name,
        op,
        fault,
        times,
        requests,
        then,
    };
    let attempts = u64::from(crate::config::DEFAULT_MAX_STORE_ATTEMPTS);
    let late = LateApply(FAULT_ATTEMPT_TIMEOUT * 3);
    let (permanent, throttled) = (Refuses { retryable: false }, Refuses { retryable: true });
    // A claim applied with its answer lost, or hanging, or applied late (after the retry
    // won and the result was stored): the retry finds its own record and runs once, and
    // the late write does not reopen the completed record. A completion likewise. A
    // release (the function failed) likewise: the retried release leaves no record. A
    // claim refused outright: one request, no run. Throttled on every attempt: exactly
    // the configured attempts, then the error. Applied with its answer lost on every
    // attempt: the error, and the claim released (no record left to be taken over, or
    // refused as abandoned at most once, although nothing ran).
    #[rustfmt::skip]
    let cases = [
        //    name                    op        fault        times  requests  then
        case("claim_answer_lost",    Claim,    AnswerLost,  1,     2,        Completes),
        case("claim_hang",           Claim,    Hang,        1,     2,        Completes),
        case("claim_late",           Claim,    late,        1,     2,        Completes),
        case("complete_answer_lost", Complete, AnswerLost,  1,     2,        Completes),
        case("complete_hang",        Complete, Hang,        1,     2,        Completes),
        case("release_answer_lost",  Release,  AnswerLost,  1,     2,        Released),
        case("release_hang",         Release,  Hang,        1,     2,        Released),
        case("claim_rejected",       Claim,    Rejected,    1,     1,        permanent),
        case("claim_throttled",      Claim,    Unavailable, 10,    attempts, throttled),
        case("claim_answers_lost",   Claim,    AnswerLost,  10,    attempts, throttled),
    ];

    let faulty = FaultyStore::new(store);
    let idempotency = Idempotency::builder(faulty.clone())
        .store_attempt_timeout(FAULT_ATTEMPT_TIMEOUT)
        .lease(Duration::from_secs(30))
        .build();
    // Each row for a plain operation and an at-most-once one: a claim retried after a
    // fault finds its own record either way, and a failed function releases either way.
    let plain = Operation::new(op_name("faults"), KeyStrategy::field("id"));
    let once = Operation::new(op_name("faults-once"), KeyStrategy::field("id")).at_most_once();
    for (
        op,
        FaultCase {
            name,
            op: at,
            fault,
            times,
            requests,
            then,
        },
    ) in [&plain, &once]
        .into_iter()
        .flat_map(|op| cases.iter().map(move |case| (op, *case)))
    {
        let op = op.clone();
        let name = if op.at_most_once {
            format!("{name} (at most once)")
        } else {
            name.to_owned()
        };
        faulty.clear_faults();
        faulty.reset_requests();
        faulty.inject(at, fault, times);
        let payload =
            json!({"id": format!("{}-{:016x}", name.replace(' ', "_"), fastrand::u64(..))});
        let id = idempotency.idempotency_id(&op, &payload).unwrap();
        let calls = std::sync::atomic::AtomicU32::new(0);
        let result = idempotency
            .execute(&op, &payload, || async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match then {
                    Released => Err(std::io::Error::other("the provider failed")),
                    _ => Ok(format!("answer for {name}")),
                }
            })
            .await;
        let calls = calls.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            faulty.requests(at),
            requests,
            "{name}: {requests} {at:?} requests"
        );
        faulty.clear_faults();
        if let Fault::LateApply(after) = fault {
            // Give the late write time to land before the record is read.
            tokio::time::sleep(after + FAULT_ATTEMPT_TIMEOUT).await;
        }
        let record = faulty.inner().get(&id).await.expect("get");
        match then {
            Completes => {
                let (_, outcome) =
                    result.unwrap_or_else(|e| panic!("{name}: the fault is recovered: {e:?}"));
                assert_eq!((outcome, calls), (Outcome::Executed, 1), "{name}");
                let record = record.unwrap_or_else(|| panic!("{name}: the record is gone"));
                assert_eq!(record.status, Status::Completed, "{name}: {record:?}");
                assert!(record.data.is_some(), "{name}: the result is stored");
            }
            Released => {
                assert!(
                    matches!(result, Err(ExecuteError::Function(_))),
                    "{name}: the function's error comes back, got {result:?}"
                );
                assert!(record.is_none(), "{name}: the released record is gone");
                let (_, outcome) = idempotency
                    .execute(&op, &payload, || async {
                        Ok::<_, std::io::Error>("second try".to_string())
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{name}: the next delivery runs: {e:?}"));
                assert_eq!(outcome, Outcome::Executed, "{name}: run again");
            }
            Refuses { retryable } => {
                assert!(
                    matches!(
                        &result,
                        Err(ExecuteError::Idempotency(Error::Store { retryable: r, .. })) if *r == retryable
                    ),
                    "{name}: a store error, retryable: {retryable}, got {result:?}"
                );
                assert_eq!(calls, 0, "{name}: no call without a claim");
                assert!(record.is_none(), "{name}: no record");
            }
        }
    }
}

/// Attempt timeout of [`engine_under_faults`]: long enough for a real server's answer, a
/// reconnection included, on a loaded two-core machine (300 ms once cut a PostgreSQL
/// release retried after a hang, which the row counts as a third request).
const FAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(600);

/// The engine over `store`: an expiry shorter than the call never lets a duplicate run
/// while the first call's lease is live; huge settings never panic; names that would
/// make two operations share ids are refused.
pub async fn engine_keeps_leases<S: IdempotencyStore + Clone + 'static>(store: S) {
    // An expiry of a minute, a call of five: the duplicate after two minutes is refused.
    let clock = TestClock::new(SystemTime::now());
    let idempotency = Idempotency::builder(store.clone())
        .expires_after(Duration::from_secs(60))
        .lease(Duration::from_secs(300))
        .clock(clock.clone())
        .build();
    let op = Operation::new(op_name("short_expiry"), KeyStrategy::field("id"));
    let payload = json!({"id": "k"});
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = idempotency.execute(&op, &payload, || async move {
        let _ = started_tx.send(());
        let _ = finish_rx.await;
        Ok::<_, Error>("first".to_string())
    });
    let second = async {
        started_rx.await.expect("the first call started");
        clock.advance(Duration::from_secs(120));
        let second = idempotency
            .execute(&op, &payload, || async {
                Ok::<_, Error>("second".to_string())
            })
            .await;
        let id = idempotency.idempotency_id(&op, &payload).unwrap();
        let claimed = store.get(&id).await.unwrap().expect("the claim");
        let _ = finish_tx.send(());
        (second, claimed)
    };
    let (first, (second, claimed)) = tokio::join!(first, second);
    let lease_end = claimed.in_progress_expiration.expect("a lease");
    assert!(
        epoch_secs(claimed.expiration) >= epoch_secs(lease_end),
        "the claim's expiration {:?} is at least its lease end {lease_end:?}",
        claimed.expiration
    );
    assert!(
        matches!(
            second,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "a duplicate after the expiry but within the lease must be refused, got {second:?}"
    );
    let (value, _) = first.expect("the first call completes");
    assert_eq!(value, "first");

    // Huge settings are capped, not a panic on every call (a lease past 12 hours is
    // refused when the handle is built).
    let idempotency = Idempotency::builder(store.clone())
        .expires_after(Duration::MAX)
        .lease(crate::operation::MAX_OPERATION_LEASE)
        .build();
    let op = Operation::new(op_name("huge"), KeyStrategy::field("id"));
    let (value, outcome) = idempotency
        .execute(&op, &payload, || async { Ok::<_, Error>(1u8) })
        .await
        .expect("Duration::MAX settings work");
    assert_eq!((value, outcome), (1, Outcome::Executed));
}

/// Through the engine over `store`, counted by a [`FaultyStore`] around it: the store
/// calls each path costs, the physical minimum. First delivery 2 (claim, complete);
/// completed duplicate 1; in-progress duplicate 1; local cache hit 0; takeover of a
/// crashed worker's claim 2.
pub async fn engine_request_counts<S: IdempotencyStore + Clone + 'static>(store: S) {
    let counted = FaultyStore::new(store);
    let clock = TestClock::new(SystemTime::now());
    let idempotency = Idempotency::builder(counted.clone())
        .lease(Duration::from_secs(30))
        .clock(clock.clone())
        .build();
    let op = Operation::new(op_name("counts"), KeyStrategy::field("id"));
    let answer = || async { Ok::<_, Error>("answer".to_string()) };
    let count = |what: &str, expected: u64| {
        assert_eq!(counted.total_requests(), expected, "{what}");
        counted.reset_requests();
    };

    let first = json!({"id": "first"});
    let (_, outcome) = idempotency.execute(&op, &first, answer).await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    count("first delivery: claim and complete", 2);
    let (_, outcome) = idempotency.execute(&op, &first, answer).await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    count("completed duplicate: one claim answered with the record", 1);

    let busy = json!({"id": "busy"});
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = idempotency.execute(&op, &busy, || async move {
        let _ = started_tx.send(());
        let _ = finish_rx.await;
        Ok::<_, Error>("busy".to_string())
    });
    let duplicate = async {
        started_rx.await.expect("the first call started");
        counted.reset_requests();
        let duplicate = idempotency.execute(&op, &busy, answer).await;
        let calls = counted.total_requests();
        let _ = finish_tx.send(());
        (duplicate, calls)
    };
    let (running, (duplicate, calls)) = tokio::join!(running, duplicate);
    running.expect("the first call completes");
    assert!(
        matches!(
            duplicate,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "{duplicate:?}"
    );
    assert_eq!(calls, 1, "in-progress duplicate: one claim");
    counted.reset_requests();

    let cached = Idempotency::builder(counted.clone()).local_cache(8).build();
    let again = json!({"id": "cached"});
    cached.execute(&op, &again, answer).await.unwrap();
    counted.reset_requests();
    let (_, outcome) = cached.execute(&op, &again, answer).await.unwrap();
    assert_eq!(outcome, Outcome::ReplayedFromCache);
    count("local cache hit: no store call", 0);

    let crashed = json!({"id": "crashed"});
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let dying = idempotency.execute(&op, &crashed, || async move {
        let _ = started_tx.send(());
        std::future::pending::<Result<String, Error>>().await
    });
    tokio::select! {
        _ = dying => panic!("the crashed call never returns"),
        _ = started_rx => {}
    }
    clock.advance(Duration::from_secs(31));
    counted.reset_requests();
    let (_, outcome) = idempotency.execute(&op, &crashed, answer).await.unwrap();
    assert_eq!(outcome, Outcome::TookOver);
    count("takeover: claim and complete", 2);
}

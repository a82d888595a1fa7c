//! Refused writes: a write whose condition fails refuses them all and writes nothing, the
//! refusal is the call's answer, and a store without writes refuses them.

use super::support::{Key, lease, now_ms, op_name};
use super::writes::{KitWrite, WritesKit, engine_with_faults, unique_key};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::Operation;
use crate::record::Status;
use crate::store::faulty::Fault;
use crate::store::memory::MemoryWrites;
use crate::store::writes::WithWrites;
use crate::store::{IdempotencyStore, StoreOp, Writes};
use serde_json::json;
use std::time::Duration;

/// A write whose condition fails refuses them all: nothing written, the record unchanged.
pub async fn a_refused_write_writes_nothing(store: &dyn IdempotencyStore, kit: &dyn WritesKit) {
    let (taken, other) = (unique_key("taken"), unique_key("other"));
    let first = Key::new(store, "writes_first");
    let now = now_ms();
    first
        .claimed(now, Duration::from_secs(30), "t1", "a free key is claimed")
        .await;
    let writes = kit.writes(&[KitWrite::Put(taken.clone(), "first".into())]);
    store
        .complete_with(&lease(&first.id, "t1"), None, now, &writes)
        .await
        .unwrap();
    let key = Key::new(store, "writes_refused");
    key.claimed(now, Duration::from_secs(30), "t2", "a free key is claimed")
        .await;
    let writes = kit.writes(&[
        KitWrite::Put(other.clone(), "x".into()),
        KitWrite::PutNew(taken.clone(), "second".into()),
    ]);
    let answer = store
        .complete_with(&lease(&key.id, "t2"), Some("1"), now, &writes)
        .await;
    assert!(
        matches!(answer, Err(Error::WritesRefused { .. })),
        "a failed condition refuses the writes, got {answer:?}"
    );
    assert_eq!(
        kit.read(&other).await,
        None,
        "no write of the refused set is made"
    );
    assert_eq!(kit.read(&taken).await.as_deref(), Some("first"));
    let record = key.get().await.expect("the claim stays");
    assert_eq!(record.status, Status::InProgress, "not completed");
}

/// Writes refused by their own condition (the user's unique key met again, say, after an
/// operator forgot a record whose writes were made) are the answer: the function runs
/// once, the refusal is kept in the record, and every later delivery answers it without
/// running, as a permanent failure. Its keeping survives a lost answer; a keeping that
/// hangs past the cutoff still answers the refusal. An operation whose refusals are
/// retryable releases the claim instead, and each delivery runs the function.
pub async fn a_refusal_is_the_answer<S>(store: S, kit: &dyn WritesKit)
where
    S: IdempotencyStore + Clone + 'static,
{
    let (faulty, idempotency) = engine_with_faults(store.clone());
    let taken = unique_key("taken");
    let first = Operation::new(op_name("writes_first"), KeyStrategy::field("id"));
    idempotency
        .execute_writing(&first, &json!({"id": unique_key("k")}), || async {
            let writes = kit.writes(&[KitWrite::Put(taken.clone(), "1".into())]);
            Ok::<_, Error>((1, Some(writes)))
        })
        .await
        .expect("the row is written with its record");
    // Each delivery of `payload` under `op`: the calls of its function, its answers.
    let deliver = |op: Operation, payload: serde_json::Value, deliveries: usize| {
        let (idempotency, taken) = (&idempotency, &taken);
        async move {
            let calls = std::sync::atomic::AtomicUsize::new(0);
            let mut answers = Vec::new();
            for _ in 0..deliveries {
                let answer = idempotency
                    .execute_writing(&op, &payload, || async {
                        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let writes = kit.writes(&[KitWrite::PutNew(taken.clone(), "2".into())]);
                        Ok::<_, Error>((2, Some(writes)))
                    })
                    .await;
                answers.push(match answer {
                    Err(ExecuteError::Idempotency(e @ Error::WritesRefused { retryable, .. })) => {
                        let text = e.to_string();
                        let named = ["write 0", "statement 0"].iter().any(|w| text.contains(w));
                        assert!(named, "names the write or statement: {e}");
                        assert_eq!(e.is_permanent(), !retryable, "{e}");
                        assert_eq!(e.is_retryable(), retryable, "{e}");
                        retryable
                    }
                    other => panic!("writes refused by their condition, got {other:?}"),
                });
            }
            (calls.into_inner(), answers)
        }
    };
    let op = Operation::new(op_name("writes_refused"), KeyStrategy::field("id"));
    let payload = json!({"id": unique_key("k")});
    assert_eq!(
        deliver(op.clone(), payload.clone(), 3).await,
        (1, vec![false; 3]),
        "the function runs once; each delivery answers the same permanent refusal"
    );
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let record = store.get(&id).await.unwrap().expect("the refusal is kept");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(kit.read(&taken).await.as_deref(), Some("1"), "unchanged");

    // The keeping's answer lost: retried, kept once.
    faulty.inject(StoreOp::Complete, Fault::Slow(Duration::ZERO), 1);
    faulty.inject(StoreOp::Complete, Fault::AnswerLost, 1);
    let payload = json!({"id": unique_key("k")});
    assert_eq!(
        deliver(op.clone(), payload.clone(), 2).await,
        (1, vec![false; 2])
    );
    faulty.clear_faults();

    // The keeping hangs past the cutoff: the call still ends with the refusal, and the
    // claim stays until its lease ends.
    faulty.inject(StoreOp::Complete, Fault::Slow(Duration::ZERO), 1);
    faulty.inject(StoreOp::Complete, Fault::Hang, 100);
    let payload = json!({"id": unique_key("k")});
    let started = std::time::Instant::now();
    assert_eq!(
        deliver(op.clone(), payload.clone(), 1).await,
        (1, vec![false])
    );
    faulty.clear_faults();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the lease"
    );
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let record = store.get(&id).await.unwrap().expect("the claim stays");
    assert_eq!(record.status, Status::InProgress);

    // Retryable refusals: released, and each delivery runs the function.
    let op = Operation::new(op_name("writes_retried"), KeyStrategy::field("id"))
        .refused_writes_retryable(true);
    let payload = json!({"id": unique_key("k")});
    assert_eq!(
        deliver(op.clone(), payload.clone(), 2).await,
        (2, vec![true; 2])
    );
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    assert_eq!(store.get(&id).await.unwrap(), None, "the claim is released");
}

/// A store without writes refuses them: no record changes, nothing written apart from it.
pub async fn refused_without_writes<S: IdempotencyStore + Clone + 'static>(store: S) {
    let key = Key::new(&store, "writes_unsupported");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(30), "t1", "a free key is claimed")
        .await;
    let writes = Writes::new(MemoryWrites::new().put("t", "k", json!(1)));
    let answer = store
        .complete_with(&lease(&key.id, "t1"), Some("1"), now, &writes)
        .await;
    assert!(
        matches!(answer, Err(Error::WritesUnsupported { .. })),
        "a store without writes refuses them, got {answer:?}"
    );
    assert!(
        !store.commits_writes("memory"),
        "a store without writes says so to check_writes"
    );
    let record = key.get().await.expect("the claim stays");
    assert_eq!(record.status, Status::InProgress);
    // Through the engine: refused, the claim released, so the next delivery runs.
    let idempotency = Idempotency::new(store.clone());
    if idempotency.check_writes::<MemoryWrites>().is_ok() {
        return;
    }
    let op = Operation::new(op_name("writes_unsupported"), KeyStrategy::field("id"));
    let payload = json!({"id": "k"});
    let answer = idempotency
        .execute_committing(&op, &payload, || async {
            Ok::<_, Error>(WithWrites::new(
                1,
                MemoryWrites::new().put("t", "k", json!(1)),
            ))
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(ExecuteError::Idempotency(Error::WritesUnsupported { .. }))
        ),
        "{answer:?}"
    );
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    assert_eq!(store.get(&id).await.unwrap(), None, "the claim is released");
}

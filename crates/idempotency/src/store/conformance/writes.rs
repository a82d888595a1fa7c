//! The function's own writes committed with the completion
//! ([`IdempotencyStore::complete_with`]): all or nothing, fenced by the lease, applied once
//! however often the completion is retried, and, through the engine, under every store
//! fault. A store without writes must refuse them, never write them apart from its record.

pub use super::refusals::{
    a_refusal_is_the_answer, a_refused_write_writes_nothing, refused_without_writes,
};
use super::support::{Key, claim_at, lease, now_ms, op_name};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::{Operation, Outcome};
use crate::record::Status;
use crate::store::faulty::{Fault, FaultyStore};
use crate::store::memory::MemoryWrites;
use crate::store::writes::WithWrites;
use crate::store::{BoxFuture, IdempotencyStore, StoreOp, Writes};
use serde_json::json;
use std::time::Duration;

/// One write the suite asks a store to make, in the store's own form.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KitWrite {
    /// Sets `key` to `value`.
    Put(String, String),
    /// Sets `key` to `value` on condition that it has none: refused otherwise.
    PutNew(String, String),
}

/// How the suite builds a store's writes and reads them back: a backend whose store
/// commits writes gives one to [`run_whole_contract`](super::run_whole_contract).
pub trait WritesKit: Send + Sync {
    /// `writes`, in the store's form ([`Writes::new`] of its writes type), in order.
    fn writes(&self, writes: &[KitWrite]) -> Writes;

    /// The value the store holds under `key`, if any.
    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>>;
}

/// The in-memory store's kit: a table of its own.
#[derive(Debug, Clone)]
pub struct MemoryKit(pub crate::MemoryStore);

impl WritesKit for MemoryKit {
    fn writes(&self, writes: &[KitWrite]) -> Writes {
        Writes::new(
            writes
                .iter()
                .fold(MemoryWrites::new(), |w, write| match write {
                    KitWrite::Put(k, v) => w.put("conformance", k, json!(v)),
                    KitWrite::PutNew(k, v) => w.put_new("conformance", k, json!(v)),
                }),
        )
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>> {
        let value = self.0.table("conformance").get(key).cloned();
        Box::pin(async move { value.and_then(|v| v.as_str().map(str::to_owned)) })
    }
}

/// Runs every check below: the writes contract with `kit`, or, for a store without
/// writes (`None`), that it refuses them.
pub async fn run_all<S>(store: S, kit: Option<&dyn WritesKit>)
where
    S: IdempotencyStore + Clone + 'static,
{
    uncommittable_writes_are_refused_before_the_claim(store.clone()).await;
    let Some(kit) = kit else {
        refused_without_writes(store).await;
        return;
    };
    committed_with_the_completion(&store, kit).await;
    fenced_by_the_lease(&store, kit).await;
    fenced_on_a_record_completed_by_another(&store, kit).await;
    another_store_s_writes_are_refused(&store).await;
    applied_once_however_often_retried(&store, kit).await;
    a_refused_write_writes_nothing(&store, kit).await;
    a_refusal_is_the_answer(store.clone(), kit).await;
    engine_under_faults(store, kit).await;
}

pub(super) fn unique_key(name: &str) -> String {
    format!("{}-{:016x}", name, fastrand::u64(..))
}

/// The record completes with its result, and the writes are there.
pub async fn committed_with_the_completion(store: &dyn IdempotencyStore, kit: &dyn WritesKit) {
    let key = Key::new(store, "writes_committed");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(30), "t1", "a free key is claimed")
        .await;
    let (a, b) = (unique_key("a"), unique_key("b"));
    let writes = kit.writes(&[
        KitWrite::Put(a.clone(), "1".into()),
        KitWrite::PutNew(b.clone(), "2".into()),
    ]);
    store
        .complete_with(&lease(&key.id, "t1"), Some("\"r\""), now, &writes)
        .await
        .expect("a completion with writes on a held lease succeeds");
    let record = key.get().await.expect("the record stays");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.data.as_deref(), Some("\"r\""));
    assert_eq!(
        crate::record::epoch_secs(record.expiration),
        crate::record::epoch_secs(now),
        "the completion's expiration is the one given"
    );
    assert_eq!(kit.read(&a).await.as_deref(), Some("1"));
    assert_eq!(kit.read(&b).await.as_deref(), Some("2"));
}

/// A completion whose lease was taken over writes nothing.
pub async fn fenced_by_the_lease(store: &dyn IdempotencyStore, kit: &dyn WritesKit) {
    let key = Key::new(store, "writes_fenced");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(1), "old", "a free key is claimed")
        .await;
    let later = now + Duration::from_secs(2);
    key.claimed(
        later,
        Duration::from_secs(30),
        "new",
        "a passed lease is taken over",
    )
    .await;
    let a = unique_key("fenced");
    let writes = kit.writes(&[KitWrite::Put(a.clone(), "stale".into())]);
    let answer = store
        .complete_with(&lease(&key.id, "old"), Some("\"stale\""), later, &writes)
        .await;
    assert!(
        matches!(answer, Err(Error::LeaseLost { .. })),
        "a lost lease refuses the writes, got {answer:?}"
    );
    assert_eq!(kit.read(&a).await, None, "nothing written");
    let record = key.get().await.expect("the new owner's record stays");
    assert_eq!(
        (record.status, record.lease_token.as_deref()),
        (Status::InProgress, Some("new"))
    );
}

/// A completion with writes on a record another claim completed is refused, and writes
/// nothing: only the claim's own completed record answers "already written".
pub async fn fenced_on_a_record_completed_by_another(
    store: &dyn IdempotencyStore,
    kit: &dyn WritesKit,
) {
    let key = Key::new(store, "writes_fenced_completed");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(1), "old", "a free key is claimed")
        .await;
    let later = now + Duration::from_secs(2);
    key.claimed(
        later,
        Duration::from_secs(30),
        "new",
        "a passed lease is taken over",
    )
    .await;
    store
        .complete(&lease(&key.id, "new"), Some("\"new\""), later)
        .await
        .unwrap();
    let a = unique_key("fenced_completed");
    let writes = kit.writes(&[KitWrite::Put(a.clone(), "stale".into())]);
    let answer = store
        .complete_with(&lease(&key.id, "old"), Some("\"stale\""), later, &writes)
        .await;
    assert!(
        matches!(answer, Err(Error::LeaseLost { .. })),
        "another claim's completed record refuses the writes, got {answer:?}"
    );
    assert_eq!(kit.read(&a).await, None, "nothing written");
    let record = key.get().await.expect("the new owner's record stays");
    assert_eq!(record.data.as_deref(), Some("\"new\""));
}

/// Writes of a type no store commits.
#[derive(Debug, Default)]
struct Foreign;

impl crate::store::StoreWrites for Foreign {
    const STORE: &'static str = "conformance-foreign";
    fn is_empty(&self) -> bool {
        false
    }
}

/// `execute_committing` with writes of a type the store cannot commit refuses them before
/// it claims: the function does not run, and no store request is made.
pub async fn uncommittable_writes_are_refused_before_the_claim<S>(store: S)
where
    S: IdempotencyStore + Clone + 'static,
{
    let faulty = FaultyStore::new(store);
    let idempotency = Idempotency::new(faulty.clone());
    let op = Operation::new(op_name("writes_uncommittable"), KeyStrategy::field("id"));
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let answer = idempotency
        .execute_committing(&op, &json!({"id": unique_key("k")}), || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(1, Foreign))
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(ExecuteError::Idempotency(Error::WritesUnsupported {
                writes: "conformance-foreign",
                ..
            }))
        ),
        "{answer:?}"
    );
    assert_eq!(
        (calls.into_inner(), faulty.total_requests()),
        (0, 0),
        "refused before the claim: the function did not run"
    );
}

/// Writes built for another store are refused, never applied as if they were the store's.
pub async fn another_store_s_writes_are_refused(store: &dyn IdempotencyStore) {
    assert!(!store.commits_writes("conformance-foreign"));
    let key = Key::new(store, "writes_foreign");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(30), "t1", "a free key is claimed")
        .await;
    let answer = store
        .complete_with(&lease(&key.id, "t1"), Some("1"), now, &Writes::new(Foreign))
        .await;
    assert!(
        matches!(answer, Err(Error::WritesUnsupported { .. })),
        "another store's writes are refused, got {answer:?}"
    );
    assert_eq!(key.get().await.unwrap().status, Status::InProgress);
}

/// A completion repeated after a lost answer succeeds and applies nothing again (a
/// condition on a write would refuse a second application).
pub async fn applied_once_however_often_retried(store: &dyn IdempotencyStore, kit: &dyn WritesKit) {
    let key = Key::new(store, "writes_retried");
    let now = now_ms();
    key.claimed(now, Duration::from_secs(30), "t1", "a free key is claimed")
        .await;
    let a = unique_key("once");
    let writes = kit.writes(&[KitWrite::PutNew(a.clone(), "1".into())]);
    for attempt in 1..=2 {
        store
            .complete_with(&lease(&key.id, "t1"), Some("1"), now, &writes)
            .await
            .unwrap_or_else(|e| panic!("completion attempt {attempt} must succeed, got {e:?}"));
    }
    assert_eq!(kit.read(&a).await.as_deref(), Some("1"));
}

/// A handle over `store` behind the fault wrapper, with a 2 s lease and 200 ms attempts.
/// Its clock follows tokio's, so the lease's cutoff comes on a paused clock too.
pub(super) fn engine_with_faults<S>(store: S) -> (FaultyStore<S>, Idempotency)
where
    S: IdempotencyStore + Clone + 'static,
{
    let faulty = FaultyStore::new(store);
    let idempotency = Idempotency::builder(faulty.clone())
        .clock(crate::clock::TestClock::new(now_ms()))
        .lease(Duration::from_secs(2))
        .store_attempt_timeout(Duration::from_millis(200))
        .build();
    (faulty, idempotency)
}

/// Through the engine, with the store behind the fault wrapper: an answer lost writes
/// once; a completion that hangs past the lease's cutoff is an error, never a success, and
/// writes nothing; a lease lost before the commit writes nothing; a store that refuses the
/// transaction is an error (refusals: [`a_refusal_is_the_answer`]).
pub async fn engine_under_faults<S>(store: S, kit: &dyn WritesKit)
where
    S: IdempotencyStore + Clone + 'static,
{
    let (faulty, idempotency) = engine_with_faults(store.clone());
    let op = Operation::new(op_name("writes_faults"), KeyStrategy::field("id"));
    let run = |payload: serde_json::Value, writes: Vec<KitWrite>| {
        let (idempotency, op) = (&idempotency, &op);
        async move {
            idempotency
                .execute_writing(op, &payload, || async {
                    Ok::<_, Error>(("done".to_string(), Some(kit.writes(&writes))))
                })
                .await
        }
    };

    // A first delivery with its writes costs two requests (the claim and the commit), as
    // one without; a duplicate one (the claim, answered with the record).
    faulty.reset_requests();
    let payload = json!({"id": unique_key("k")});
    let c = unique_key("counted");
    run(payload.clone(), vec![KitWrite::Put(c.clone(), "1".into())])
        .await
        .unwrap();
    assert_eq!(
        (
            faulty.requests(StoreOp::Claim),
            faulty.requests(StoreOp::Complete),
            faulty.total_requests()
        ),
        (1, 1, 2),
        "a claim and one commit"
    );
    let replay = run(payload, vec![KitWrite::PutNew(c, "2".into())]).await;
    assert!(matches!(replay, Ok((_, Outcome::Replayed))), "{replay:?}");
    assert_eq!(
        faulty.total_requests(),
        3,
        "a duplicate costs one request and writes nothing"
    );

    // The answer lost: retried, written once, the record completed.
    let a = unique_key("lost");
    faulty.inject(StoreOp::Complete, Fault::AnswerLost, 1);
    let payload = json!({"id": unique_key("k")});
    let answer = run(
        payload.clone(),
        vec![KitWrite::PutNew(a.clone(), "1".into())],
    )
    .await;
    assert!(
        matches!(answer, Ok((_, Outcome::Executed))),
        "a lost answer is retried and finds its own completion, got {answer:?}"
    );
    assert_eq!(kit.read(&a).await.as_deref(), Some("1"));
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let record = store.get(&id).await.unwrap().expect("completed");
    assert_eq!(record.status, Status::Completed);

    // Every completion hangs until the lease's cutoff: an error, nothing written.
    let h = unique_key("hang");
    faulty.inject(StoreOp::Complete, Fault::Hang, 100);
    let payload = json!({"id": unique_key("k")});
    let answer = run(payload.clone(), vec![KitWrite::Put(h.clone(), "1".into())]).await;
    faulty.clear_faults();
    assert!(
        answer.is_err(),
        "a commit whose outcome is unknown is never a success, got {answer:?}"
    );
    assert_eq!(kit.read(&h).await, None);

    // The lease taken over while the function ran: nothing written.
    let l = unique_key("lease");
    let payload = json!({"id": unique_key("k")});
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let store_ref = &store;
    let answer = idempotency
        .execute_writing(&op, &payload, || async {
            let later = now_ms() + Duration::from_secs(60);
            store_ref
                .claim(&claim_at(&id, later, Duration::from_secs(30), "thief"))
                .await
                .expect("the passed lease is taken over");
            Ok::<_, Error>((1, Some(kit.writes(&[KitWrite::Put(l.clone(), "1".into())]))))
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(ExecuteError::Idempotency(Error::LeaseLost { .. }))
        ),
        "{answer:?}"
    );
    assert_eq!(
        kit.read(&l).await,
        None,
        "a worker that lost its lease writes nothing"
    );

    // A store that refuses the transaction: an error, nothing written.
    let r = unique_key("rejected");
    faulty.inject(StoreOp::Complete, Fault::Rejected, 1);
    let answer = run(
        json!({"id": unique_key("k")}),
        vec![KitWrite::Put(r.clone(), "1".into())],
    )
    .await;
    assert!(answer.is_err(), "{answer:?}");
    assert_eq!(kit.read(&r).await, None);
}

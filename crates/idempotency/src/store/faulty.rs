//! A wrapper that injects faults into any store and counts its requests: the faults that
//! matter for a conditional-write protocol are the ones between the store and its caller.

use super::{
    BoxFuture, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, RecordPage, StoreLimits,
    StoreOp, Writes,
};
use crate::error::Error;
use crate::record::{Claim, Record};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// One fault, taken by the next call of the operation it was injected for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails before reaching the store, retryable (throttling, a 503).
    Unavailable,
    /// Fails before reaching the store, not retryable (a validation or permission error).
    Rejected,
    /// The request is applied, then its answer is lost: the caller sees a retryable error.
    AnswerLost,
    /// The request is never answered and never applied.
    Hang,
    /// The request is never answered, and applied after this long, after the caller
    /// gave up (a request stuck in a queue or a retransmission).
    LateApply(Duration),
    /// The request is answered correctly after this long.
    Slow(Duration),
}

/// Wraps a store, injecting [`Fault`]s per operation and counting requests. For testing
/// how the engine (or your code) handles store faults, over any backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::store::faulty::{Fault, FaultyStore};
/// use lambda_idempotency::store::StoreOp;
/// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
/// use serde_json::json;
///
/// let store = FaultyStore::new(MemoryStore::new());
/// store.inject(StoreOp::Claim, Fault::AnswerLost, 1);
/// let idempotency = Idempotency::new(store.clone());
/// let op = Operation::new("greet", KeyStrategy::field("id"));
/// let answer: Result<String, lambda_idempotency::Error> =
///     idempotency.run(&op, &json!({"id": "1"}), || async { Ok("hi".to_string()) }).await;
/// assert_eq!(answer.unwrap(), "hi", "the retried claim recognised its own record");
/// assert_eq!(store.requests(StoreOp::Claim), 2);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: S,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    faults: Mutex<HashMap<StoreOp, VecDeque<Fault>>>,
    requests: [AtomicU64; StoreOp::ALL.len()],
    /// Nanoseconds spent in the wrapped store's requests (those without a fault).
    busy_nanos: AtomicU64,
}

impl<S: IdempotencyStore + Clone + 'static> FaultyStore<S> {
    /// Wraps `inner`, with no fault queued.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            state: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Queues `fault` for the next `count` calls of `op`.
    pub fn inject(&self, op: StoreOp, fault: Fault, count: u32) {
        let mut faults = self.faults();
        let queue = faults.entry(op).or_default();
        queue.extend(std::iter::repeat_n(fault, count as usize));
    }

    /// Drops every queued fault.
    pub fn clear_faults(&self) {
        self.faults().clear();
    }

    /// How many calls of `op` reached the wrapper (faulty ones included).
    pub fn requests(&self, op: StoreOp) -> u64 {
        self.state.requests[op.index()].load(Ordering::Relaxed)
    }

    /// Calls of all operations.
    pub fn total_requests(&self) -> u64 {
        StoreOp::ALL.iter().map(|op| self.requests(*op)).sum()
    }

    /// Time spent waiting on answered requests (those without a fault, and slow ones),
    /// summed: what a benchmark subtracts to see the caller's own time.
    pub fn time_in_requests(&self) -> Duration {
        Duration::from_nanos(self.state.busy_nanos.load(Ordering::Relaxed))
    }

    /// Sets every counter, and the time in requests, back to zero.
    pub fn reset_requests(&self) {
        for counter in &self.state.requests {
            counter.store(0, Ordering::Relaxed);
        }
        self.state.busy_nanos.store(0, Ordering::Relaxed);
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, HashMap<StoreOp, VecDeque<Fault>>> {
        self.state.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_fault(&self, op: StoreOp) -> Option<Fault> {
        self.state.requests[op.index()].fetch_add(1, Ordering::Relaxed);
        self.faults().get_mut(&op).and_then(VecDeque::pop_front)
    }

    /// Awaits a request that is answered, adding its time to [`time_in_requests`].
    ///
    /// [`time_in_requests`]: Self::time_in_requests
    async fn timed<R>(&self, request: impl Future<Output = R>) -> R {
        let started = std::time::Instant::now();
        let answer = request.await;
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.state.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        answer
    }

    /// Runs `apply` (the real request, owning what it needs) under the next fault of `op`.
    async fn call<R, Fut>(&self, op: StoreOp, apply: impl FnOnce(S) -> Fut) -> Result<R, Error>
    where
        R: Send + 'static,
        Fut: Future<Output = Result<R, Error>> + Send + 'static,
    {
        let name = self.inner.name();
        let injected = |retryable: bool, what: &str| {
            Error::store(name, retryable, format!("injected {op:?} fault: {what}"))
        };
        match self.next_fault(op) {
            None => self.timed(apply(self.inner.clone())).await,
            Some(Fault::Unavailable) => Err(injected(true, "unavailable")),
            Some(Fault::Rejected) => Err(injected(false, "rejected")),
            Some(Fault::AnswerLost) => {
                let _ = apply(self.inner.clone()).await;
                Err(injected(true, "applied, answer lost"))
            }
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::LateApply(after)) => {
                let late = apply(self.inner.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = late.await;
                });
                std::future::pending().await
            }
            Some(Fault::Slow(after)) => {
                self.timed(async move {
                    tokio::time::sleep(after).await;
                    apply(self.inner.clone()).await
                })
                .await
            }
        }
    }
}

impl<S: IdempotencyStore + Clone + 'static> IdempotencyStore for FaultyStore<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        let claim = claim.clone();
        Box::pin(self.call(StoreOp::Claim, move |store| async move {
            store.claim(&claim).await
        }))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let (claim, data) = (claim.clone(), data.map(str::to_owned));
        Box::pin(self.call(StoreOp::Complete, move |store| async move {
            store.complete(&claim, data.as_deref(), expiration).await
        }))
    }

    fn commits_writes(&self, writes: &'static str) -> bool {
        self.inner.commits_writes(writes)
    }

    /// Counted and faulted as a completion ([`StoreOp::Complete`]).
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let (claim, data, writes) = (claim.clone(), data.map(str::to_owned), writes.clone());
        Box::pin(self.call(StoreOp::Complete, move |store| async move {
            store
                .complete_with(&claim, data.as_deref(), expiration, &writes)
                .await
        }))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        let claim = claim.clone();
        Box::pin(self.call(StoreOp::Release, move |store| async move {
            store.release(&claim).await
        }))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        let id = id.to_owned();
        Box::pin(self.call(
            StoreOp::Get,
            move |store| async move { store.get(&id).await },
        ))
    }

    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        let record = record.clone();
        Box::pin(self.call(StoreOp::Forget, move |store| async move {
            store.forget(&record).await
        }))
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        let request = request.clone();
        Box::pin(self.call(StoreOp::List, move |store| async move {
            store.list(&request).await
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{Fault, FaultyStore};
    use crate::MemoryStore;
    use crate::store::{IdempotencyStore, StoreOp};
    use std::time::Duration;

    #[tokio::test]
    async fn answered_requests_are_timed_and_every_request_counted() {
        let store = FaultyStore::new(MemoryStore::new());
        store.inject(StoreOp::Get, Fault::Slow(Duration::from_millis(30)), 1);
        store.get("k").await.unwrap();
        store.inject(StoreOp::Get, Fault::Unavailable, 1);
        assert!(store.get("k").await.is_err());
        assert_eq!(store.requests(StoreOp::Get), 2);
        let busy = store.time_in_requests();
        assert!(
            busy >= Duration::from_millis(30) && busy < Duration::from_secs(5),
            "the slow request's time, not the refused one's: {busy:?}"
        );
        store.reset_requests();
        assert_eq!(
            (store.total_requests(), store.time_in_requests()),
            (0, Duration::ZERO)
        );
    }
}

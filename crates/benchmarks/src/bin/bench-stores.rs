//! Every store side by side: round trips per message and where the time of a message goes
//! (in the store's requests, or in the library itself), for a first delivery and a
//! completed duplicate, one message at a time, the function answering at once. Needs the
//! test servers (`scripts/bench` finds or starts them).

use benchmarks::{typical_body, typical_completion};
use lambda_idempotency::store::{BoxFuture, Claim, ClaimOutcome, IdempotencyStore, Record};
use lambda_idempotency::store::{StoreLimits, StoreOp};
use lambda_idempotency::{Error, Idempotency, Outcome};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use test_support::stores::{Backend, TestStore};

const MESSAGES: usize = 300;

/// Counts a store's requests and the time spent in them.
#[derive(Debug, Default)]
struct Timing {
    requests: [AtomicU64; 4],
    nanos: AtomicU64,
}

#[derive(Debug, Clone)]
struct TimedStore {
    inner: Arc<dyn IdempotencyStore>,
    timing: Arc<Timing>,
}

impl TimedStore {
    fn time<'a, T: Send + 'a>(&'a self, op: StoreOp, call: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let out = call.await;
            self.timing.requests[op.index()].fetch_add(1, Ordering::Relaxed);
            self.timing
                .nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            out
        })
    }
}

impl IdempotencyStore for TimedStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        self.time(StoreOp::Claim, self.inner.claim(claim))
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.time(
            StoreOp::Complete,
            self.inner.complete(claim, data, expiration),
        )
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        self.time(StoreOp::Release, self.inner.release(claim))
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.time(StoreOp::Get, self.inner.get(id))
    }
}

struct Row {
    round_trips: f64,
    wall: Duration,
    p50: Duration,
    in_store: Duration,
}

#[tokio::main]
async fn main() {
    let op = model_worker::Worker::operation();
    let completion = typical_completion();
    println!(
        "## Every store side by side ({MESSAGES} messages per path, one at a time, the function answering at once)\n"
    );
    println!(
        "| store | path | round trips per message | wall per message (mean) | p50 | in the store's requests | the library's own |\n|---|---|---|---|---|---|---|"
    );
    for backend in Backend::ALL {
        let test_store = TestStore::open(backend, "bench-stores").await;
        let timing = Arc::new(Timing::default());
        let store = TimedStore {
            inner: test_store.store.clone(),
            timing: timing.clone(),
        };
        let idempotency = Idempotency::new(store);
        let run = |path: Outcome| {
            let (idempotency, op, completion, timing) = (
                idempotency.clone(),
                op.clone(),
                completion.clone(),
                timing.clone(),
            );
            async move {
                timing.nanos.store(0, Ordering::Relaxed);
                for r in &timing.requests {
                    r.store(0, Ordering::Relaxed);
                }
                let mut each = Vec::with_capacity(MESSAGES);
                let started = Instant::now();
                for i in 0..MESSAGES {
                    let body = typical_body(Some(&format!("bench-{backend}-{i}")));
                    let one = Instant::now();
                    let (_, outcome) = idempotency
                        .execute(&op, &body, || async { Ok::<_, Error>(completion.clone()) })
                        .await
                        .unwrap();
                    each.push(one.elapsed());
                    assert_eq!(outcome, path);
                }
                let wall = started.elapsed() / MESSAGES as u32;
                each.sort();
                let requests: u64 = timing
                    .requests
                    .iter()
                    .map(|r| r.load(Ordering::Relaxed))
                    .sum();
                Row {
                    round_trips: requests as f64 / MESSAGES as f64,
                    wall,
                    p50: each[MESSAGES / 2],
                    in_store: Duration::from_nanos(timing.nanos.load(Ordering::Relaxed))
                        / MESSAGES as u32,
                }
            }
        };
        for (name, path) in [
            ("first delivery", Outcome::Executed),
            ("completed duplicate", Outcome::Replayed),
        ] {
            let row = run(path).await;
            println!(
                "| {backend} | {name} | {:.2} | {:.3} ms | {:.3} ms | {:.3} ms | {:.1} µs |",
                row.round_trips,
                ms(row.wall),
                ms(row.p50),
                ms(row.in_store),
                row.wall.saturating_sub(row.in_store).as_secs_f64() * 1e6,
            );
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

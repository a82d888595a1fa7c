//! Every store side by side: round trips per message and where the time of a message goes
//! (in the store's requests, or in the library itself), for a first delivery and a
//! completed duplicate, one message at a time, the function answering at once. Needs the
//! test servers (`scripts/bench` finds or starts them).

use benchmarks::{typical_body, typical_completion};
use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::{Error, Idempotency, Outcome};
use std::time::{Duration, Instant};
use test_support::stores::{Backend, TestStore};

const MESSAGES: usize = 300;

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
        // The fault wrapper, with no fault queued: it counts requests and their time.
        let store = FaultyStore::new(test_store.store.clone());
        let idempotency = Idempotency::new(store.clone());
        let run = |path: Outcome| {
            let (idempotency, op, completion, store) = (
                idempotency.clone(),
                op.clone(),
                completion.clone(),
                store.clone(),
            );
            async move {
                store.reset_requests();
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
                Row {
                    round_trips: store.total_requests() as f64 / MESSAGES as f64,
                    wall,
                    p50: each[MESSAGES / 2],
                    in_store: store.time_in_requests() / MESSAGES as u32,
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

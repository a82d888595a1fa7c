//! The engine: claims, duplicates, leases, takeovers, retries, limits and keys, over the
//! in-memory store behind the fault wrapper.

use lambda_idempotency::clock::TestClock;
use lambda_idempotency::store::Status;
use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::{
    Error, ExecuteError, Idempotency, KeyStrategy, MemoryStore, Operation, Outcome,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

fn op() -> Operation {
    Operation::new("generate", KeyStrategy::field("request_id")).validate(["prompt"])
}

fn payload(id: &str) -> Value {
    json!({"request_id": id, "prompt": "hi"})
}

/// Runs `op` once on `payload`, counting calls in `calls`.
async fn call(
    idem: &Idempotency,
    payload: &Value,
    calls: &AtomicU32,
) -> Result<(String, Outcome), ExecuteError<String>> {
    idem.execute(&op(), payload, || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>("answer".to_string())
    })
    .await
}

#[tokio::test]
async fn local_cache_answers_duplicates_without_the_store() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone()).local_cache(16).build();
    let calls = AtomicU32::new(0);
    call(&idem, &payload("a"), &calls).await.unwrap();
    let before = store.total_requests();
    let (_, outcome) = call(&idem, &payload("a"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::ReplayedFromCache);
    assert_eq!(
        store.total_requests(),
        before,
        "a cache hit makes no store request"
    );
    let other = json!({"request_id": "a", "prompt": "changed"});
    let mismatch = call(&idem, &other, &calls).await;
    assert!(matches!(
        mismatch,
        Err(ExecuteError::Idempotency(Error::PayloadMismatch { .. }))
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn in_progress_duplicate_is_refused_with_one_request() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.execute(&op(), &payload("slow"), || async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, String>("done".to_string())
            })
            .await
        })
    };
    started_rx.await.unwrap();
    let before = store.total_requests();
    let calls = AtomicU32::new(0);
    let dup = call(&idem, &payload("slow"), &calls).await;
    assert!(
        matches!(
            dup,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "got {dup:?}"
    );
    assert_eq!(
        store.total_requests() - before,
        1,
        "in-progress duplicate: one claim"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    finish_tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap().1, Outcome::Executed);
    let (v, outcome) = call(&idem, &payload("slow"), &calls).await.unwrap();
    assert_eq!((v.as_str(), outcome), ("done", Outcome::Replayed));
}

#[tokio::test]
async fn function_error_releases_and_returns_the_functions_error() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let result = idem
        .execute(&op(), &payload("e"), || async {
            Err::<String, _>("provider said 503".to_string())
        })
        .await;
    match result {
        Err(ExecuteError::Function(e)) => assert_eq!(e, "provider said 503"),
        other => panic!("expected the function's own error, got {other:?}"),
    }
    assert!(store.inner().is_empty(), "the claim was released");
    let calls = AtomicU32::new(0);
    let (_, outcome) = call(&idem, &payload("e"), &calls).await.unwrap();
    assert_eq!(
        (outcome, calls.load(Ordering::SeqCst)),
        (Outcome::Executed, 1)
    );
}

/// On tokio's paused clock, which the test clock follows: no wall-clock margins.
fn paused_clock() -> TestClock {
    TestClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
}

#[tokio::test(start_paused = true)]
async fn crashed_worker_is_taken_over_after_its_lease() {
    let store = FaultyStore::new(MemoryStore::new());
    let clock = paused_clock();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(1200))
        .clock(clock.clone())
        .build();
    // A worker that dies mid-call: its future is dropped while the function runs.
    let (crash_op, crash_payload) = (op(), payload("c"));
    let crashed = idem.execute(&crash_op, &crash_payload, || async {
        std::future::pending::<()>().await;
        Ok::<_, String>("never".to_string())
    });
    let _ = tokio::time::timeout(Duration::from_millis(50), crashed).await;
    let calls = AtomicU32::new(0);
    assert!(matches!(
        call(&idem, &payload("c"), &calls).await,
        Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
    ));
    // The lease ends 1200 ms after the claim: held at its last millisecond...
    tokio::time::sleep(Duration::from_millis(1150)).await;
    assert!(matches!(
        call(&idem, &payload("c"), &calls).await,
        Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
    ));
    // ...and taken over one millisecond after it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (_, outcome) = call(&idem, &payload("c"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::TookOver);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn lease_comes_from_the_invocation_deadline() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let deadline = SystemTime::now() + Duration::from_secs(42);
    let calls = AtomicU32::new(0);
    let s = store.clone();
    idem.execute_until(&op(), &payload("d"), deadline, || async {
        let id = "local.generate#d";
        let lease = s
            .inner()
            .record(id)
            .unwrap()
            .in_progress_expiration
            .unwrap();
        let diff = lease
            .duration_since(deadline)
            .unwrap_or_else(|e| e.duration());
        assert!(
            diff < Duration::from_millis(1),
            "lease {lease:?} is the deadline {deadline:?}"
        );
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(String::new())
    })
    .await
    .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn completion_is_retried_through_store_errors() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(30))
        .build();
    store.inject(StoreOp::Complete, Fault::Unavailable, 4);
    let calls = AtomicU32::new(0);
    let (_, outcome) = call(&idem, &payload("r"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert_eq!(
        store.requests(StoreOp::Complete),
        5,
        "four failures, then success"
    );
    assert_eq!(
        store.inner().record("local.generate#r").unwrap().status,
        Status::Completed
    );
    let (_, outcome) = call(&idem, &payload("r"), &calls).await.unwrap();
    assert_eq!(
        (outcome, calls.load(Ordering::SeqCst)),
        (Outcome::Replayed, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn completion_gives_up_before_the_lease_ends() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(1500))
        .clock(paused_clock())
        .build();
    store.inject(StoreOp::Complete, Fault::Unavailable, 1000);
    let calls = AtomicU32::new(0);
    let started = tokio::time::Instant::now();
    let (_, outcome) = call(&idem, &payload("g"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::ExecutedUnstored);
    // The cutoff is the lease less a tenth of it (150 ms); no retry starts past it, so the
    // last one started at most one backoff (at most 1 s) before.
    let gave_up = started.elapsed();
    assert!(
        gave_up <= Duration::from_millis(1350) && gave_up >= Duration::from_millis(350),
        "gave up at {gave_up:?}, before the cutoff and not long before it"
    );
    assert!(
        store.requests(StoreOp::Complete) >= 5,
        "retried with growing backoff until the cutoff: {}",
        store.requests(StoreOp::Complete)
    );
    assert_eq!(
        store.inner().record("local.generate#g").unwrap().status,
        Status::InProgress
    );
}

#[tokio::test(start_paused = true)]
async fn zombie_worker_gets_lease_lost() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(1000))
        .clock(paused_clock())
        .build();
    let (takeover_tx, takeover_rx) = tokio::sync::oneshot::channel::<()>();
    let zombie = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.execute(&op(), &payload("z"), || async move {
                takeover_rx.await.unwrap();
                Ok::<_, String>("stale".to_string())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let calls = AtomicU32::new(0);
    let (_, outcome) = call(&idem, &payload("z"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::TookOver);
    takeover_tx.send(()).unwrap();
    let result = zombie.await.unwrap();
    assert!(
        matches!(
            result,
            Err(ExecuteError::Idempotency(Error::LeaseLost { .. }))
        ),
        "got {result:?}"
    );
    let record = store.inner().record("local.generate#z").unwrap();
    assert_eq!(
        record.data.as_deref(),
        Some("\"answer\""),
        "the new owner's result survives"
    );
}

#[tokio::test]
async fn oversized_result_is_refused_and_never_rerun() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let calls = Arc::new(AtomicU32::new(0));
    for _ in 0..2 {
        let calls = calls.clone();
        let result = idem
            .execute(&op(), &payload("big"), || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("x".repeat(500 * 1024))
            })
            .await;
        assert!(
            matches!(
                result,
                Err(ExecuteError::Idempotency(
                    Error::ResultTooLarge { .. } | Error::ResultNotStored { .. }
                ))
            ),
            "got {result:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the function ran once");
    let record = store.inner().record("local.generate#big").unwrap();
    assert_eq!((record.status, record.data), (Status::Completed, None));
}

#[tokio::test]
async fn keys_are_checked_before_any_store_request() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let calls = AtomicU32::new(0);
    let missing = call(&idem, &json!({"prompt": "hi"}), &calls).await;
    assert!(matches!(
        missing,
        Err(ExecuteError::Idempotency(Error::KeyMissing { .. }))
    ));
    let long = call(&idem, &payload(&"k".repeat(3000)), &calls).await;
    assert!(
        matches!(long, Err(ExecuteError::Idempotency(Error::KeyTooLong { len, max: 2048, .. })) if len > 3000)
    );
    assert_eq!(
        (store.total_requests(), calls.load(Ordering::SeqCst)),
        (0, 0)
    );
}

#[tokio::test]
async fn operations_and_prefixes_keep_keys_apart() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone())
        .function_name("worker")
        .build();
    let p = payload("same");
    let a = Operation::new("summarise", KeyStrategy::field("request_id"));
    let b = Operation::new("translate", KeyStrategy::field("request_id"));
    let c = Operation::new("renamed", KeyStrategy::field("request_id")).key_prefix("stable");
    assert_eq!(
        idem.idempotency_id(&a, &p).unwrap(),
        "worker.summarise#same"
    );
    assert_eq!(
        idem.idempotency_id(&b, &p).unwrap(),
        "worker.translate#same"
    );
    assert_eq!(idem.idempotency_id(&c, &p).unwrap(), "stable#same");
}

#[tokio::test]
async fn disabled_runs_every_call() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone()).disabled(true).build();
    let calls = AtomicU32::new(0);
    for _ in 0..2 {
        let (_, outcome) = call(&idem, &payload("x"), &calls).await.unwrap();
        assert_eq!(outcome, Outcome::Disabled);
    }
    assert_eq!(
        (calls.load(Ordering::SeqCst), store.total_requests()),
        (2, 0)
    );
}

#[tokio::test]
async fn claim_retries_throttling_within_bounds() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    store.inject(StoreOp::Claim, Fault::Unavailable, 2);
    let calls = AtomicU32::new(0);
    assert_eq!(
        call(&idem, &payload("t"), &calls).await.unwrap().1,
        Outcome::Executed
    );
    store.inject(StoreOp::Claim, Fault::Unavailable, 3);
    let err = call(&idem, &payload("u"), &calls).await.unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::Idempotency(Error::Store {
                backend: "memory",
                retryable: true,
                ..
            })
        ),
        "three failed attempts surface as a store error, got {err:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no call without a claim");
}

/// A fixed lease longer than the invocation has left is cut at the deadline: store
/// retries never outlive the invocation (Lambda would kill it, losing its answer).
#[tokio::test(start_paused = true)]
async fn a_fixed_lease_never_outlives_the_invocation() {
    use lambda_idempotency::clock::Clock;
    let store = FaultyStore::new(MemoryStore::new());
    store.inject(StoreOp::Complete, Fault::Unavailable, 100_000);
    let clock = paused_clock();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(900))
        .clock(clock.clone())
        .build();
    let deadline = clock.now() + Duration::from_secs(5);
    let started = tokio::time::Instant::now();
    let (_, outcome) = idem
        .execute_until(&op(), &payload("f"), deadline, || async {
            Ok::<_, String>("answer".to_string())
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::ExecutedUnstored);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5) - Duration::from_millis(500),
        "the call returned {took:?} after it started, not before its 5 s deadline"
    );
    let record = store.inner().record("local.generate#f").unwrap();
    assert_eq!(
        record.in_progress_expiration,
        Some(deadline),
        "the lease is the deadline, not 900 s"
    );
}

/// Ids up to the store's key limit are used; one byte more is refused, and the error's
/// prefix is cut on a character boundary, never past 64 bytes.
#[tokio::test]
async fn ids_at_the_store_key_limit() {
    let idem = Idempotency::new(MemoryStore::new());
    let prefix = "local.generate#";
    let fits = "k".repeat(2048 - prefix.len());
    let id = idem.idempotency_id(&op(), &payload(&fits)).unwrap();
    assert_eq!(id.len(), 2048, "an id of exactly the limit is used");
    let over = format!("{}é{}", "a".repeat(48), "b".repeat(2048));
    match idem.idempotency_id(&op(), &payload(&over)) {
        Err(Error::KeyTooLong {
            key_prefix,
            len,
            max,
        }) => {
            assert_eq!((len, max), (prefix.len() + over.len(), 2048));
            assert_eq!(key_prefix, format!("{prefix}{}", "a".repeat(48)));
        }
        other => panic!("expected KeyTooLong, got {other:?}"),
    }
    let one_over = "k".repeat(2049 - prefix.len());
    assert!(matches!(
        idem.idempotency_id(&op(), &payload(&one_over)),
        Err(Error::KeyTooLong { len: 2049, .. })
    ));
}

/// The size check counts every part of the record: the id, the result, the lease token
/// (40 bytes), the validation hash (64) and the store's overhead (256). A result that
/// makes the record exactly the limit is stored; one byte more is refused.
#[tokio::test]
async fn results_at_the_store_record_limit() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let id_len = "local.generate#".len() + 1;
    // The result is a JSON string: its stored form has two quotes more.
    let fits = 400 * 1024 - 256 - id_len - 40 - 64 - 2;
    for (key, len, stored) in [("a", fits, true), ("b", fits + 1, false)] {
        let result = idem
            .execute(&op(), &payload(key), || async {
                Ok::<_, String>("x".repeat(len))
            })
            .await;
        match (stored, result) {
            (true, Ok((value, Outcome::Executed))) => assert_eq!(value.len(), len),
            (false, Err(ExecuteError::Idempotency(Error::ResultTooLarge { size, max, .. }))) => {
                assert_eq!((size, max), (400 * 1024 + 1, 400 * 1024))
            }
            (stored, other) => panic!("result of {len} bytes (stored: {stored}): {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_function_that_panics_releases_its_claim_and_the_panic_goes_on() {
    let store = FaultyStore::new(MemoryStore::new());
    let idempotency = Idempotency::new(store.clone());
    let panicked = tokio::spawn({
        let idempotency = idempotency.clone();
        async move {
            let _: Result<String, Error> = idempotency
                .run(&op(), &payload("p-1"), || async {
                    panic!("the function panicked")
                })
                .await;
        }
    })
    .await
    .unwrap_err();
    assert!(panicked.is_panic());
    assert_eq!(store.requests(StoreOp::Release), 1);
    // The next delivery runs at once, not after the lease.
    let (value, outcome) = idempotency
        .execute(&op(), &payload("p-1"), || async {
            Ok::<_, Error>("ran".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((value.as_str(), outcome), ("ran", Outcome::Executed));
}

/// Every setting of the handle at 0 and at its maximum (the lease at the ends of its
/// range): none panics or wraps. A call runs,
/// its duplicate is answered from the record, and a store that fails once is retried.
#[tokio::test]
async fn every_handle_setting_works_at_zero_and_at_its_maximum() {
    type Setting =
        fn(lambda_idempotency::IdempotencyBuilder) -> lambda_idempotency::IdempotencyBuilder;
    let settings: [(&str, Setting); 12] = [
        ("expires_after(0)", |b| b.expires_after(Duration::ZERO)),
        ("expires_after(MAX)", |b| b.expires_after(Duration::MAX)),
        ("lease(1 s)", |b| b.lease(Duration::from_secs(1))),
        ("lease(12 h)", |b| b.lease(Duration::from_secs(12 * 3600))),
        ("local_cache(0)", |b| b.local_cache(0)),
        ("local_cache(MAX)", |b| b.local_cache(usize::MAX)),
        ("max_claim_attempts(0)", |b| b.max_claim_attempts(0)),
        ("max_claim_attempts(MAX)", |b| {
            b.max_claim_attempts(u32::MAX)
        }),
        ("max_store_attempts(0)", |b| b.max_store_attempts(0)),
        ("max_store_attempts(MAX)", |b| {
            b.max_store_attempts(u32::MAX)
        }),
        ("store_attempt_timeout(0)", |b| {
            b.store_attempt_timeout(Duration::ZERO)
        }),
        ("store_attempt_timeout(MAX)", |b| {
            b.store_attempt_timeout(Duration::MAX)
        }),
    ];
    for (name, setting) in settings {
        let store = FaultyStore::new(MemoryStore::new());
        let idem = setting(Idempotency::builder(store.clone())).build();
        let calls = AtomicU32::new(0);
        let first = call(&idem, &payload("a"), &calls).await;
        assert_eq!(first.unwrap().1, Outcome::Executed, "{name}");
        let (_, again) = call(&idem, &payload("a"), &calls).await.unwrap();
        assert!(
            matches!(again, Outcome::Replayed | Outcome::ReplayedFromCache),
            "{name}: {again:?}"
        );
        // Within an invocation (a deadline), through a store error.
        store.inject(StoreOp::Claim, Fault::Unavailable, 1);
        let deadline = SystemTime::now() + Duration::from_secs(30);
        let result = idem
            .execute_until(&op(), &payload("b"), deadline, || async {
                Ok::<_, String>("answer".to_string())
            })
            .await;
        if name == "max_store_attempts(0)" {
            // One attempt: the store's error is the answer.
            assert!(
                matches!(result, Err(ExecuteError::Idempotency(Error::Store { .. }))),
                "{name}: {result:?}"
            );
        } else {
            assert_eq!(result.unwrap().1, Outcome::Executed, "{name}");
        }
        let record = store.inner().record("local.generate#a").unwrap();
        assert_eq!(record.status, Status::Completed, "{name}");
    }
}

#[test]
fn check_writes_asks_the_store_through_its_wrappers_and_refuses_a_disabled_handle() {
    use lambda_idempotency::store::faulty::FaultyStore;
    use lambda_idempotency::store::memory::MemoryWrites;
    struct Elsewhere;
    impl lambda_idempotency::store::StoreWrites for Elsewhere {
        const STORE: &'static str = "elsewhere";
        fn is_empty(&self) -> bool {
            true
        }
    }
    let store = MemoryStore::new();
    let wrapped = Idempotency::new(std::sync::Arc::new(FaultyStore::new(store.clone())));
    assert!(wrapped.check_writes::<MemoryWrites>().is_ok());
    let other = wrapped.check_writes::<Elsewhere>().unwrap_err();
    assert!(
        matches!(
            other,
            Error::WritesUnsupported {
                store: "memory",
                writes: "elsewhere"
            }
        ),
        "{other:?}"
    );
    let disabled = Idempotency::builder(store).disabled(true).build();
    let refused = disabled.check_writes::<MemoryWrites>().unwrap_err();
    assert!(refused.to_string().contains("disabled"), "{refused}");
}

/// At most once: a crashed run's claim is never taken over, however late the next
/// delivery comes before the record expires. It fails for good with `ClaimAbandoned`,
/// naming when the claim was made and its lease ended, and runs nothing.
#[tokio::test(start_paused = true)]
async fn an_at_most_once_operation_never_takes_over_a_crashed_run() {
    use lambda_idempotency::clock::Clock;
    let store = FaultyStore::new(MemoryStore::new());
    let clock = paused_clock();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(600))
        .clock(clock.clone())
        .build();
    let once = op().at_most_once().lease(Duration::from_secs(2));
    let claimed_at = clock.now();
    let pay = payload("pay");
    let crashed = idem.execute(&once, &pay, || async {
        std::future::pending::<()>().await;
        Ok::<_, String>("never".to_string())
    });
    let _ = tokio::time::timeout(Duration::from_millis(50), crashed).await;
    let record = store.inner().record("local.generate#pay").unwrap();
    assert_eq!(
        record.in_progress_expiration,
        Some(claimed_at + Duration::from_secs(2)),
        "the operation's lease, not the handle's"
    );
    let calls = AtomicU32::new(0);
    let run = || {
        idem.execute(&once, &pay, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("again".to_string())
        })
    };
    assert!(
        matches!(
            run().await,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "within its lease the run is in progress"
    );
    for wait in [Duration::from_secs(2), Duration::from_secs(86_400)] {
        tokio::time::sleep(wait).await;
        store.reset_requests();
        match run().await {
            Err(ExecuteError::Idempotency(
                e @ Error::ClaimAbandoned {
                    lease_ended,
                    claimed_at: at,
                    ..
                },
            )) => {
                assert_eq!(lease_ended, claimed_at + Duration::from_secs(2));
                assert_eq!(at, Some(claimed_at), "the claim's second, from its expiry");
                let text = e.to_string();
                assert!(text.contains("outcome is unknown"), "{text}");
                assert!(text.contains("2027-01-15T08:00:00.000Z"), "{text}");
                assert!(
                    text.contains("lambda-idempotency forget 'local.generate#pay'"),
                    "{text}"
                );
            }
            other => panic!("expected ClaimAbandoned, got {other:?}"),
        }
        assert_eq!(store.total_requests(), 1, "one claim, nothing else");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never run again");
    // A wrong payload under the key is still a mismatch first.
    let other = json!({"request_id": "pay", "prompt": "other"});
    let mismatch = idem
        .execute(&once, &other, || async { Ok::<_, String>(String::new()) })
        .await;
    assert!(
        matches!(
            mismatch,
            Err(ExecuteError::Idempotency(Error::PayloadMismatch { .. }))
        ),
        "{mismatch:?}"
    );
}

/// At most once, the other ways a claim ends: a function that fails releases it (the
/// next delivery runs), a result lost to the store leaves it (the next delivery finds it
/// abandoned: the function did run), and a record that expired frees the key.
#[tokio::test(start_paused = true)]
async fn at_most_once_releases_on_an_error_and_holds_after_a_lost_result() {
    let store = FaultyStore::new(MemoryStore::new());
    let clock = paused_clock();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(5))
        .expires_after(Duration::from_secs(60))
        .clock(clock.clone())
        .build();
    let once = op().at_most_once();
    let failed = idem
        .execute(&once, &payload("e"), || async {
            Err::<String, _>("the provider said 500".to_string())
        })
        .await;
    assert!(
        matches!(failed, Err(ExecuteError::Function(_))),
        "{failed:?}"
    );
    let calls = AtomicU32::new(0);
    let (_, outcome) = idem
        .execute(&once, &payload("e"), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("ran".to_string())
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed, "a released key runs again");

    store.inject(StoreOp::Complete, Fault::Unavailable, 100_000);
    let (_, outcome) = idem
        .execute(&once, &payload("lost"), || async {
            Ok::<_, String>("paid".to_string())
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::ExecutedUnstored);
    store.clear_faults();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = idem
        .execute(&once, &payload("lost"), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("paid twice".to_string())
        })
        .await;
    assert!(
        matches!(
            again,
            Err(ExecuteError::Idempotency(Error::ClaimAbandoned { .. }))
        ),
        "a run whose result was lost did run: {again:?}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (_, outcome) = idem
        .execute(&once, &payload("lost"), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("after expiry".to_string())
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::TookOver,
        "an expired record frees the key"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An operation's lease is checked when it is built: under a second or over 12 hours
/// is refused (a zero lease leaves nothing to run in; `Duration::MAX` would hold a
/// crashed claim for centuries), with the setting named.
#[test]
fn an_operation_lease_is_checked_when_it_is_built() {
    for lease in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(12 * 3600 + 1),
        Duration::MAX,
    ] {
        match op().try_lease(lease) {
            Err(e @ Error::InvalidName { what: "lease", .. }) => {
                assert!(e.to_string().contains("1 second to 12 hours"), "{e}");
            }
            other => panic!("{lease:?}: {other:?}"),
        }
        assert!(
            std::panic::catch_unwind(|| op().lease(lease)).is_err(),
            "{lease:?}"
        );
    }
    for lease in [Duration::from_secs(1), Duration::from_secs(12 * 3600)] {
        op().try_lease(lease).unwrap();
    }
}

/// An operation's lease never outlives the invocation, as the handle's never does.
#[tokio::test(start_paused = true)]
async fn an_operation_lease_is_cut_at_the_deadline() {
    use lambda_idempotency::clock::Clock;
    let store = FaultyStore::new(MemoryStore::new());
    let clock = paused_clock();
    let idem = Idempotency::builder(store.clone())
        .clock(clock.clone())
        .build();
    let deadline = clock.now() + Duration::from_secs(5);
    let s = store.clone();
    idem.execute_until(
        &op().lease(Duration::from_secs(900)),
        &payload("d"),
        deadline,
        || async move {
            let lease = s
                .inner()
                .record("local.generate#d")
                .unwrap()
                .in_progress_expiration;
            assert_eq!(lease, Some(deadline), "the deadline, not 900 s");
            Ok::<_, String>("answer".to_string())
        },
    )
    .await
    .unwrap();
    let short = clock.now();
    let s = store.clone();
    idem.execute_until(
        &op().lease(Duration::from_secs(2)),
        &payload("s"),
        deadline,
        || async move {
            let lease = s
                .inner()
                .record("local.generate#s")
                .unwrap()
                .in_progress_expiration;
            assert_eq!(
                lease,
                Some(short + Duration::from_secs(2)),
                "shorter than the deadline"
            );
            Ok::<_, String>("answer".to_string())
        },
    )
    .await
    .unwrap();
}

/// Runs `call` within an invocation of `tenant` (none for `None`).
async fn as_tenant<F: std::future::Future>(tenant: Option<&str>, call: F) -> F::Output {
    let mut context = lambda_runtime::Context::default();
    context.tenant_id = tenant.map(str::to_owned);
    lambda_idempotency::with_context(&context, call).await
}

#[tokio::test]
async fn tenants_never_share_a_record_and_untenanted_ids_stay_as_they_were() {
    let idem = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let calls = AtomicU32::new(0);
    let mut outcomes = Vec::new();
    for tenant in [Some("a"), Some("b"), Some("a"), Some("b"), None, Some("")] {
        let (_, outcome) = as_tenant(tenant, call(&idem, &payload("k"), &calls))
            .await
            .unwrap();
        outcomes.push(outcome);
    }
    use Outcome::{Executed, Replayed};
    // An empty tenant id is no tenant: it shares the untenanted record.
    assert_eq!(
        outcomes,
        [Executed, Executed, Replayed, Replayed, Executed, Replayed]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let ids = |tenant| async move {
        let idem = Idempotency::builder(MemoryStore::new())
            .function_name("fn")
            .build();
        as_tenant(tenant, async { idem.idempotency_id(&op(), &payload("k")) })
            .await
            .unwrap()
    };
    assert_eq!(ids(None).await, "fn.generate#k");
    assert_eq!(ids(Some("a")).await, "#a#fn.generate#k");
    assert_eq!(ids(Some("a#b%")).await, "#a%23b%25#fn.generate#k");
    // The tenant counts against the store's longest id.
    let long = "t".repeat(2048);
    let idem = Idempotency::new(MemoryStore::new());
    let too_long = as_tenant(Some(&long), call(&idem, &payload("k"), &calls)).await;
    assert!(
        matches!(
            too_long,
            Err(ExecuteError::Idempotency(Error::KeyTooLong { .. }))
        ),
        "{too_long:?}"
    );
}

/// The replay hook sees every replay (from the claim that finds the record completed, from
/// the local cache) with its record, and never an execution.
#[tokio::test]
async fn the_replay_hook_changes_every_replay_and_no_execution() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let op = {
        let seen = seen.clone();
        op().on_replay(move |stored, replay| {
            seen.lock()
                .unwrap()
                .push((replay.id.clone(), replay.from_cache));
            assert!(replay.expiration > SystemTime::now());
            json!(format!("{} (replayed)", stored.as_str().unwrap()))
        })
    };
    assert!(format!("{op:?}").contains("ReplayHook(set)"));
    let calls = AtomicU32::new(0);
    let run = |idem: Idempotency| {
        let (op, calls) = (op.clone(), &calls);
        async move {
            idem.execute(&op, &payload("r"), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("answer".to_string())
            })
            .await
            .unwrap()
        }
    };
    let store = MemoryStore::new();
    let idem = || Idempotency::builder(store.clone()).function_name("fn");
    let cached = idem().local_cache(4).build();
    assert_eq!(
        run(cached.clone()).await,
        ("answer".into(), Outcome::Executed)
    );
    assert!(seen.lock().unwrap().is_empty(), "never on an execution");
    let replayed = ("answer (replayed)".to_string(), Outcome::Replayed);
    assert_eq!(run(idem().build()).await, replayed);
    let from_cache = ("answer (replayed)".to_string(), Outcome::ReplayedFromCache);
    assert_eq!(run(cached).await, from_cache);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("fn.generate#r".to_string(), false),
            ("fn.generate#r".to_string(), true)
        ]
    );

    // A hook whose answer is not the function's type: its own error, the stored result
    // kept, the function not run again.
    let wrong = crate::op().on_replay(|_, _| json!({"not": "a string"}));
    let answer = Idempotency::builder(store.clone())
        .function_name("fn")
        .build()
        .execute(&wrong, &payload("r"), || async {
            Ok::<String, String>("again".into())
        })
        .await;
    let Err(ExecuteError::Idempotency(e @ Error::ReplayAnswerIncompatible { .. })) = &answer else {
        panic!("the hook's answer is refused, got {answer:?}");
    };
    assert!(
        !e.is_permanent() && !e.is_retryable(),
        "fixing the hook heals it"
    );
    assert!(e.to_string().contains("replay hook"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not run again");
}

/// What a call for `payload("busy")` under `op` returns while another call holds its key
/// (the outer call, here: outside a batch a nested call meets it in the store).
async fn while_in_progress<T>(
    idem: &Idempotency,
    op: &Operation,
) -> Result<(T, Outcome), ExecuteError<String>>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut answer = None;
    let slot = &mut answer;
    idem.execute(op, &payload("busy"), move || async move {
        *slot = Some(
            idem.execute(op, &payload("busy"), || async {
                unreachable!("the key is in progress: the function never runs")
            })
            .await,
        );
        Ok::<_, String>(json!("done"))
    })
    .await
    .unwrap();
    answer.unwrap()
}

#[tokio::test]
async fn a_key_in_progress_gets_the_operations_answer_outside_a_batch() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let op = {
        let seen = seen.clone();
        op().when_in_progress(move |p| {
            seen.lock().unwrap().push(p.clone());
            Some(json!({"status": "pending", "retry_after_s": p.retry_after.as_secs()}))
        })
    };
    assert!(format!("{op:?}").contains("InProgressAnswer(set)"));
    let idem = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .lease(Duration::from_secs(60))
        .build();
    let before = SystemTime::now();
    let (answer, outcome) = while_in_progress::<Value>(&idem, &op).await.unwrap();
    assert_eq!(outcome, Outcome::InProgressAnswered);
    assert_eq!(outcome.as_str(), "in_progress_answered");
    assert!(!outcome.ran());
    assert_eq!(answer["status"], "pending");
    let seen = seen.lock().unwrap();
    let [p] = seen.as_slice() else {
        panic!("{seen:?}")
    };
    assert_eq!(p.id, "fn.generate#busy");
    assert!(p.lease_expires > before + Duration::from_secs(59));
    // The record is claimable a millisecond after its lease.
    assert!(p.retry_after > Duration::from_secs(59));
    assert!(p.retry_after <= Duration::from_millis(60_001));
    assert_eq!(answer["retry_after_s"], p.retry_after.as_secs());
}

#[tokio::test]
async fn an_in_progress_answer_of_none_keeps_already_in_progress() {
    let asked = Arc::new(AtomicU32::new(0));
    let op = {
        let asked = asked.clone();
        op().when_in_progress(move |_| {
            asked.fetch_add(1, Ordering::SeqCst);
            None
        })
    };
    let idem = Idempotency::new(MemoryStore::new());
    let result = while_in_progress::<Value>(&idem, &op).await;
    assert!(
        matches!(
            result,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_in_progress_answer_that_is_not_the_functions_type_is_a_clear_error() {
    let op = op().when_in_progress(|_| Some(json!({"status": "pending"})));
    let idem = Idempotency::new(MemoryStore::new());
    let result = while_in_progress::<u32>(&idem, &op).await;
    let Err(ExecuteError::Idempotency(err @ Error::InProgressAnswerIncompatible { .. })) = result
    else {
        panic!("{result:?}")
    };
    assert!(err.to_string().contains("in-progress answer"), "{err}");
    assert!(err.is_retryable() && !err.is_permanent());
    assert!(lambda_idempotency::report(&err).contains("expected u32"));
}

/// An operator's read by operation and payload finds the record under the id
/// `idempotency_id` gives, and nothing for a payload never seen.
#[tokio::test]
async fn a_record_is_read_by_its_operation_and_payload() {
    let idem = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let (value, _) = idem
        .execute(&op(), &payload("k"), || async {
            Ok::<_, String>("done".to_string())
        })
        .await
        .unwrap();
    assert_eq!(value, "done");
    let record = idem
        .record(&op(), &payload("k"))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(
        record.id,
        idem.idempotency_id(&op(), &payload("k")).unwrap()
    );
    assert_eq!(record.data.as_deref(), Some("\"done\""));
    assert_eq!(idem.record(&op(), &payload("other")).await.unwrap(), None);
}

/// A claim applied whose answer was lost on every attempt (or lost, then throttled) is a
/// retryable store error and runs nothing; the library sends a release for it (fenced by
/// its lease token), so its own claim is not left behind: the next delivery runs, even an
/// at-most-once one, which would otherwise find the claim abandoned after its lease.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answers_were_lost_is_released_and_the_next_delivery_runs() {
    for (name, faults) in [
        ("answer lost on every attempt", vec![Fault::AnswerLost; 3]),
        (
            "answer lost, then throttled",
            vec![Fault::AnswerLost, Fault::Unavailable, Fault::Unavailable],
        ),
    ] {
        for once in [false, true] {
            let store = FaultyStore::new(MemoryStore::new());
            let clock = paused_clock();
            let idem = Idempotency::builder(store.clone())
                .lease(Duration::from_secs(30))
                .clock(clock.clone())
                .build();
            let op = if once { op().at_most_once() } else { op() };
            for fault in faults.iter().copied() {
                store.inject(StoreOp::Claim, fault, 1);
            }
            let calls = AtomicU32::new(0);
            let lost = payload("lost");
            let deliver = || {
                idem.execute(&op, &lost, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>("ran".to_string())
                })
            };
            let first = deliver().await;
            assert!(
                matches!(
                    first,
                    Err(ExecuteError::Idempotency(Error::Store {
                        retryable: true,
                        ..
                    }))
                ),
                "{name}, at most once {once}: {first:?}"
            );
            assert_eq!(calls.load(Ordering::SeqCst), 0, "{name}: nothing ran");
            assert_eq!(store.requests(StoreOp::Release), 1, "{name}: one release");
            assert_eq!(
                store.inner().record("local.generate#lost"),
                None,
                "{name}, at most once {once}: the lost claim was released"
            );
            // The redelivery, even after the lost claim's lease: runs, once.
            tokio::time::sleep(Duration::from_secs(31)).await;
            let (_, outcome) = deliver()
                .await
                .unwrap_or_else(|e| panic!("{name}, at most once {once}: {e:?}"));
            assert_eq!(outcome, Outcome::Executed, "{name}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{name}");
        }
    }
}

/// A claim refused outright at its first attempt was never applied: no release is sent.
#[tokio::test]
async fn a_claim_refused_at_once_sends_no_release() {
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    store.inject(StoreOp::Claim, Fault::Rejected, 1);
    let calls = AtomicU32::new(0);
    let refused = call(&idem, &payload("r"), &calls).await;
    assert!(
        matches!(
            refused,
            Err(ExecuteError::Idempotency(Error::Store {
                retryable: false,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(store.requests(StoreOp::Release), 0);
}

/// A failed function's release is retried until the lease's cutoff under at most once, as
/// a completion is: a store that fails the release three times in a row (a brief
/// brownout) would otherwise leave the claim, and the next delivery would be refused for
/// good as abandoned although the function said it did nothing. Without at most once the
/// release keeps its three attempts (a lost release costs a wait for the lease).
#[tokio::test(start_paused = true)]
async fn at_most_once_retries_a_failed_functions_release_until_the_cutoff() {
    for once in [false, true] {
        let store = FaultyStore::new(MemoryStore::new());
        let clock = paused_clock();
        let idem = Idempotency::builder(store.clone())
            .lease(Duration::from_secs(30))
            .clock(clock.clone())
            .build();
        let op = if once { op().at_most_once() } else { op() };
        store.inject(StoreOp::Release, Fault::Unavailable, 5);
        let calls = AtomicU32::new(0);
        let deliver = |fail: bool| {
            let (op, calls) = (&op, &calls);
            let idem = &idem;
            async move {
                idem.execute(op, &payload("f"), || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if fail {
                        Err("the provider refused: nothing charged".to_string())
                    } else {
                        Ok("charged".to_string())
                    }
                })
                .await
            }
        };
        let first = deliver(true).await;
        assert!(matches!(first, Err(ExecuteError::Function(_))), "{first:?}");
        let record = store.inner().record("local.generate#f");
        if once {
            assert_eq!(store.requests(StoreOp::Release), 6, "until it went through");
            assert_eq!(record, None, "released");
        } else {
            assert_eq!(store.requests(StoreOp::Release), 3, "three attempts");
            assert_eq!(record.map(|r| r.status), Some(Status::InProgress));
        }
        tokio::time::sleep(Duration::from_secs(31)).await;
        let (_, outcome) = deliver(false)
            .await
            .unwrap_or_else(|e| panic!("at most once {once}: {e:?}"));
        let expected = if once {
            Outcome::Executed
        } else {
            Outcome::TookOver
        };
        assert_eq!(outcome, expected, "at most once {once}");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

/// A function that may have done its effect says so with `OutcomeUnknown`: its error
/// comes back, and its claim is neither released nor completed. A duplicate within the
/// lease is in progress; after it, a plain operation takes the claim over (runs again),
/// an at-most-once one is refused as abandoned (never runs again).
#[tokio::test(start_paused = true)]
async fn an_outcome_unknown_keeps_the_claim() {
    use lambda_idempotency::OutcomeUnknown;
    for once in [false, true] {
        let store = FaultyStore::new(MemoryStore::new());
        let idem = Idempotency::builder(store.clone())
            .lease(Duration::from_secs(30))
            .clock(paused_clock())
            .build();
        let op = if once { op().at_most_once() } else { op() };
        let calls = AtomicU32::new(0);
        let first = idem
            .execute(&op, &payload("u"), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<String, _>(OutcomeUnknown::new(
                    "the provider did not answer in time; the request was sent".to_string(),
                ))
            })
            .await;
        match &first {
            Err(ExecuteError::Function(e)) => {
                assert!(e.to_string().starts_with("outcome unknown: "), "{e}");
                assert!(e.to_string().contains("was sent"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(store.requests(StoreOp::Release), 0, "not released");
        assert_eq!(store.requests(StoreOp::Complete), 0, "not completed");
        let record = store.inner().record("local.generate#u").unwrap();
        assert_eq!(record.status, Status::InProgress, "the claim is kept");
        let again = || async {
            idem.execute(&op, &payload("u"), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("ran again".to_string())
            })
            .await
        };
        assert!(
            matches!(
                again().await,
                Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
            ),
            "within its lease the claim holds"
        );
        tokio::time::sleep(Duration::from_secs(31)).await;
        let after = again().await;
        if once {
            assert!(
                matches!(
                    after,
                    Err(ExecuteError::Idempotency(Error::ClaimAbandoned { .. }))
                ),
                "{after:?}"
            );
            assert_eq!(calls.load(Ordering::SeqCst), 1, "never run twice");
        } else {
            assert_eq!(after.unwrap().1, Outcome::TookOver);
            assert_eq!(calls.load(Ordering::SeqCst), 2);
        }
    }
}

/// Only the call it was made in is marked: an `OutcomeUnknown` made outside any call, or
/// in a call that then succeeds, changes nothing (the success is stored); one made in a
/// nested call and passed up as the enclosing function's error keeps both claims; a
/// function that panics after saying its outcome is unknown keeps its claim too.
#[tokio::test]
async fn an_outcome_unknown_marks_only_the_call_it_was_made_in() {
    use lambda_idempotency::OutcomeUnknown;
    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::new(store.clone());
    let outside = OutcomeUnknown::new("made before the call".to_string());
    let failed = idem
        .execute(&op(), &payload("plain"), || async {
            Err::<String, _>("the provider refused".to_string())
        })
        .await;
    assert!(matches!(failed, Err(ExecuteError::Function(_))));
    assert_eq!(
        store.inner().record("local.generate#plain"),
        None,
        "released"
    );
    assert_eq!(outside.into_inner(), "made before the call");

    let (value, outcome) = idem
        .execute(&op(), &payload("ok"), || async {
            let _ = OutcomeUnknown::new("a first try timed out");
            Ok::<_, String>("answered on the second try".to_string())
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed, "{value}");
    assert_eq!(
        store.inner().record("local.generate#ok").unwrap().status,
        Status::Completed
    );

    let inner_op = Operation::new("inner", KeyStrategy::field("request_id"));
    let nested = idem
        .execute(&op(), &payload("outer"), || async {
            let (value, _) = idem
                .execute(&inner_op, &payload("inner"), || async {
                    Err::<String, _>(OutcomeUnknown::new("reset after sending".to_string()))
                })
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(value)
        })
        .await;
    assert!(
        matches!(nested, Err(ExecuteError::Function(_))),
        "{nested:?}"
    );
    for id in ["local.inner#inner", "local.generate#outer"] {
        let record = store.inner().record(id);
        assert_eq!(record.map(|r| r.status), Some(Status::InProgress), "{id}");
    }

    let panicked = tokio::spawn({
        let idem = idem.clone();
        async move {
            let _ = idem
                .execute(&op(), &payload("panics"), || async {
                    let _unknown = OutcomeUnknown::new("sent");
                    panic!("a bug after the request was sent");
                    #[allow(unreachable_code)]
                    Ok::<String, String>(String::new())
                })
                .await;
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let record = store.inner().record("local.generate#panics");
    assert_eq!(record.map(|r| r.status), Some(Status::InProgress), "kept");

    // A nested call that says so and then panics keeps the enclosing call's claim too.
    let inner = Operation::new("inner", KeyStrategy::field("request_id"));
    let panicked = tokio::spawn({
        let idem = idem.clone();
        async move {
            let _ = idem
                .execute(&op(), &payload("outer-panics"), || async {
                    idem.execute(&inner, &payload("inner-panics"), || async {
                        let _unknown = OutcomeUnknown::new("sent");
                        panic!("a bug after the request was sent");
                        #[allow(unreachable_code)]
                        Ok::<String, String>(String::new())
                    })
                    .await
                    .map(|(value, _)| value)
                    .map_err(|e| e.to_string())
                })
                .await;
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    for id in ["local.inner#inner-panics", "local.generate#outer-panics"] {
        let record = store.inner().record(id);
        assert_eq!(record.map(|r| r.status), Some(Status::InProgress), "{id}");
    }
}

/// A handle's lease is checked when the handle is built, as an operation's is: under a
/// second or over 12 hours is refused (`Duration::MAX` would hold a crashed claim's key
/// for centuries), naming the setting; `build` panics with the same message.
#[test]
fn a_handle_lease_is_checked_when_it_is_built() {
    for lease in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(12 * 3600 + 1),
        Duration::MAX,
    ] {
        let built = Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .try_build();
        match built {
            Err(e @ Error::InvalidName { what: "lease", .. }) => {
                assert!(e.to_string().contains("1 second to 12 hours"), "{e}");
            }
            other => panic!("{lease:?}: {other:?}"),
        }
        assert!(
            std::panic::catch_unwind(|| Idempotency::builder(MemoryStore::new())
                .lease(lease)
                .build())
            .is_err(),
            "{lease:?}"
        );
    }
    for lease in [Duration::from_secs(1), Duration::from_secs(12 * 3600)] {
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .try_build()
            .unwrap();
    }
}

/// At most once needs a record that outlives its claim's lease: with an expiry no longer
/// than the lease, the expiry is raised to the lease's end and the next delivery after a
/// crash takes the claim over (runs twice). Refused, naming both settings: when the handle
/// is built for a handle-wide setting (against its lease, or against Lambda's 15-minute
/// longest timeout when the lease is the invocation's remaining time), and at the first
/// call for an operation's own (before any store request, nothing run).
#[tokio::test]
async fn at_most_once_refuses_an_expiry_no_longer_than_the_lease() {
    let refused = |built: Result<Idempotency, Error>, what: &str| match built {
        Err(
            e @ Error::InvalidName {
                what: "expires_after",
                ..
            },
        ) => {
            let text = e.to_string();
            for word in ["expires_after", "lease", "at-most-once"] {
                assert!(text.contains(word), "{what}: {text}");
            }
        }
        other => panic!("{what}: {other:?}"),
    };
    let handle = |expiry: u64, lease: Option<u64>| {
        let builder = Idempotency::builder(MemoryStore::new())
            .at_most_once(true)
            .expires_after(Duration::from_secs(expiry));
        match lease {
            Some(lease) => builder.lease(Duration::from_secs(lease)),
            None => builder,
        }
    };
    refused(handle(10, Some(30)).try_build(), "shorter than the lease");
    refused(handle(30, Some(30)).try_build(), "as long as the lease");
    handle(31, Some(30)).try_build().unwrap();
    // Without a fixed lease the lease is the invocation's remaining time, which only
    // the invocation knows: a worker with a 30 s timeout may keep records 10 minutes.
    handle(600, None).try_build().unwrap();
    // Without at most once an expiry shorter than the lease is raised to it, as before.
    Idempotency::builder(MemoryStore::new())
        .expires_after(Duration::from_secs(10))
        .lease(Duration::from_secs(30))
        .try_build()
        .unwrap();

    let store = FaultyStore::new(MemoryStore::new());
    let idem = Idempotency::builder(store.clone())
        .expires_after(Duration::from_secs(10))
        .build();
    let calls = AtomicU32::new(0);
    let call = |op: Operation| {
        let (idem, calls) = (&idem, &calls);
        async move {
            idem.execute(&op, &payload("amo"), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>("ran".to_string())
            })
            .await
        }
    };
    match call(op().at_most_once().lease(Duration::from_secs(30))).await {
        Err(ExecuteError::Idempotency(e @ Error::InvalidName { .. })) => {
            assert!(e.is_permanent());
            assert!(e.to_string().contains("lease"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    match call(op().at_most_once()).await {
        Err(ExecuteError::Idempotency(Error::InvalidName { .. })) => {}
        other => panic!("the remaining-time lease: {other:?}"),
    }
    assert_eq!(
        (store.total_requests(), calls.load(Ordering::SeqCst)),
        (0, 0)
    );
    let (_, outcome) = call(op().at_most_once().lease(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Executed,
        "a lease shorter than the expiry"
    );
    // An invocation that ends sooner than the expiry: its lease is shorter, and it runs.
    let (_, outcome) = idem
        .execute_until(
            &op().at_most_once(),
            &payload("amo-deadline"),
            SystemTime::now() + Duration::from_secs(5),
            || async { Ok::<_, String>("ran".to_string()) },
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Executed,
        "a 5 s invocation, a 10 s expiry"
    );
}

/// The tenant lives in the invocation's task (docs/design.md#tenants): a task spawned
/// off it has no tenant and uses the untenanted id, which tenants share; the same task
/// given the context (`with_context`) keeps its tenant's id.
#[tokio::test]
async fn a_spawned_task_keeps_its_tenant_only_when_given_the_context() {
    let idem = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("id"));
    for (carried, expected) in [(false, "fn.op#k"), (true, "#a#fn.op#k")] {
        let mut context = lambda_runtime::Context::default();
        context.tenant_id = Some("a".into());
        let (idem, op) = (idem.clone(), op.clone());
        let ctx = context.clone();
        let id = lambda_idempotency::with_context(&context, async move {
            let work = async move { idem.idempotency_id(&op, &json!({"id": "k"})) };
            if carried {
                tokio::spawn(async move { lambda_idempotency::with_context(&ctx, work).await })
                    .await
            } else {
                tokio::spawn(work).await
            }
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(id, expected, "carried: {carried}");
    }
}

/// A disabled handle cannot commit writes (`check_writes` says so): `execute_committing`
/// refuses them before it runs (pays for) the function.
#[tokio::test]
async fn a_disabled_handle_refuses_writes_before_running() {
    use lambda_idempotency::WithWrites;
    use lambda_idempotency::store::memory::MemoryWrites;
    let idem = Idempotency::builder(MemoryStore::new())
        .disabled(true)
        .build();
    let op = Operation::new("disabled_writes", KeyStrategy::field("id"));
    let calls = AtomicU32::new(0);
    let answer = idem
        .execute_committing(&op, &json!({"id": "a"}), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(
                1,
                MemoryWrites::new().put("t", "k", json!(1)),
            ))
        })
        .await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the function ran, then its writes were refused: {answer:?}"
    );
    assert!(
        matches!(
            answer,
            Err(lambda_idempotency::ExecuteError::Idempotency(
                Error::WritesUnsupported { .. }
            ))
        ),
        "{answer:?}"
    );
}

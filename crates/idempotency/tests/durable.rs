//! Durable executions (feature `durable`) on the memory store, through the SDK's runner:
//! the settings refused at start-up, a step's claim apart from its execution's, and a
//! step interrupted after its side effect. The whole contract runs over every store in
//! tests/tests/every_backend/durable.rs.

use aws_durable_execution_sdk::test_util::{LocalRunner, TestResult};
use aws_durable_execution_sdk::{BoxError, DurableContext};
use futures_util::FutureExt;
use lambda_idempotency::durable::{IdempotentExecution, MAX_EXECUTION_TIMEOUT, step};
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::{IdempotencyStore, Status, StoreOp};
use lambda_idempotency::{Error, Idempotency, KeyStrategy, MemoryStore, Operation};
use serde_json::{Value, json};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn op() -> Operation {
    Operation::new("order", KeyStrategy::field("order_id"))
}

fn refusal(result: Result<IdempotentExecution, Error>) -> String {
    match result {
        Err(Error::InvalidName { what, reason, .. }) => {
            assert_eq!(what, "execution timeout");
            reason
        }
        other => panic!("refused as an invalid execution timeout, got {other:?}"),
    }
}

#[test]
fn a_timeout_lambda_would_refuse_or_a_setting_it_contradicts_fails_at_start_up() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let new = |op, timeout| IdempotentExecution::new(idempotency.clone(), op, timeout);
    assert!(refusal(new(op(), Duration::ZERO)).contains("from 1 second to 366 days"));
    assert!(refusal(new(op(), Duration::from_millis(999))).contains("whole seconds"));
    assert!(refusal(new(op(), Duration::from_millis(1500))).contains("whole seconds"));
    assert!(new(op(), Duration::from_secs(1)).is_ok());
    assert!(refusal(new(op(), Duration::MAX)).contains("366 days"));
    assert!(
        refusal(new(op(), MAX_EXECUTION_TIMEOUT + Duration::from_secs(1))).contains("366 days")
    );
    let leased = op().lease(Duration::from_secs(60));
    assert!(refusal(new(leased, DAY)).contains("drop the operation's lease"));
    let execution = new(op(), MAX_EXECUTION_TIMEOUT).unwrap();
    assert_eq!(execution.execution_timeout(), MAX_EXECUTION_TIMEOUT);
    let debug = format!("{execution:?}");
    assert!(
        debug.contains("\"order\"") && debug.contains("execution_timeout"),
        "{debug}"
    );
}

#[test]
fn at_most_once_records_must_outlive_the_execution() {
    let short = Idempotency::builder(MemoryStore::new())
        .expires_after(DAY)
        .at_most_once(true)
        .build();
    let error = IdempotentExecution::new(short.clone(), op(), DAY).unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidName {
                what: "expires_after",
                ..
            }
        ),
        "{error:?}"
    );
    // The operation alone may be at most once, too.
    let plain = Idempotency::builder(MemoryStore::new())
        .expires_after(DAY)
        .build();
    assert!(IdempotentExecution::new(plain.clone(), op().at_most_once(), DAY).is_err());
    assert!(
        IdempotentExecution::new(plain, op(), 7 * DAY).is_ok(),
        "a plain record's expiry waits for its lease"
    );
    assert!(IdempotentExecution::new(short, op(), DAY - Duration::from_secs(1)).is_ok());
}

/// The records in `store` as (operation, status, lease end, token).
async fn records(
    store: &MemoryStore,
    idempotency: &Idempotency,
    ids: &[(&Operation, Value)],
) -> Vec<Option<(Status, SystemTime, Option<String>)>> {
    let mut found = Vec::new();
    for (op, payload) in ids {
        let id = idempotency.idempotency_id(op, payload).unwrap();
        found.push(store.get(&id).await.unwrap().map(|r| {
            (
                r.status,
                r.in_progress_expiration.unwrap_or(r.expiration),
                r.lease_token,
            )
        }));
    }
    found
}

#[tokio::test]
async fn a_steps_claim_is_its_own_not_the_executions() {
    let store = MemoryStore::new();
    let idempotency = Idempotency::new(store.clone());
    let charge = Operation::new("charge", KeyStrategy::field("order_id"));
    let order = json!({"order_id": "o-1", "cents": 1200});
    // What the step's body saw of the records while it ran.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let execution = IdempotentExecution::new(idempotency.clone(), op(), 30 * DAY).unwrap();
    let (i, s, c, seen2) = (
        idempotency.clone(),
        store.clone(),
        charge.clone(),
        Arc::clone(&seen),
    );
    let handler = execution.handler(move |order: Value, ctx: DurableContext| {
        let (idempotency, store, charge, seen) =
            (i.clone(), s.clone(), c.clone(), Arc::clone(&seen2));
        async move {
            let (i2, o2, c2) = (idempotency.clone(), order.clone(), charge.clone());
            let receipt: String = step(&idempotency, &ctx, &charge, &order, move || async move {
                let both = records(&store, &i2, &[(&op(), o2.clone()), (&c2, o2)]).await;
                seen.lock().unwrap().extend(both);
                Ok::<_, BoxError>("ch_1".to_string())
            })
            .await?;
            Ok::<_, BoxError>(receipt)
        }
    });
    let result = LocalRunner::new().run(handler, order.clone()).await;
    assert_eq!(
        result.output().map(String::as_str),
        Some("ch_1"),
        "{:?}",
        result.error_message()
    );
    let seen = seen.lock().unwrap().clone();
    let [
        Some((Status::InProgress, execution_lease, execution_token)),
        Some((Status::InProgress, step_lease, step_token)),
    ] = seen.as_slice()
    else {
        panic!("both claims in progress while the step ran: {seen:?}");
    };
    let now = SystemTime::now();
    assert!(
        *execution_lease > now + 29 * DAY,
        "the execution's lease is its timeout"
    );
    assert!(
        *step_lease < now + Duration::from_secs(16 * 60),
        "the step's is an invocation's at most"
    );
    assert_ne!(execution_token, step_token);
    let after = records(
        &store,
        &idempotency,
        &[(&op(), order.clone()), (&charge, order)],
    )
    .await;
    assert!(
        after
            .iter()
            .all(|r| matches!(r, Some((Status::Completed, _, _)))),
        "{after:?}"
    );
}

/// Runs a handler whose one step counts its calls, with the `skip`th checkpoint failing as
/// an ended invocation would; `idempotent` puts the step under a claim.
async fn calls_with_a_lost_checkpoint(skip: usize, idempotent: bool) -> usize {
    let idempotency = Idempotency::new(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let handler = move |order: Value, ctx: DurableContext| {
        let (idempotency, calls) = (idempotency.clone(), Arc::clone(&c));
        async move {
            let charge = Operation::new("charge", KeyStrategy::field("order_id"));
            let body = move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(1)
            };
            let charged: u32 = if idempotent {
                step(&idempotency, &ctx, &charge, &order, body).await?
            } else {
                ctx.step(move |_| body()).name("charge").await?
            };
            Ok::<_, BoxError>(charged)
        }
    };
    let runner = LocalRunner::new().fail_checkpoints_after_retryable(skip, 1);
    let result = runner.run(handler, json!({"order_id": "o-2"})).await;
    assert_eq!(result.output(), Some(&1), "{:?}", result.error_message());
    calls.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_step_interrupted_after_its_side_effect_gets_the_stored_answer() {
    let mut twice = 0;
    for skip in 0..4 {
        // Without a claim, a lost checkpoint after the body runs it again (the SDK's
        // at-least-once steps): the case this test is about exists.
        if calls_with_a_lost_checkpoint(skip, false).await == 2 {
            twice += 1;
        }
        assert_eq!(
            calls_with_a_lost_checkpoint(skip, true).await,
            1,
            "checkpoint {skip} lost"
        );
    }
    assert!(twice > 0, "some lost checkpoint runs a plain step twice");
}

#[tokio::test]
async fn a_panic_ends_one_invocation_and_keeps_the_executions_claim() {
    let store = MemoryStore::new();
    let idempotency = Idempotency::new(store.clone());
    let order = json!({"order_id": "o-3"});
    let handler = IdempotentExecution::new(idempotency.clone(), op(), DAY)
        .unwrap()
        .handler(|_: Value, _: DurableContext| async {
            if std::hint::black_box(true) {
                panic!("one invocation dies");
            }
            Ok::<_, BoxError>(1u32)
        });
    let run = AssertUnwindSafe(LocalRunner::new().run(handler, order.clone()))
        .catch_unwind()
        .await;
    assert!(
        run.is_err(),
        "the panic goes on, and Lambda invokes the execution again"
    );
    let kept = records(&store, &idempotency, &[(&op(), order)]).await;
    assert!(
        matches!(kept.as_slice(), [Some((Status::InProgress, _, _))]),
        "kept for the execution's next invocation, not freed for another execution: {kept:?}"
    );
}

#[tokio::test]
async fn a_disabled_handle_still_keeps_the_owner_to_the_execution() {
    // With idempotency off the execution's claim is not made; a call nested in its
    // handler, through a handle that is on, claims as its own.
    let store = MemoryStore::new();
    let on = Idempotency::new(store.clone());
    let off = Idempotency::builder(MemoryStore::new())
        .disabled(true)
        .build();
    let nested = nested2_op();
    let order = json!({"order_id": "o-4"});
    let (on2, nested2, store2) = (on.clone(), nested.clone(), store.clone());
    let handler = IdempotentExecution::new(off, op(), 30 * DAY)
        .unwrap()
        .handler(move |order: Value, _: DurableContext| {
            let (on, nested, store) = (on2.clone(), nested2.clone(), store2.clone());
            async move {
                let (on3, order3) = (on.clone(), order.clone());
                on.run(&nested, &order, || async move {
                    let seen = records(&store, &on3, &[(&nested2_op(), order3)]).await;
                    let [Some((Status::InProgress, lease, _))] = seen.as_slice() else {
                        panic!("the nested claim in progress: {seen:?}");
                    };
                    Ok::<_, lambda_idempotency::Error>(
                        *lease < SystemTime::now() + Duration::from_secs(16 * 60),
                    )
                })
                .await
                .map_err(BoxError::from)
            }
        });
    let result = LocalRunner::new().run(handler, order).await;
    assert_eq!(
        result.output(),
        Some(&true),
        "an ordinary lease, not the execution's: {:?}",
        result.error_message()
    );
}

fn nested2_op() -> Operation {
    Operation::new("nested", KeyStrategy::field("order_id"))
}

/// An execution whose first store request of `op` meets `fault` once.
async fn execution_through(
    op_faulted: StoreOp,
    fault: Fault,
) -> (TestResult<u32>, usize, FaultyStore<MemoryStore>) {
    let store = FaultyStore::new(MemoryStore::new());
    store.inject(op_faulted, fault, 1);
    let idempotency = Idempotency::builder(store.clone())
        .store_attempt_timeout(Duration::from_millis(200))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let handler = IdempotentExecution::new(idempotency, op(), DAY)
        .unwrap()
        .handler(move |_: Value, ctx: DurableContext| {
            let runs = Arc::clone(&r);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.wait(Duration::from_secs(60)).await?;
                Ok::<_, BoxError>(7u32)
            }
        });
    let result = LocalRunner::new()
        .run(handler, json!({"order_id": "o-5"}))
        .await;
    (result, runs.load(Ordering::SeqCst), store)
}

#[tokio::test]
async fn an_executions_claim_whose_answer_was_lost_or_hung_is_its_own_on_the_retry() {
    for fault in [Fault::AnswerLost, Fault::Hang] {
        let (result, runs, store) = execution_through(StoreOp::Claim, fault).await;
        assert_eq!(
            result.output(),
            Some(&7),
            "{fault:?}: {:?}",
            result.error_message()
        );
        assert!(runs >= 2, "{fault:?}: the wait suspended it: {runs}");
        assert!(
            store.requests(StoreOp::Claim) >= 3,
            "{fault:?}: retried, then re-entered"
        );
    }
}

#[tokio::test]
async fn an_executions_completion_whose_answer_was_lost_or_hung_is_retried_to_completed() {
    for fault in [Fault::AnswerLost, Fault::Hang] {
        let (result, _, store) = execution_through(StoreOp::Complete, fault).await;
        assert_eq!(
            result.output(),
            Some(&7),
            "{fault:?}: {:?}",
            result.error_message()
        );
        assert!(store.requests(StoreOp::Complete) >= 2, "{fault:?}: retried");
        let idempotency = Idempotency::new(store.inner().clone());
        let id = idempotency
            .idempotency_id(&op(), &json!({"order_id": "o-5"}))
            .unwrap();
        let record = store.inner().get(&id).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Completed, "{fault:?}");
    }
}

//! The tower layer over a whole handler, and use from concurrent invocations.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::{
    Error, Idempotency, IdempotentLayer, KeyStrategy, MemoryStore, Operation, SqsBatch,
};
use lambda_runtime::tower::{Service, ServiceBuilder};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

async fn call<S>(service: &mut S, payload: Value) -> Result<Value, lambda_runtime::Error>
where
    S: Service<LambdaEvent<Value>, Response = Value, Error = lambda_runtime::Error>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service
        .call(LambdaEvent::new(payload, Context::default()))
        .await
}

#[tokio::test]
async fn a_whole_handler_runs_once_per_key() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |event: LambdaEvent<Value>| {
        let calls = counted.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, lambda_runtime::Error>(json!({"charged": event.payload["amount"], "call": n}))
        }
    });
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("charge", KeyStrategy::field("payment_id"));
    let mut service = ServiceBuilder::new()
        .layer(IdempotentLayer::new(idempotency, op))
        .service(handler);

    let first = call(&mut service, json!({"payment_id": "p1", "amount": 5}))
        .await
        .unwrap();
    let again = call(&mut service, json!({"payment_id": "p1", "amount": 5}))
        .await
        .unwrap();
    assert_eq!(first, json!({"charged": 5, "call": 1}));
    assert_eq!(again, first, "the stored response");

    // An in-progress duplicate is an error the caller sees.
    let mut other = service.clone();
    let slow = call(&mut other, json!({"payment_id": "p2", "amount": 1}));
    let duplicate = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        call(&mut service, json!({"payment_id": "p2", "amount": 1})).await
    };
    let (slow, duplicate) = tokio::join!(slow, duplicate);
    slow.unwrap();
    let err = duplicate.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::AlreadyInProgress { .. })
        ),
        "{err}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let missing = call(&mut service, json!({"amount": 1})).await.unwrap_err();
    assert!(
        matches!(
            missing.downcast_ref::<Error>(),
            Some(Error::KeyMissing { .. })
        ),
        "{missing}"
    );
}

/// `lambda_runtime::run_concurrent` runs invocations as spawned tasks sharing one handler:
/// the batch future must be `Send + 'static` and the handle shareable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_invocations_share_one_handle() {
    let store = MemoryStore::new();
    let idempotency = Idempotency::new(store.clone());
    let calls = Arc::new(AtomicU32::new(0));
    let mut invocations = Vec::new();
    for i in 0..8 {
        let (idempotency, calls) = (idempotency.clone(), calls.clone());
        let records: Vec<Value> = (0..5)
            .map(|k| json!({"messageId": format!("inv{i}-m{k}"), "body": json!({"id": k}).to_string()}))
            .collect();
        let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
        invocations.push(tokio::spawn(async move {
            let op = Operation::new("job", KeyStrategy::field("id"));
            SqsBatch::new()
                .run_json(
                    LambdaEvent::new(event, Context::default()),
                    |body: Value, _| {
                        let (idempotency, op, calls) = (&idempotency, &op, &calls);
                        async move {
                            idempotency
                                .run(op, &body, || async {
                                    calls.fetch_add(1, Ordering::SeqCst);
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    Ok::<_, lambda_runtime::Error>(())
                                })
                                .await
                        }
                    },
                )
                .await
                .unwrap()
        }));
    }
    let mut handed_back = 0;
    for inv in invocations {
        handed_back += inv.await.unwrap().batch_item_failures.len();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "five distinct keys ran once each"
    );
    assert!(
        handed_back <= 35,
        "duplicates were replayed or handed back, never re-run"
    );
}

/// At most once through the layer: a key whose run crashed is refused with
/// `ClaimAbandoned`, and the handler does not run again.
#[tokio::test]
async fn an_at_most_once_handler_whose_run_crashed_is_not_run_again() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |_: LambdaEvent<Value>| {
        let calls = counted.clone();
        async move {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            Ok::<_, lambda_runtime::Error>(json!({"sent": true}))
        }
    });
    let idempotency = Idempotency::new(MemoryStore::new());
    let op = Operation::new("email", KeyStrategy::field("email_id"))
        .at_most_once()
        .lease(Duration::from_secs(1));
    let mut service = ServiceBuilder::new()
        .layer(IdempotentLayer::new(idempotency, op))
        .service(handler);
    let crashed = call(&mut service, json!({"email_id": "e1"}));
    let _ = tokio::time::timeout(Duration::from_millis(50), crashed).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let err = call(&mut service, json!({"email_id": "e1"}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(e @ Error::ClaimAbandoned { .. }) if e.is_permanent()
        ),
        "{err}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Lambda's tenant isolation mode: the same event under two tenants runs once for each;
/// again under one of them it replays. Untenanted ids are as they were.
#[tokio::test]
async fn two_tenants_never_share_a_response() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |_: LambdaEvent<Value>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, lambda_runtime::Error>(json!({ "call": n })) }
    });
    let store = MemoryStore::new();
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("charge", KeyStrategy::field("payment_id"));
    let mut service = ServiceBuilder::new()
        .layer(IdempotentLayer::new(idempotency, op))
        .service(handler);
    let mut answers = Vec::new();
    for tenant in [Some("a"), Some("b"), Some("a"), Some("b"), None] {
        let mut context = Context::default();
        context.tenant_id = tenant.map(str::to_owned);
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let event = LambdaEvent::new(json!({"payment_id": "p1"}), context);
        answers.push(service.call(event).await.unwrap()["call"].clone());
    }
    assert_eq!(answers, [1, 2, 1, 2, 3].map(|n| json!(n)));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    for id in ["#a#fn.charge#p1", "#b#fn.charge#p1", "fn.charge#p1"] {
        assert!(store.record(id).is_some(), "{id}");
    }
}

/// The operation's answers through the layer: an invocation whose key is in progress gets
/// the in-progress answer, a duplicate after it the stored response through the replay hook.
#[tokio::test]
async fn the_layer_answers_a_key_in_progress_and_replays_through_the_hook() {
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (started, release) = (started.clone(), release.clone());
        service_fn(move |_: LambdaEvent<Value>| {
            let (started, release) = (started.clone(), release.clone());
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, lambda_runtime::Error>(json!({"status": "charged"}))
            }
        })
    };
    let op = Operation::new("charge", KeyStrategy::field("payment_id"))
        .when_in_progress(|p| Some(json!({"status": "pending", "id": p.id})))
        .on_replay(|mut stored, _| {
            stored["replayed"] = json!(true);
            stored
        });
    let idempotency = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let mut service = ServiceBuilder::new()
        .layer(IdempotentLayer::new(idempotency, op))
        .service(handler);
    let mut other = service.clone();
    let event = json!({"payment_id": "p1"});
    let first = call(&mut other, event.clone());
    let duplicate = async {
        started.notified().await;
        let answer = call(&mut service, event.clone()).await;
        release.notify_one();
        answer
    };
    let (first, duplicate) = tokio::join!(first, duplicate);
    assert_eq!(first.unwrap(), json!({"status": "charged"}));
    assert_eq!(
        duplicate.unwrap(),
        json!({"status": "pending", "id": "fn.charge#p1"})
    );
    let again = call(&mut service, event).await.unwrap();
    assert_eq!(again, json!({"status": "charged", "replayed": true}));
}

#[tokio::test]
async fn an_envelope_keys_the_request_inside_the_event_and_a_bad_one_is_refused_unrun() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |event: LambdaEvent<Value>| {
        let calls = counted.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            // The handler gets the whole event, envelope and all.
            Ok::<_, lambda_runtime::Error>(json!({"id": event.payload["id"]}))
        }
    });
    let op = Operation::new("order", KeyStrategy::field("order_id")).validate(["/amount"]);
    let layer = IdempotentLayer::new(Idempotency::new(MemoryStore::new()), op)
        .envelope(lambda_idempotency::Envelope::eventbridge());
    let mut service = ServiceBuilder::new().layer(layer).service(handler);
    let put = |id: &str, amount: u32| json!({"id": id, "time": id, "detail-type": "OrderPlaced", "detail": {"order_id": "o-1", "amount": amount}});
    let first = call(&mut service, put("e1", 5)).await.unwrap();
    // The same order put again: another event id and time, the same detail.
    let again = call(&mut service, put("e2", 5)).await.unwrap();
    assert_eq!(first, json!({"id": "e1"}));
    assert_eq!(again, first, "the stored response, not a second run");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The same key with another detail is refused as without an envelope.
    let err = call(&mut service, put("e3", 6)).await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::PayloadMismatch { .. })
        ),
        "{err}"
    );
    // No detail at all: refused for good, the handler not run.
    let err = call(&mut service, json!({"id": "e4"})).await.unwrap_err();
    let e = err.downcast_ref::<Error>().expect("the library's error");
    assert!(
        matches!(e, Error::MalformedBody { .. }) && e.is_permanent(),
        "{e}"
    );
    assert!(e.to_string().contains("eventbridge envelope"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_carriers_own_message_is_refused_never_run_unclaimed() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |_: LambdaEvent<Value>| {
        let calls = counted.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, lambda_runtime::Error>(json!({}))
        }
    });
    let op = Operation::new("ingest", KeyStrategy::hash_payload());
    let layer = IdempotentLayer::new(Idempotency::new(MemoryStore::new()), op)
        .envelope(lambda_idempotency::Envelope::s3());
    let mut service = ServiceBuilder::new().layer(layer).service(handler);
    let test_event =
        json!({"Event": "s3:TestEvent", "Records": [{"s3": {"object": {"key": "k"}}}]});
    let err = call(&mut service, test_event).await.unwrap_err();
    let e = err.downcast_ref::<Error>().expect("the library's error");
    assert!(matches!(e, Error::MalformedBody { .. }), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

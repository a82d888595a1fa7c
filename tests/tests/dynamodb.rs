//! The DynamoDB store on the local test server: the whole contract, request counts per
//! path, the server's faults, the item encoding and items other writers left.

use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::conformance;
use lambda_idempotency::{
    DynamoDbStore, Error, ExecuteError, Idempotency, KeyStrategy, Operation, Outcome,
};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use test_support::{Emulator, TestTable};

#[path = "support/dynamodb_writes.rs"]
mod dynamodb_writes;
use dynamodb_writes::DynamoDbKit;

fn dynamo_op(op: StoreOp) -> &'static str {
    match op {
        StoreOp::Claim => "PutItem",
        StoreOp::Complete => "UpdateItem",
        StoreOp::Release => "DeleteItem",
        StoreOp::Get => "GetItem",
        StoreOp::Forget => "DeleteItem",
        StoreOp::List => "Scan",
    }
}

async fn store(test: &str) -> (TestTable, DynamoDbStore) {
    let table = TestTable::create(test).await;
    let store = DynamoDbStore::new(table.client.clone(), &table.name);
    (table, store)
}

fn op() -> Operation {
    Operation::new("generate", KeyStrategy::field("request_id")).validate(["prompt"])
}

fn payload(id: &str) -> Value {
    json!({"request_id": id, "prompt": "hi"})
}

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

/// The whole contract; its store failures are the test server's throttling.
/// `MODEL_SEEDS=n` runs n model histories per setup (default 12), `MODEL_SEED=s` one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dynamodb_store_keeps_the_whole_contract() {
    let (table, store) = store("conformance").await;
    let kit = DynamoDbKit::create(Emulator::Moto, "conformance").await;
    conformance::run_whole_contract(
        store,
        async |op| table.inject(dynamo_op(op), "throttle", 1).await,
        12,
        Some(&kit),
    )
    .await;
}

#[tokio::test]
async fn request_counts_per_path() {
    let (table, store) = store("counts").await;
    let idem = Idempotency::new(store.clone());
    let calls = AtomicU32::new(0);

    call(&idem, &payload("a"), &calls).await.unwrap();
    let counts = table.counts().await;
    assert_eq!(counts.get("PutItem"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("UpdateItem"), Some(&1), "{counts:?}");
    assert_eq!(
        table.item_requests().await,
        2,
        "first delivery: PutItem + UpdateItem"
    );

    table.reset().await;
    let (_, outcome) = call(&idem, &payload("a"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert_eq!(
        table.item_requests().await,
        1,
        "completed duplicate: one PutItem"
    );

    // In progress: claim directly through the engine with a function that waits.
    table.reset().await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.execute(&op(), &payload("b"), || async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, String>("b".to_string())
            })
            .await
        })
    };
    started_rx.await.unwrap();
    table.reset().await;
    let dup = call(&idem, &payload("b"), &calls).await;
    assert!(
        matches!(
            dup,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "{dup:?}"
    );
    assert_eq!(
        table.item_requests().await,
        1,
        "in-progress duplicate: one PutItem"
    );
    finish_tx.send(()).unwrap();
    first.await.unwrap().unwrap();

    let cached = Idempotency::builder(store).local_cache(8).build();
    call(&cached, &payload("c"), &calls).await.unwrap();
    table.reset().await;
    let (_, outcome) = call(&cached, &payload("c"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::ReplayedFromCache);
    assert_eq!(
        table.item_requests().await,
        0,
        "local cache hit: no request"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "two distinct keys ran");
}

/// Powertools left the record in progress after four throttled UpdateItems, and the
/// redelivery called the provider again. Here completion is retried within the lease.
#[tokio::test]
async fn throttled_completion_is_retried_and_the_duplicate_replays() {
    let (table, store) = store("throttled-completion").await;
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(30))
        .build();
    table.inject("UpdateItem", "throttle", 4).await;
    let calls = AtomicU32::new(0);
    let (_, outcome) = call(&idem, &payload("t"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert_eq!(
        table.counts().await.get("UpdateItem"),
        Some(&5),
        "four throttled, one stored"
    );
    let (_, outcome) = call(&idem, &payload("t"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one call in total");
}

#[tokio::test]
async fn server_errors_on_claim_are_retried_then_surface() {
    let (table, store) = store("claim-500").await;
    let idem = Idempotency::new(store);
    let calls = AtomicU32::new(0);
    table.inject("PutItem", "internal", 1).await;
    assert_eq!(
        call(&idem, &payload("x"), &calls).await.unwrap().1,
        Outcome::Executed
    );
    table.inject("PutItem", "internal", 3).await;
    let err = call(&idem, &payload("y"), &calls).await.unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::Idempotency(Error::Store {
                backend: "dynamodb",
                retryable: true,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no call without a claim");
}

#[tokio::test]
async fn a_missing_table_is_a_clear_non_retryable_store_error() {
    let endpoint = test_support::endpoint().await;
    let store = DynamoDbStore::new(test_support::client(&endpoint), "no-such-table");
    let idem = Idempotency::new(store);
    let calls = AtomicU32::new(0);
    let err = call(&idem, &payload("x"), &calls).await.unwrap_err();
    match err {
        ExecuteError::Idempotency(
            e @ Error::Store {
                retryable: false, ..
            },
        ) => {
            let chain = lambda_idempotency::report(&e);
            assert!(chain.contains("ResourceNotFound"), "{chain}");
        }
        other => panic!("expected a non-retryable store error, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn crashed_worker_is_taken_over_after_its_lease() {
    let (table, store) = store("takeover").await;
    let idem = Idempotency::builder(store)
        .lease(Duration::from_millis(1500))
        .build();
    let (crash_op, crash_payload) = (op(), payload("c"));
    let crashed = idem.execute(&crash_op, &crash_payload, || async {
        std::future::pending::<()>().await;
        Ok::<_, String>(String::new())
    });
    let _ = tokio::time::timeout(Duration::from_millis(300), crashed).await;
    let calls = AtomicU32::new(0);
    tokio::time::sleep(Duration::from_millis(1400)).await;
    table.reset().await;
    let (_, outcome) = call(&idem, &payload("c"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::TookOver);
    assert_eq!(
        table.item_requests().await,
        2,
        "a takeover costs a first delivery's two"
    );
}

#[tokio::test]
async fn records_round_trip_through_the_item_encoding() {
    let (_table, store) = store("encoding").await;
    let mut record = lambda_idempotency::store::Record::new(
        "fn.op#k",
        lambda_idempotency::store::Status::Completed,
        lambda_idempotency::store::from_epoch_secs(1_900_000_000),
    );
    record.in_progress_expiration = Some(lambda_idempotency::store::from_epoch_millis(
        1_800_000_000_123,
    ));
    record.data = Some(r#"{"a":1}"#.into());
    record.validation = Some("abc".into());
    record.lease_token = Some("tok".into());
    let item = store.to_item(&record);
    assert_eq!(
        item["expiration"].as_n().unwrap(),
        "1900000000",
        "epoch seconds"
    );
    assert_eq!(
        item["in_progress_expiration"].as_n().unwrap(),
        "1800000000123",
        "epoch milliseconds"
    );
    assert_eq!(item["status"].as_s().unwrap(), "COMPLETED");
    assert_eq!(store.from_item(&item).unwrap(), record);
}

#[tokio::test]
async fn a_conflict_without_the_old_item_falls_back_to_one_consistent_read() {
    let (table, store) = store("no-all-old").await;
    let idem = Idempotency::new(store);
    let calls = AtomicU32::new(0);
    call(&idem, &payload("a"), &calls).await.unwrap();
    table.reset().await;
    table.strip_old_item_on_conflict().await;
    let (value, outcome) = call(&idem, &payload("a"), &calls).await.unwrap();
    assert_eq!((value.as_str(), outcome), ("answer", Outcome::Replayed));
    let counts = table.counts().await;
    assert_eq!(
        (counts.get("PutItem"), counts.get("GetItem")),
        (Some(&1), Some(&1)),
        "the duplicate cost a PutItem and one GetItem: {counts:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The environment `scripts/test` sets so `DynamoDbStore::from_env` reaches the test server.
fn from_env_endpoint() -> String {
    let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").unwrap_or_default();
    let server = std::env::var(test_support::ENDPOINT_ENV).unwrap_or_default();
    assert!(
        !endpoint.is_empty() && endpoint == server,
        "this test builds its client with DynamoDbStore::from_env: run it through scripts/test, \
         or export AWS_ENDPOINT_URL_DYNAMODB={server:?} (the test server), AWS_REGION, \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    );
    endpoint
}

/// The client `from_env` builds does not retry on its own: the engine's three attempts
/// are all the PutItems a throttled claim makes (with the SDK's standard retries on top,
/// it would be nine).
#[tokio::test]
async fn from_env_leaves_retries_to_the_engine() {
    from_env_endpoint();
    let table = TestTable::create("from-env").await;
    let store = DynamoDbStore::from_env(&table.name).await;
    let idem = Idempotency::new(store);
    table.inject("PutItem", "throttle", 20).await;
    let calls = AtomicU32::new(0);
    let err = call(&idem, &payload("x"), &calls).await.unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::Idempotency(Error::Store {
                retryable: true,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(
        table.counts().await.get("PutItem"),
        Some(&3),
        "one owner of retries: the engine's three attempts"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// PutItem applied by the server, its answer replaced by a 500: the engine's retry finds
/// its own claim and runs the function once. The same for UpdateItem.
#[tokio::test]
async fn writes_applied_with_their_answer_lost_run_once() {
    let (table, store) = store("answer-lost").await;
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(30))
        .build();
    let calls = AtomicU32::new(0);
    table.inject("PutItem", "applied_internal", 1).await;
    table.inject("UpdateItem", "applied_internal", 1).await;
    let (_, outcome) = call(&idem, &payload("l"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    let counts = table.counts().await;
    assert_eq!(
        (counts.get("PutItem"), counts.get("UpdateItem")),
        (Some(&2), Some(&2)),
        "each write retried once: {counts:?}"
    );
    let (_, outcome) = call(&idem, &payload("l"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one call in total");
}

/// A PutItem that hangs at the server is cut off at the attempt timeout and retried; when
/// the hung write lands later, after the result was stored, it changes nothing.
#[tokio::test]
async fn a_hung_claim_is_cut_off_and_its_late_write_changes_nothing() {
    let (table, store) = store("hang").await;
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(30))
        .store_attempt_timeout(Duration::from_millis(400))
        .build();
    table.inject_hang("PutItem", 2.0, 1).await;
    let calls = AtomicU32::new(0);
    let started = std::time::Instant::now();
    let (_, outcome) = call(&idem, &payload("h"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "not held by the hung request: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let id = idem.idempotency_id(&op(), &payload("h")).unwrap();
    let item = table.get_raw(&id).await.expect("the record");
    assert_eq!(
        item["status"].as_s().unwrap(),
        "COMPLETED",
        "the late claim did not reopen it"
    );
    assert_eq!(
        table.counts().await.get("PutItem"),
        Some(&2),
        "the hung claim and its retry"
    );
    let (_, outcome) = call(&idem, &payload("h"), &calls).await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A claim that replaced an item which is no idempotency record (a shared table) is a
/// claim, not an error that holds the key until the lease ends.
#[tokio::test]
async fn claiming_over_a_foreign_item_is_not_an_error() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (table, store) = store("foreign").await;
    let idem = Idempotency::new(store);
    let id = idem.idempotency_id(&op(), &payload("f")).unwrap();
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item("id", AttributeValue::S(id.clone()))
        .item("status", AttributeValue::S("SOMETHING_ELSE".into()))
        .item("expiration", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();
    let calls = AtomicU32::new(0);
    let (value, _) = call(&idem, &payload("f"), &calls).await.unwrap();
    assert_eq!(value, "answer");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let item = table.get_raw(&id).await.unwrap();
    assert_eq!(item["status"].as_s().unwrap(), "COMPLETED");
}

/// Long attribute names count toward DynamoDB's 400 KB item limit: a result that fits
/// with the default names but not with these is refused before the write, not lost.
#[tokio::test]
async fn custom_attribute_names_count_toward_the_size_limit() {
    let (_table, store) = store("long-names").await;
    let long = |name: &str| format!("{name}_{}", "x".repeat(10_000));
    let mut names = lambda_idempotency::store::dynamodb::AttributeNames::default();
    names.data = long("data");
    names.validation = long("validation");
    names.lease_token = long("lease_token");
    names.status = long("status");
    names.in_progress_expiration = long("in_progress_expiration");
    let store = store.attribute_names(names);
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(30))
        .build();
    let big = "y".repeat(380 * 1024);
    let result = idem
        .execute(&op(), &payload("big"), || async {
            Ok::<_, String>(big.clone())
        })
        .await;
    assert!(
        matches!(
            result,
            Err(ExecuteError::Idempotency(Error::ResultTooLarge { .. }))
        ),
        "refused before the write, not RESULT LOST: {result:?}"
    );
    let again = idem
        .execute(&op(), &payload("big"), || async {
            if true {
                panic!("never run twice");
            }
            Ok::<_, String>(String::new())
        })
        .await;
    assert!(
        matches!(
            again,
            Err(ExecuteError::Idempotency(Error::ResultNotStored { .. }))
        ),
        "{again:?}"
    );
}

/// An in-progress item whose lease attribute is NULL (another writer's) is read as having
/// no lease, held until it expires; the claim condition agrees, so once expired it is
/// claimed instead of failing every delivery with InconsistentState.
#[tokio::test]
async fn an_expired_in_progress_item_with_a_null_lease_is_claimable() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (table, store) = store("null-lease").await;
    let idem = Idempotency::new(store);
    let id = idem.idempotency_id(&op(), &payload("n")).unwrap();
    let put = |expiration: &str| {
        table
            .client
            .put_item()
            .table_name(&table.name)
            .item("id", AttributeValue::S(id.clone()))
            .item("status", AttributeValue::S("INPROGRESS".into()))
            .item("expiration", AttributeValue::N(expiration.into()))
            .item("in_progress_expiration", AttributeValue::Null(true))
            .send()
    };
    put("9999999999").await.unwrap();
    let calls = AtomicU32::new(0);
    let held = call(&idem, &payload("n"), &calls).await;
    assert!(
        matches!(
            held,
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
        ),
        "not expired: held, {held:?}"
    );
    put("1").await.unwrap();
    let (_, outcome) = call(&idem, &payload("n"), &calls)
        .await
        .expect("expired since 1970 without a lease: claimable");
    assert_eq!(outcome, Outcome::TookOver);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The answer persisted with its record: a first delivery costs the claim and one
/// `TransactWriteItems`, a duplicate one `PutItem` and writes nothing again.
#[tokio::test]
async fn writes_commit_with_the_completion_in_one_transaction() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put};
    use lambda_idempotency::WithWrites;
    use lambda_idempotency::store::dynamodb::DynamoDbWrites;

    let (table, store) = store("writes-counts").await;
    let answers = TestTable::create("writes-counts-answers").await;
    let idem = Idempotency::new(store);
    idem.check_writes::<DynamoDbWrites>().unwrap();
    let calls = AtomicU32::new(0);
    let deliver = |id: &'static str| {
        let (idem, calls, answers) = (&idem, &calls, &answers);
        async move {
            idem.execute_committing(&op(), &payload(id), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                let put = Put::builder()
                    .table_name(&answers.name)
                    .item("id", AttributeValue::S(id.into()))
                    .item("answer", AttributeValue::S("answer".into()))
                    .condition_expression("attribute_not_exists(id)")
                    .build()
                    .unwrap();
                Ok::<_, String>(WithWrites::new(
                    "answer".to_string(),
                    DynamoDbWrites::new().put(put),
                ))
            })
            .await
        }
    };

    let (_, outcome) = deliver("w").await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    let counts = table.counts().await;
    assert_eq!(counts.get("PutItem"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("TransactWriteItems"), Some(&1), "{counts:?}");
    assert_eq!(
        table.item_requests().await,
        2,
        "first delivery with its answer persisted: PutItem + TransactWriteItems"
    );
    assert!(
        answers.get_raw("w").await.is_some(),
        "the answer is written"
    );

    table.reset().await;
    let (_, outcome) = deliver("w").await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    assert_eq!(table.item_requests().await, 1, "duplicate: one PutItem");

    // The transaction applied, its answer lost: the retry finds the record completed with
    // its own token and succeeds; the answer is written once (its condition would refuse
    // a second write), the function ran once.
    table.reset().await;
    table
        .inject("TransactWriteItems", "applied_internal", 1)
        .await;
    let (_, outcome) = deliver("lost").await.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert_eq!(
        table.counts().await.get("TransactWriteItems"),
        Some(&2),
        "one applied and lost, one that found it applied"
    );
    let record = table
        .get_raw(&idem.idempotency_id(&op(), &payload("lost")).unwrap())
        .await;
    assert_eq!(record.unwrap()["status"].as_s().unwrap(), "COMPLETED");
    assert!(answers.get_raw("lost").await.is_some());

    // A write whose condition fails: refused by index and table, the refusal kept as the
    // record's answer, so a redelivery answers it without running.
    let refused = deliver("w2");
    answers
        .client
        .put_item()
        .table_name(&answers.name)
        .item("id", AttributeValue::S("w2".into()))
        .send()
        .await
        .unwrap();
    let answer = refused.await;
    match answer {
        Err(ExecuteError::Idempotency(Error::WritesRefused { reason, .. })) => {
            assert!(reason.contains("write 0"), "{reason}");
            assert!(reason.contains(&answers.name), "{reason}");
        }
        other => panic!("a failed condition refuses the writes, got {other:?}"),
    }
    let id = idem.idempotency_id(&op(), &payload("w2")).unwrap();
    let record = table.get_raw(&id).await.expect("the refusal is kept");
    assert_eq!(record["status"].as_s().unwrap(), "COMPLETED");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let again = deliver("w2").await;
    assert!(
        matches!(
            again,
            Err(ExecuteError::Idempotency(Error::WritesRefused {
                retryable: false,
                ..
            }))
        ),
        "{again:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3, "answered without running");
}

/// More than DynamoDB takes in one transaction is refused before any request is sent.
#[tokio::test]
async fn writes_past_the_transaction_limits_are_refused_before_sending() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put};
    use lambda_idempotency::store::dynamodb::DynamoDbWrites;
    use lambda_idempotency::store::{Claim, IdempotencyStore, Writes};

    let (table, store) = store("writes-limits").await;
    let put = |i: usize, bytes: usize| {
        Put::builder()
            .table_name("answers")
            .item("id", AttributeValue::S(format!("k{i}")))
            .item("v", AttributeValue::S("x".repeat(bytes)))
            .build()
            .unwrap()
    };
    let too_many = (0..100).fold(DynamoDbWrites::new(), |w, i| w.put(put(i, 1)));
    let too_large = (0..11).fold(DynamoDbWrites::new(), |w, i| w.put(put(i, 390_000)));
    let now = std::time::SystemTime::now();
    for (what, writes) in [("100 writes", too_many), ("about 4.3 MB", too_large)] {
        let claim = Claim::new("f.op#limits", now, now + Duration::from_secs(30), "t1");
        store.claim(&claim).await.unwrap();
        table.reset().await;
        let answer = store
            .complete_with(&claim, Some("1"), now, &Writes::new(writes))
            .await;
        assert!(
            matches!(answer, Err(Error::WritesInvalid { .. })),
            "{what}: {answer:?}"
        );
        assert_eq!(table.item_requests().await, 0, "{what}: nothing sent");
        store.release(&claim).await.unwrap();
    }
}

/// Writes DynamoDB refuses whole for their shape (too many items: a mistake in the code)
/// release the claim, never kept: the fixed deployment's delivery runs.
#[tokio::test]
async fn writes_invalid_for_their_shape_are_released_for_the_fixed_deployment() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put};
    use lambda_idempotency::WithWrites;
    use lambda_idempotency::store::dynamodb::DynamoDbWrites;

    let (_table, store) = store("invalid-shape").await;
    let idem = Idempotency::new(store);
    let op = Operation::new("invalid_shape", KeyStrategy::field("id"));
    let put = |i: usize| {
        Put::builder()
            .table_name("answers")
            .item("id", AttributeValue::S(format!("k{i}")))
            .build()
            .unwrap()
    };
    let calls = AtomicU32::new(0);
    let first = idem
        .execute_committing(&op, &json!({"id": "m"}), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(
                1,
                (0..100).fold(DynamoDbWrites::new(), |w, i| w.put(put(i))),
            ))
        })
        .await;
    assert!(
        matches!(
            first,
            Err(ExecuteError::Idempotency(Error::WritesInvalid { .. }))
        ),
        "{first:?}"
    );
    // The fixed release: no writes at all.
    let second = idem
        .execute_committing(&op, &json!({"id": "m"}), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(1, DynamoDbWrites::new()))
        })
        .await;
    assert!(
        second.is_ok(),
        "{} calls; the fixed release answers the old refusal: {second:?}",
        calls.load(Ordering::SeqCst)
    );
}

//! The DynamoDB store in a single-table design (a partition key holding a static value, the
//! stored id in the sort key), on both emulators: the test server (moto) and dynalite,
//! which validates requests and expressions more strictly. The whole contract, the plain
//! store's contract on dynalite too, the items, the start-up check against a table whose
//! key does not match, and stores with different partition values sharing a table.
//!
//! dynalite answers a failed condition without the old item (it ignores
//! `ReturnValuesOnConditionCheckFailure`), so there every refused claim takes the store's
//! fallback, one consistent `GetItem` on the composite key; moto returns the item.

use lambda_idempotency::store::conformance;
use lambda_idempotency::store::{IdempotencyStore, Record, Status, StoreOp, from_epoch_secs};
use lambda_idempotency::{
    DynamoDbStore, Error, ExecuteError, Idempotency, KeyStrategy, Operation, Outcome, report,
};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use test_support::{Emulator, TestTable};

#[path = "support/dynamodb_writes.rs"]
mod dynamodb_writes;
use dynamodb_writes::DynamoDbKit;
use lambda_idempotency::store::conformance::writes::WritesKit;

const PK: &str = "pk";
const SK: &str = "sk";

fn operation_name(op: StoreOp) -> &'static str {
    match op {
        StoreOp::Claim => "PutItem",
        StoreOp::Complete => "UpdateItem",
        StoreOp::Release => "DeleteItem",
        StoreOp::Get => "GetItem",
        StoreOp::Forget => "DeleteItem",
        StoreOp::List => "Query",
    }
}

/// A single table (`pk`, `sk`) on `emulator`, and a store on it whose partition value is
/// `partition`.
async fn single_table(
    emulator: Emulator,
    test: &str,
    partition: &str,
) -> (TestTable, DynamoDbStore) {
    let table = TestTable::create_keyed(emulator, test, PK, Some(SK)).await;
    let store = single_table_store(&table, partition);
    (table, store)
}

fn single_table_store(table: &TestTable, partition: &str) -> DynamoDbStore {
    let mut names = lambda_idempotency::store::dynamodb::AttributeNames::default();
    names.id = PK.into();
    DynamoDbStore::new(table.client.clone(), &table.name)
        .attribute_names(names)
        .sort_key_attr(SK)
        .partition_key_value(partition)
}

/// The whole contract over a single table; the store failures are the client's refusals
/// (a request that never left), which work on both emulators.
async fn whole_contract(emulator: Emulator, table: TestTable, store: DynamoDbStore) {
    store
        .check_table()
        .await
        .unwrap_or_else(|e| panic!("{emulator:?}: {}", report(&e)));
    // dynalite 4.0.0 has no TransactWriteItems: there the store's writes are checked for
    // what every store without them must do, refuse them.
    let kit = match emulator {
        Emulator::Moto => Some(DynamoDbKit::create(emulator, "single-contract").await),
        Emulator::Dynalite => None,
    };
    conformance::run_whole_contract(
        store,
        async |op| table.refuse(operation_name(op), 1),
        12,
        kit.as_ref().map(|kit| kit as &dyn WritesKit),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_table_keeps_the_whole_contract_on_the_test_server() {
    let (table, store) =
        single_table(Emulator::Moto, "single-contract", "idempotency#contract").await;
    whole_contract(Emulator::Moto, table, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_table_keeps_the_whole_contract_on_dynalite() {
    let (table, store) = single_table(
        Emulator::Dynalite,
        "single-contract",
        "idempotency#contract",
    )
    .await;
    whole_contract(Emulator::Dynalite, table, store).await;
}

/// The plain store (partition key `id` only) on dynalite too: an expression only moto
/// accepts fails here whichever key the table has.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_plain_store_keeps_the_whole_contract_on_dynalite() {
    let table = TestTable::create_keyed(Emulator::Dynalite, "plain-contract", "id", None).await;
    let store = DynamoDbStore::new(table.client.clone(), &table.name);
    whole_contract(Emulator::Dynalite, table, store).await;
}

/// The item: the partition value in the partition key, the stored id in the sort key,
/// the record's attributes as the plain store writes them; and back.
#[tokio::test]
async fn the_item_holds_the_partition_value_and_the_id_in_the_sort_key() {
    for emulator in [Emulator::Moto, Emulator::Dynalite] {
        let (table, store) = single_table(emulator, "single-item", "idempotency#orders").await;
        let idem = Idempotency::new(store.clone());
        let op = Operation::new("generate", KeyStrategy::field("request_id"));
        let payload = json!({"request_id": "r-1"});
        let (value, _) = idem
            .execute(&op, &payload, || async {
                Ok::<_, String>("answer".to_owned())
            })
            .await
            .unwrap();
        assert_eq!(value, "answer");
        let id = idem.idempotency_id(&op, &payload).unwrap();
        let item = table
            .get_raw_key(&[(PK, "idempotency#orders"), (SK, &id)])
            .await
            .unwrap_or_else(|| panic!("{emulator:?}: no item at (idempotency#orders, {id})"));
        assert_eq!(item[PK].as_s().unwrap(), "idempotency#orders");
        assert_eq!(item[SK].as_s().unwrap(), &id);
        assert_eq!(item["status"].as_s().unwrap(), "COMPLETED");
        assert!(
            !item.contains_key("id"),
            "{emulator:?}: no id attribute: {item:?}"
        );
        let record = store.from_item(&item).unwrap();
        assert_eq!(
            (record.id.as_str(), record.status),
            (id.as_str(), Status::Completed)
        );

        let mut record = Record::new("fn.op#k", Status::Completed, from_epoch_secs(1_900_000_000));
        record.data = Some("1".into());
        let item = store.to_item(&record);
        assert_eq!(item[PK].as_s().unwrap(), "idempotency#orders");
        assert_eq!(item[SK].as_s().unwrap(), "fn.op#k");
        assert_eq!(store.from_item(&item).unwrap(), record);
    }
}

/// Without a partition value the store uses Powertools' `idempotency#<function name>`.
#[tokio::test]
async fn the_default_partition_value_is_idempotency_and_the_function_name() {
    let table = TestTable::create_keyed(Emulator::Moto, "single-default", PK, Some(SK)).await;
    let mut names = lambda_idempotency::store::dynamodb::AttributeNames::default();
    names.id = PK.into();
    let store = DynamoDbStore::new(table.client.clone(), &table.name)
        .attribute_names(names)
        .sort_key_attr(SK);
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "local".into());
    let item = store.to_item(&Record::new(
        "fn.op#k",
        Status::InProgress,
        from_epoch_secs(1),
    ));
    assert_eq!(item[PK].as_s().unwrap(), &format!("idempotency#{function}"));
    store.check_table().await.unwrap();
}

/// A stored id fits a sort key's 1024 bytes, not the partition key's 2048: a longer key is
/// refused before any request, as the plain store refuses one over 2048.
#[tokio::test]
async fn a_stored_id_longer_than_a_sort_key_is_refused_before_the_write() {
    let (_table, store) = single_table(Emulator::Dynalite, "single-long", "idempotency#long").await;
    assert_eq!(store.limits().max_id_bytes, 1024);
    let idem = Idempotency::new(store);
    let op = Operation::new("generate", KeyStrategy::field("request_id"));
    let calls = AtomicU32::new(0);
    let long = json!({"request_id": "k".repeat(1100)});
    let result = idem
        .execute(&op, &long, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        })
        .await;
    assert!(
        matches!(
            result,
            Err(ExecuteError::Idempotency(Error::KeyTooLong {
                max: 1024,
                ..
            }))
        ),
        "{result:?}"
    );
    let fits = json!({"request_id": "k".repeat(900)});
    idem.execute(&op, &fits, || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(())
    })
    .await
    .expect("a 1 KB sort key is DynamoDB's limit, and dynalite's");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Two stores on one table with different partition values (two functions sharing the
/// application's table), and a plain store's items beside them: the same stored id is
/// three records, none sees another's, and each replays its own result.
#[tokio::test]
async fn stores_with_different_partition_values_never_see_each_others_records() {
    for emulator in [Emulator::Moto, Emulator::Dynalite] {
        let (table, orders) = single_table(emulator, "single-shared", "idempotency#orders").await;
        let billing = single_table_store(&table, "idempotency#billing");
        let op = Operation::new("generate", KeyStrategy::field("request_id"));
        let payload = json!({"request_id": "shared"});
        let calls = AtomicU32::new(0);
        let run = async |store: &DynamoDbStore, answer: &str| {
            Idempotency::builder(store.clone())
                .function_name("worker")
                .build()
                .execute(&op, &payload, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(answer.to_owned())
                })
                .await
                .unwrap()
        };
        assert_eq!(
            run(&orders, "orders").await,
            ("orders".to_string(), Outcome::Executed)
        );
        assert_eq!(
            run(&billing, "billing").await,
            ("billing".to_string(), Outcome::Executed),
            "{emulator:?}: the same id under another partition value is another record"
        );
        assert_eq!(
            run(&orders, "x").await,
            ("orders".to_string(), Outcome::Replayed)
        );
        assert_eq!(
            run(&billing, "x").await,
            ("billing".to_string(), Outcome::Replayed)
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // One store's claim in progress does not hold the other's key.
        let id = "worker.generate#held";
        let claim = conformance::claim_at(
            id,
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(60),
            "t-orders",
        );
        orders.claim(&claim).await.unwrap();
        assert_eq!(billing.get(id).await.unwrap(), None, "{emulator:?}");
        let mut other = claim.clone();
        other.lease_token = "t-billing".into();
        assert!(
            matches!(
                billing.claim(&other).await.unwrap(),
                lambda_idempotency::store::ClaimOutcome::Claimed { previous: None }
            ),
            "{emulator:?}"
        );
        // Releasing one leaves the other.
        orders.release(&claim).await.unwrap();
        assert_eq!(
            billing.get(id).await.unwrap().and_then(|r| r.lease_token),
            Some("t-billing".into()),
            "{emulator:?}"
        );
    }
}

/// The start-up check refuses a table whose key is not the store's, saying which key the
/// table has and which the store expected; it accepts the right one.
#[tokio::test]
async fn the_start_up_check_refuses_a_table_whose_key_does_not_match() {
    for emulator in [Emulator::Moto, Emulator::Dynalite] {
        let single = TestTable::create_keyed(emulator, "check-single", PK, Some(SK)).await;
        let plain = TestTable::create_keyed(emulator, "check-plain", "id", None).await;
        let plain_store = DynamoDbStore::new(plain.client.clone(), &plain.name);
        plain_store.check_table().await.unwrap();
        single_table_store(&single, "idempotency#x")
            .check_table()
            .await
            .unwrap();

        let cases = [
            (
                DynamoDbStore::new(single.client.clone(), &single.name),
                &single.name,
                "has key (pk HASH, sk RANGE) but the store was set up for (id HASH)",
            ),
            (
                single_table_store(&plain, "idempotency#x"),
                &plain.name,
                "has key (id HASH) but the store was set up for (pk HASH, sk RANGE)",
            ),
            (
                DynamoDbStore::new(single.client.clone(), &single.name).sort_key_attr("other"),
                &single.name,
                "has key (pk HASH, sk RANGE) but the store was set up for (id HASH, other RANGE)",
            ),
        ];
        for (store, table, says) in cases {
            let err = store
                .check_table()
                .await
                .expect_err("a mismatched table is refused");
            assert!(
                matches!(
                    err,
                    Error::Store {
                        retryable: false,
                        ..
                    }
                ),
                "{emulator:?}: {err:?}"
            );
            let text = report(&err);
            assert!(
                text.contains(&format!("table {table:?} {says}")),
                "{emulator:?}: {text}"
            );
        }
    }
}

/// Settings that cannot work on any table fail the check before any request.
#[tokio::test]
async fn the_start_up_check_refuses_settings_that_cannot_work() {
    let table = TestTable::create_keyed(Emulator::Moto, "check-settings", PK, Some(SK)).await;
    let store = || DynamoDbStore::new(table.client.clone(), &table.name);
    for (store, says) in [
        (store().sort_key_attr("id"), "same name \"id\""),
        (store().sort_key_attr("status"), "same name \"status\""),
        (
            store().sort_key_attr(SK).partition_key_value(""),
            "partition key value is empty",
        ),
        (
            store().partition_key_value("idempotency#x"),
            "but no sort key",
        ),
    ] {
        let err = store.check_table().await.expect_err(says);
        let text = report(&err);
        assert!(text.contains(says), "{text}");
    }
    assert_eq!(table.item_requests().await, 0, "refused before any request");
}

/// Without the check, the first request a mismatched table refuses fails with the same
/// message, not retryable, before the function runs. A single-table store on a plain
/// table gets its first claim accepted (so call `check_table` at start-up), its completion
/// refused, and the next key's claim refused: never answered with another key's record.
#[tokio::test]
async fn a_mismatched_table_fails_the_first_request_with_a_clear_error() {
    for emulator in [Emulator::Moto, Emulator::Dynalite] {
        let single = TestTable::create_keyed(emulator, "mismatch-single", PK, Some(SK)).await;
        let plain = TestTable::create_keyed(emulator, "mismatch-plain", PK, None).await;
        let op = Operation::new("generate", KeyStrategy::field("request_id"));
        let calls = AtomicU32::new(0);
        let run = async |store: &DynamoDbStore, key: &str| {
            Idempotency::new(store.clone())
                .execute(&op, &json!({"request_id": key}), || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(key.to_owned())
                })
                .await
        };
        let mut names = lambda_idempotency::store::dynamodb::AttributeNames::default();
        names.id = PK.into();
        let plain_store =
            DynamoDbStore::new(single.client.clone(), &single.name).attribute_names(names);
        let err = run(&plain_store, "a").await.unwrap_err();
        let text = match &err {
            ExecuteError::Idempotency(
                e @ Error::Store {
                    retryable: false, ..
                },
            ) => report(e),
            other => panic!("{emulator:?}: {other:?}"),
        };
        assert!(
            text.contains("has key (pk HASH, sk RANGE) but the store was set up for (pk HASH)"),
            "{emulator:?}: {text}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "{emulator:?}: no run without a claim"
        );

        // DynamoDB takes the claim (the sort key is a plain attribute of the one item all
        // records would share), not the completion: the first key ran, its result is not
        // stored. The second key's claim finds the first key's record and is refused.
        let single_store = single_table_store(&plain, "idempotency#x");
        let first = run(&single_store, "a").await.map_err(|e| e.to_string());
        assert_eq!(
            first,
            Ok(("a".into(), Outcome::ExecutedUnstored)),
            "{emulator:?}"
        );
        let err = run(&single_store, "b").await.unwrap_err();
        let text = match &err {
            ExecuteError::Idempotency(
                e @ Error::Store {
                    retryable: false, ..
                },
            ) => report(e),
            other => panic!("{emulator:?}: {other:?}"),
        };
        assert!(
            text.contains("has key (pk HASH) but the store was set up for (pk HASH, sk RANGE)"),
            "{emulator:?}: {text}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{emulator:?}: the second key did not run"
        );
    }
}

/// The example worker checks its table at start-up: its single-table settings
/// (`IDEMPOTENCY_TABLE_*`) work on a table keyed so, and a table keyed otherwise stops it
/// with the message, before any message is received.
#[tokio::test]
async fn the_worker_checks_its_table_at_start_up() {
    let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").unwrap_or_default();
    assert!(
        !endpoint.is_empty() && endpoint == test_support::endpoint().await,
        "the worker builds its client from the environment: run this through scripts/test, or \
         export AWS_ENDPOINT_URL_DYNAMODB (the test server), AWS_REGION, AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY"
    );
    let single = TestTable::create_keyed(Emulator::Moto, "worker-single", PK, Some(SK)).await;
    let plain = TestTable::create("worker-plain").await;
    let config = |table: &str, single_table: bool| {
        let mut vars = vec![
            ("IDEMPOTENCY_TABLE", table.to_owned()),
            ("MODEL_BASE_URL", "http://127.0.0.1:9".to_owned()),
        ];
        if single_table {
            vars.extend([
                ("IDEMPOTENCY_TABLE_PARTITION_KEY", PK.to_owned()),
                ("IDEMPOTENCY_TABLE_SORT_KEY", SK.to_owned()),
                (
                    "IDEMPOTENCY_TABLE_PARTITION_VALUE",
                    "idempotency#model-worker".to_owned(),
                ),
            ]);
        }
        model_worker::WorkerConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        })
        .expect("a valid configuration")
    };
    model_worker::Worker::from_config(&config(&single.name, true))
        .await
        .expect("the single table fits its settings");
    model_worker::Worker::from_config(&config(&plain.name, false))
        .await
        .expect("the plain table fits the default settings");
    for (table, single_table, says) in [
        (
            &plain.name,
            true,
            "has key (id HASH) but the store was set up for (pk HASH, sk RANGE)",
        ),
        (
            &single.name,
            false,
            "has key (pk HASH, sk RANGE) but the store was set up for (id HASH)",
        ),
    ] {
        let err = model_worker::Worker::from_config(&config(table, single_table))
            .await
            .expect_err(says);
        let text = report(&*err);
        assert!(text.contains(&format!("table {table:?} {says}")), "{text}");
    }
}

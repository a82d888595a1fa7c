//! The on-call runbook (docs/deploy.md), driven through the built `lambda-idempotency`
//! binary over every store: an at-most-once operation's crashed run leaves a claim that no
//! delivery takes over; the operator lists the stuck claims, reads the one, forgets it,
//! and the next delivery runs the function once. The in-memory store, which no other
//! process can reach, runs the same steps through the library's API.

use lambda_idempotency::store::{Forgotten, ListRequest, Status};
use lambda_idempotency::{Error, ExecuteError, Idempotency, KeyStrategy, Operation, Outcome};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use test_support::every_backend;
use test_support::stores::{Backend, TestStore};

every_backend!(a_stuck_claim_is_found_read_and_forgotten_and_the_next_delivery_runs_once);

/// The binary's exit status and its stdout as JSON.
async fn command(store: &TestStore, args: &[&str]) -> (i32, Value) {
    let (url, env) = store
        .command_line()
        .expect("a store another process reaches");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"));
    command
        .args(["--store", &url, "--json", "--quiet"])
        .args(args);
    for name in [
        "IDEMPOTENCY_STORE",
        "IDEMPOTENCY_TABLE",
        "IDEMPOTENCY_REDIS_NAMESPACE",
    ] {
        command.env_remove(name);
    }
    command.envs(env);
    let out = command.output().await.expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("{args:?}: stdout is no JSON ({e}): {stdout}\nstderr: {stderr}")
    });
    (out.status.code().expect("an exit status"), value)
}

async fn a_stuck_claim_is_found_read_and_forgotten_and_the_next_delivery_runs_once(
    backend: Backend,
) {
    let store = TestStore::open(backend, "operator").await;
    let idempotency = Idempotency::builder(store.store.clone())
        .function_name("worker")
        .build();
    let name = format!("send-{:08x}", fastrand_u32());
    let op = Operation::new(name.clone(), KeyStrategy::field("id"))
        .at_most_once()
        .lease(Duration::from_secs(1));
    let payload = json!({"id": "order-7"});
    let id = idempotency.idempotency_id(&op, &payload).unwrap();
    let calls = Arc::new(AtomicU32::new(0));

    // A run that never ends, as a worker killed mid-call: its claim outlives its lease.
    let crashed = {
        let (idempotency, op, payload) = (idempotency.clone(), op.clone(), payload.clone());
        tokio::spawn(async move {
            let _ = idempotency
                .execute(&op, &payload, || {
                    std::future::pending::<Result<String, String>>()
                })
                .await;
        })
    };
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let deliver = || {
        let calls = calls.clone();
        let (idempotency, op, payload) = (idempotency.clone(), op.clone(), payload.clone());
        async move {
            idempotency
                .execute(&op, &payload, || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>("sent".to_string())
                })
                .await
        }
    };
    let refused = deliver().await;
    assert!(
        matches!(
            &refused,
            Err(ExecuteError::Idempotency(Error::ClaimAbandoned { .. }))
        ),
        "{backend}: the next delivery is refused, got {refused:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let prefix = format!("worker.{name}#");
    if backend == Backend::Memory {
        let page = idempotency
            .list(&ListRequest::new(prefix, 100))
            .await
            .unwrap();
        assert_eq!(page.records.len(), 1);
        let read = idempotency
            .record_by_id(&id)
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(read.status, Status::InProgress);
        assert_eq!(idempotency.forget(&read).await.unwrap(), Forgotten::Deleted);
    } else {
        // Find it: the claims stuck for more than a moment under the operation.
        let (code, listed) = command(&store, &["list", "--prefix", &prefix, "--stuck"]).await;
        assert_eq!(code, 0, "{listed}");
        let ids: Vec<&str> = listed["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            [id.as_str()],
            "{backend}: the stuck claim is listed: {listed}"
        );
        assert_eq!(listed["complete"], true);

        // Read it.
        let (code, read) = command(&store, &["get", &id]).await;
        assert_eq!(code, 0, "{read}");
        assert_eq!(read["status"], "INPROGRESS");
        assert_eq!(read["lease_ended"], true);
        assert_eq!(read["result_stored"], false);
        let token = read["lease_token"].as_str().unwrap().to_owned();

        // A forget conditioned on another token deletes nothing.
        let (code, refused) = command(&store, &["forget", &id, "--if-token", "other"]).await;
        assert_eq!(
            (code, &refused["forgotten"]),
            (4, &json!(false)),
            "{refused}"
        );

        // Forget it as read.
        let (code, forgot) = command(&store, &["forget", &id, "--if-token", &token]).await;
        assert_eq!((code, &forgot["forgotten"]), (0, &json!(true)), "{forgot}");
        let (code, gone) = command(&store, &["get", &id]).await;
        assert_eq!((code, &gone["found"]), (3, &json!(false)), "{gone}");
    }

    // The next delivery runs once; its duplicate replays.
    let (value, outcome) = deliver().await.unwrap();
    assert_eq!((value.as_str(), outcome), ("sent", Outcome::Executed));
    let (_, again) = deliver().await.unwrap();
    assert_eq!(again, Outcome::Replayed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "{backend}: one run after the forget"
    );
    crashed.abort();
}

fn fastrand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id()
}

/// Mistakes end with their own exit status, and a password in the URL is never printed.
#[tokio::test]
async fn a_bad_url_is_a_usage_error_and_a_password_is_never_printed() {
    let run = |args: &'static [&'static str]| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
            .args(args)
            .env_remove("IDEMPOTENCY_STORE")
            .env_remove("IDEMPOTENCY_TABLE")
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap(), text)
    };
    let (code, text) = run(&["--store", "mysql://u:hunter2@db/x", "get", "k"]).await;
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("not a store URL") && !text.contains("hunter2"),
        "{text}"
    );
    let (code, text) = run(&["get", "k"]).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("IDEMPOTENCY_TABLE is not set"), "{text}");
    let (code, text) = run(&["--store", "redis://:hunter2@127.0.0.1:1", "get", "k"]).await;
    assert_eq!(code, 1, "an unreachable store: {text}");
    assert!(!text.contains("hunter2"), "{text}");
    let (code, text) = run(&["frobnicate"]).await;
    assert_eq!(code, 2, "{text}");
    let (code, text) = run(&["--help"]).await;
    assert_eq!(code, 0);
    assert!(text.contains("exit status"));
}

/// A single table (a sort key): the command reads under the worker's partition value, from
/// `AWS_LAMBDA_FUNCTION_NAME` as the worker does, and finds, reads and forgets there.
#[tokio::test]
async fn a_single_table_is_read_under_the_worker_s_partition_value() {
    use lambda_idempotency::DynamoDbStore;
    use lambda_idempotency::store::Claim;
    use lambda_idempotency::store::IdempotencyStore;
    use lambda_idempotency::store::dynamodb::AttributeNames;
    use test_support::{Emulator, TestTable};

    let table = TestTable::create_keyed(Emulator::Moto, "cli-single", "pk", Some("sk")).await;
    let mut names = AttributeNames::default();
    names.id = "pk".into();
    let store = DynamoDbStore::new(table.client.clone(), &table.name)
        .attribute_names(names)
        .sort_key_attr("sk")
        .partition_key_value("idempotency#orders-worker");
    let now = std::time::SystemTime::now();
    let id = "orders-worker.send#o-1";
    store
        .claim(
            &Claim::new(
                id,
                now - Duration::from_secs(600),
                now - Duration::from_secs(570),
                "t",
            )
            .expires_at(now + Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let run = |args: &'static [&'static str]| {
        let table = &table;
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
                .args([
                    "--store",
                    &format!("dynamodb://{}", table.name),
                    "--json",
                    "-q",
                ])
                .args(args)
                .env("AWS_ENDPOINT_URL_DYNAMODB", table.endpoint_url())
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("IDEMPOTENCY_TABLE_PARTITION_KEY", "pk")
                .env("IDEMPOTENCY_TABLE_SORT_KEY", "sk")
                .env("AWS_LAMBDA_FUNCTION_NAME", "orders-worker")
                .env_remove("IDEMPOTENCY_TABLE_PARTITION_VALUE")
                .output()
                .await
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let value: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
                panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr))
            });
            (out.status.code().unwrap(), value)
        }
    };
    let (code, listed) = run(&[
        "list",
        "--stuck-for",
        "5m",
        "--prefix",
        "orders-worker.send#",
    ])
    .await;
    assert_eq!(code, 0, "{listed}");
    assert_eq!(listed["records"][0]["id"], id, "{listed}");
    let (code, read) = run(&["get", "orders-worker.send#o-1"]).await;
    assert_eq!((code, &read["status"]), (0, &json!("INPROGRESS")), "{read}");
    let (code, forgot) = run(&["forget", "orders-worker.send#o-1"]).await;
    assert_eq!((code, &forgot["forgotten"]), (0, &json!(true)), "{forgot}");
    assert_eq!(store.get(id).await.unwrap(), None, "forgotten in the table");
}

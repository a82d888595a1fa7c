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

every_backend!(
    a_stuck_claim_is_found_read_and_forgotten_and_the_next_delivery_runs_once,
    a_record_completed_after_it_was_read_is_not_forgotten,
    a_listing_ends_at_its_bound_however_few_items_match,
);

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
        // Bounded by the records, not the shared server's keyspace (a Redis SCAN's count
        // grows with it: every key it passes counts as examined).
        let (code, listed) = command(
            &store,
            &[
                "list",
                "--prefix",
                &prefix,
                "--stuck",
                "--max-items",
                "100000000",
            ],
        )
        .await;
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
        let version = read["version"].as_str().unwrap().to_owned();

        // A forget conditioned on another version deletes nothing.
        let (code, refused) =
            command(&store, &["forget", &id, "--if-version", "0123456789abcdef"]).await;
        assert_eq!(
            (code, &refused["forgotten"]),
            (4, &json!(false)),
            "{refused}"
        );

        // Forget it as read.
        let (code, forgot) = command(&store, &["forget", &id, "--if-version", &version]).await;
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
    // An unescaped '#' in a password: the URL does not parse, and no part of it is shown.
    let (code, text) = run(&["--store", "redis://:hun#ter2@127.0.0.1:1", "get", "k"]).await;
    assert_eq!(code, 2, "{text}");
    assert!(!text.contains("ter2"), "a password holding '#': {text}");
    // A URL that cannot parse is a setting to fix, not a store that failed.
    for args in [
        &["--store", "postgres://u:hunter2@db:notaport/x", "get", "k"],
        &["--store", "redis://127.0.0.1:99999999", "get", "k"],
    ] {
        let (code, text) = run(args).await;
        assert_eq!(code, 2, "{args:?}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    // With --json, stdout is one JSON document whatever happens.
    for (args, exit) in [
        (
            &[
                "--json",
                "--store",
                "redis://:hunter2@127.0.0.1:1",
                "get",
                "k",
            ][..],
            1,
        ),
        (&["--json", "get", "k"][..], 2),
        (&["--json", "frobnicate"][..], 2),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
            .args(args)
            .env_remove("IDEMPOTENCY_STORE")
            .env_remove("IDEMPOTENCY_TABLE")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let value: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{args:?}: stdout is no JSON ({e}): {stdout:?}"));
        assert_eq!(out.status.code(), Some(exit), "{args:?}");
        assert_eq!(value["exit"], exit, "{value}");
        assert!(
            value["error"]
                .as_str()
                .is_some_and(|e| !e.contains("hunter2")),
            "{value}"
        );
    }
    let (code, text) = run(&["--store", "dynamodb://a/b", "get", "k"]).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("names one table"), "{text}");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
        .arg("frobnicate")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stdout.is_empty(),
        "without --json, a mistake is told on stderr only"
    );
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
    // Without a prefix: every record under the partition value (the runbook's
    // `list --stuck`).
    let (code, every) = run(&["list", "--stuck"]).await;
    assert_eq!(code, 0, "{every}");
    assert_eq!(every["records"][0]["id"], id, "{every}");
    let (code, read) = run(&["get", "orders-worker.send#o-1"]).await;
    assert_eq!((code, &read["status"]), (0, &json!("INPROGRESS")), "{read}");
    let (code, forgot) = run(&["forget", "orders-worker.send#o-1"]).await;
    assert_eq!((code, &forgot["forgotten"]), (0, &json!(true)), "{forgot}");
    assert_eq!(store.get(id).await.unwrap(), None, "forgotten in the table");

    // Settings that do not describe the table's key fail at once, naming the settings.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
        .args(["--store", &format!("dynamodb://{}", table.name), "get", "k"])
        .env("AWS_ENDPOINT_URL_DYNAMODB", table.endpoint_url())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env_remove("IDEMPOTENCY_TABLE_PARTITION_KEY")
        .env_remove("IDEMPOTENCY_TABLE_SORT_KEY")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("IDEMPOTENCY_TABLE_PARTITION_KEY"),
        "{stderr}"
    );
}

/// A stuck claim's worker may still complete it after the operator read it, with the
/// claim's own token: `forget --if-version` of the claim as read deletes nothing then,
/// and the stored answer stays (deleting it would run the function again).
async fn a_record_completed_after_it_was_read_is_not_forgotten(backend: Backend) {
    use lambda_idempotency::store::Claim;
    let store = TestStore::open(backend, "operator-race").await;
    let now = std::time::SystemTime::now();
    let id = format!("worker.race-{:08x}#k", fastrand_u32());
    let claim = Claim::new(
        id.as_str(),
        now - Duration::from_secs(600),
        now - Duration::from_secs(570),
        "the-claim",
    )
    .expires_at(now + Duration::from_secs(3600));
    store.store.claim(&claim).await.unwrap();
    if backend == Backend::Memory {
        // No other process reaches it: the same through the API the tool calls.
        let read = store.store.get(&id).await.unwrap().unwrap();
        store
            .store
            .complete(&claim, Some("\"done\""), now + Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(store.store.forget(&read).await.unwrap(), Forgotten::Changed);
        return;
    }
    let (code, read) = command(&store, &["get", &id]).await;
    assert_eq!((code, &read["status"]), (0, &json!("INPROGRESS")), "{read}");
    let version = read["version"].as_str().unwrap().to_owned();

    store
        .store
        .complete(&claim, Some("\"done\""), now + Duration::from_secs(3600))
        .await
        .unwrap();
    let (code, refused) = command(&store, &["forget", &id, "--if-version", &version]).await;
    assert_eq!(
        (code, &refused["forgotten"], &refused["changed"]),
        (4, &json!(false), &json!(true)),
        "{backend}: the completion since the read is kept: {refused}"
    );
    let (code, kept) = command(&store, &["get", &id, "--data"]).await;
    assert_eq!(
        (code, &kept["status"], &kept["data"]),
        (0, &json!("COMPLETED"), &json!("\"done\"")),
        "{kept}"
    );
    // For a person: a completed record has no lease to show, whatever its store kept of
    // the claim's.
    let (code, text) = for_a_person(&store, &["get", &id]).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("status") && l.contains("COMPLETED"))
            && !text
                .lines()
                .any(|l| l.starts_with("lease") && !l.starts_with("lease token")),
        "{backend}: {text}"
    );
    // Forgetting a completed record says what becomes of the rows its function committed
    // with it.
    let (code, text) = for_a_person(
        &store,
        &[
            "forget",
            &id,
            "--if-version",
            kept["version"].as_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("forgotten") && text.contains("delete or upsert"),
        "{text}"
    );
    let (code, gone) = command(&store, &["get", &id]).await;
    assert_eq!((code, &gone["found"]), (3, &json!(false)), "{gone}");
}

/// The binary's exit status and its stdout, as a person reads it.
async fn for_a_person(store: &TestStore, args: &[&str]) -> (i32, String) {
    let (url, env) = store
        .command_line()
        .expect("a store another process reaches");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
        .args(["--store", &url, "--quiet"])
        .args(args)
        .env_remove("IDEMPOTENCY_STORE")
        .env_remove("IDEMPOTENCY_TABLE")
        .env_remove("IDEMPOTENCY_REDIS_NAMESPACE")
        .envs(env)
        .output()
        .await
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().expect("an exit status"),
        format!("{text}{stderr}"),
    )
}

/// `--max-items` bounds what a listing examines, not only what it matches: a prefix that
/// matches one record among many unrelated ones still ends (a DynamoDB `Scan`, a Redis
/// `SCAN` over a shared keyspace), and says it stopped early; with room, it finds it.
async fn a_listing_ends_at_its_bound_however_few_items_match(backend: Backend) {
    use lambda_idempotency::store::Claim;
    let store = TestStore::open(backend, "operator-bound").await;
    let now = std::time::SystemTime::now();
    let run = format!("bound-{:08x}", fastrand_u32());
    let claim = |id: String| {
        Claim::new(id, now, now + Duration::from_secs(60), "t")
            .expires_at(now + Duration::from_secs(600))
    };
    for i in 0..40 {
        store
            .store
            .claim(&claim(format!("worker.{run}-other#{i}")))
            .await
            .unwrap();
    }
    let mine = format!("worker.{run}-mine#k");
    store.store.claim(&claim(mine.clone())).await.unwrap();
    // A completed neighbour under the same prefix, which `--status` below leaves out.
    let done = claim(format!("worker.{run}-mine#done"));
    store.store.claim(&done).await.unwrap();
    store
        .store
        .complete(&done, Some("1"), now + Duration::from_secs(600))
        .await
        .unwrap();
    let prefix = format!("worker.{run}-mine#");
    if backend == Backend::Memory {
        // No other process reaches it: what the tool bounds on, through the API.
        let page = store
            .store
            .list(&ListRequest::new(prefix, 1))
            .await
            .unwrap();
        assert_eq!((page.records.len(), page.examined), (1, 1));
        return;
    }

    let (code, bounded) = command(
        &store,
        &[
            "list",
            "--prefix",
            &prefix,
            "--page-size",
            "1",
            "--max-items",
            "3",
        ],
    )
    .await;
    assert_eq!(code, 0, "{bounded}");
    let examined = bounded["examined"].as_u64().unwrap();
    if bounded["complete"] == json!(false) {
        assert!((3..40).contains(&examined), "{backend}: {bounded}");
    } else {
        // Only a store that finds a prefix by its index (PostgreSQL) ends this soon.
        assert_eq!(backend, Backend::Postgres, "{bounded}");
        assert!(
            bounded["records"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == json!(mine)),
            "{bounded}"
        );
    }
    if backend != Backend::Postgres {
        assert_eq!(bounded["complete"], json!(false), "{backend}: {bounded}");
    }

    let (code, whole) = command(
        &store,
        &[
            "list",
            "--prefix",
            &prefix,
            "--status",
            "in-progress",
            "--page-size",
            "1000",
            "--max-items",
            "100000000",
        ],
    )
    .await;
    assert_eq!(code, 0, "{whole}");
    assert_eq!(whole["complete"], json!(true), "{whole}");
    assert!(
        whole["read"].as_u64().unwrap() >= 2,
        "both records read: {whole}"
    );
    let ids: Vec<&str> = whole["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [mine.as_str()], "{backend}: {whole}");
}

/// A cluster reached through one of its nodes (an ElastiCache configuration endpoint is
/// one URL) is found to be one: every node's records are listed and read, as through the
/// list of every node's URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_read_through_any_one_of_its_nodes() {
    let store = TestStore::open(Backend::RedisCluster, "operator-one-node").await;
    let now = std::time::SystemTime::now();
    let run = format!("nodes-{:08x}", fastrand_u32());
    let mut ids = Vec::new();
    for i in 0..12 {
        let id = format!("worker.{run}#{i}");
        let claim = lambda_idempotency::store::Claim::new(
            id.as_str(),
            now,
            now + Duration::from_secs(60),
            "t",
        )
        .expires_at(now + Duration::from_secs(600));
        store.store.claim(&claim).await.unwrap();
        ids.push(id);
    }
    let (urls, env) = store.command_line().unwrap();
    let first = urls.split(',').next().unwrap().to_owned();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"));
    command
        .args(["--store", &first, "--json", "--quiet", "list"])
        .args(["--max-items", "100000000", "--prefix"])
        .arg(format!("worker.{run}#"))
        .envs(env.clone());
    let out = command.output().await.unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{listed}");
    let mut found: Vec<&str> = listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    found.sort_unstable();
    let mut expected: Vec<&str> = ids.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(found, expected, "every node's records: {listed}");
    for id in &ids {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
            .args(["--store", &first, "--json", "get", id])
            .envs(env.clone())
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{id}: {out:?}");
    }
}

/// A DynamoDB endpoint that takes the connection and never answers: the command ends, as
/// a store that failed (1), instead of hanging an operator's terminal.
#[tokio::test]
async fn a_store_that_never_answers_ends_the_command() {
    let addr = test_support::servers::silent_listener();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"))
        .args(["--store", "dynamodb://t", "--json", "get", "k"])
        .env("AWS_ENDPOINT_URL_DYNAMODB", format!("http://{addr}"))
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env_remove("IDEMPOTENCY_TABLE_PARTITION_KEY")
        .env_remove("IDEMPOTENCY_TABLE_SORT_KEY")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("timed out") || stdout.contains("did not answer"),
        "{stdout}"
    );
}

/// A person's listing: what matched, what was examined, that it stopped early, and the
/// progress on stderr (unless `--quiet`); a reader that goes away ends it quietly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_for_a_person_says_where_it_stopped() {
    let store = TestStore::open(Backend::Redis, "operator-human").await;
    let (url, env) = store.command_line().unwrap();
    let now = std::time::SystemTime::now();
    let run = format!("human-{:08x}", fastrand_u32());
    for i in 0..5 {
        let claim = lambda_idempotency::store::Claim::new(
            format!("worker.{run}#{i}"),
            now,
            now + Duration::from_secs(60),
            "t",
        )
        .expires_at(now + Duration::from_secs(600));
        store.store.claim(&claim).await.unwrap();
    }
    let list = |extra: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"));
        command
            .args([
                "--store",
                &url,
                "list",
                "--page-size",
                "1",
                "--max-items",
                "2",
            ])
            .args(extra)
            .envs(env.clone());
        command
    };
    let out = list(&[]).output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("stopped at --max-items 2"), "{stdout}");
    assert_eq!(
        stdout.matches("records read").count(),
        1,
        "the summary once: {stdout}"
    );
    assert!(
        stderr.is_empty(),
        "a listing done within a second has no progress to tell, and its summary is on stdout once: {stderr}"
    );

    // A listing that takes seconds (each page held back by a slow network) tells its
    // progress on stderr as it goes, unless `--quiet`; its summary is still said once.
    let proxy = test_support::proxy::Proxy::start(
        test_support::servers::redis_addr(),
        Duration::from_millis(400),
    )
    .await;
    let slow_url = format!("redis://{}", proxy.addr());
    let slow = |quiet: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"));
        command
            .args(["--store", &slow_url, "list", "--page-size", "1"])
            // The whole keyspace: a few round trips at least (a SCAN's count grows tenfold
            // after a step without a match), each held back 400 ms.
            .args(["--max-items", "100000000", "--prefix"])
            .arg(format!("worker.{run}#"))
            .args(quiet)
            .envs(env.clone());
        command
    };
    let out = slow(&[]).output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("examined"), "progress on stderr: {stderr}");
    assert_eq!(stdout.matches("records read").count(), 1, "{stdout}");
    let quiet = slow(&["--quiet"]).output().await.unwrap();
    assert!(quiet.stderr.is_empty(), "{quiet:?}");

    // `| head` that has read enough: the pipe is closed before the listing is written.
    let mut child = list(&["--quiet"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().await.unwrap();
    assert_eq!(
        status.code(),
        Some(141),
        "a broken pipe is no store failure"
    );
}

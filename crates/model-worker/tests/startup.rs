//! Start-up against a DynamoDB table, through the real binary under the mock Lambda
//! Runtime API and the DynamoDB test server (`DYNAMODB_TEST_ENDPOINT`; `scripts/test`
//! starts it): a table that cannot work stops the process with status 2 and a message
//! naming it, whether or not a message was already delivered, and no message is claimed
//! (nor the provider asked) before the table passed its check. The table's read does not
//! hold init: the first `/next` comes before it ends.

use provider_stub::ProviderStub;
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};
use test_support::runtime_api::RuntimeApi;
use test_support::{Emulator, TestTable};

const SINGLE: &str = include_str!("../../../events/single-request.json");

/// A started worker, its Runtime API and its provider.
struct Run {
    runtime: RuntimeApi,
    provider: ProviderStub,
    child: tokio::process::Child,
    launched: Instant,
    output: tokio::task::JoinHandle<String>,
}

/// Starts the worker on DynamoDB table `table`, one SQS message already queued.
async fn start(table: &str) -> Run {
    let endpoint = test_support::endpoint().await;
    start_on(&[
        ("IDEMPOTENCY_STORE", "dynamodb"),
        ("IDEMPOTENCY_TABLE", table),
        ("AWS_ENDPOINT_URL_DYNAMODB", &endpoint),
    ])
    .await
}

/// Starts the worker on PostgreSQL table `table` (`schema.table`) of the test server.
#[cfg(feature = "postgres")]
async fn start_postgres(table: &str) -> Run {
    start_on(&[
        ("IDEMPOTENCY_STORE", "postgres"),
        ("IDEMPOTENCY_TABLE", table),
        ("DATABASE_URL", &test_support::servers::postgres_url()),
    ])
    .await
}

/// Starts the worker on the store `store` sets up, one SQS message already queued.
async fn start_on(store: &[(&str, &str)]) -> Run {
    let provider = ProviderStub::start().await.unwrap();
    let runtime = RuntimeApi::start().await.unwrap();
    runtime.invoke(serde_json::from_str::<Value>(SINGLE).unwrap());
    let launched = Instant::now();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_model-worker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &runtime.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "model-worker")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .envs(store.iter().copied())
        .env("MODEL_BASE_URL", provider.base_url())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("RUST_LOG", "info")
        // The worker logs through tracing, to stdout as Lambda's default subscriber does.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start model-worker");
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let output = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut out, mut err) = (String::new(), String::new());
        let _ = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        out + &err
    });
    Run {
        runtime,
        provider,
        child,
        launched,
        output,
    }
}

impl Run {
    /// Waits for the process to exit: its status code and everything it wrote.
    async fn exit(mut self) -> (Option<i32>, String, Self) {
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("model-worker exits at start-up")
            .unwrap();
        let output = (&mut self.output).await.unwrap();
        (status.code(), output, self)
    }

    /// The first invocation's answer (its path and body); fails, with what the worker
    /// wrote, if the process exits first.
    async fn answer(&mut self) -> (String, Value) {
        tokio::select! {
            answer = self.runtime.response() => answer,
            status = self.child.wait() => {
                let output = (&mut self.output).await.unwrap();
                panic!("model-worker exited ({:?}) before answering:\n{output}", status.unwrap());
            }
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                panic!("model-worker did not answer its first message within 30 s");
            }
        }
    }

    /// Fails if the worker answered an invocation as a success.
    async fn assert_nothing_answered(&self, output: &str) {
        if let Ok((path, body)) =
            tokio::time::timeout(Duration::from_millis(300), self.runtime.response()).await
        {
            assert!(
                !path.ends_with("/response"),
                "the worker answered the message instead of stopping: {path} {body}\n{output}"
            );
        }
        assert_eq!(self.provider.completion_calls(), 0, "{output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_stops_the_worker_with_status_2_and_a_message_naming_it() {
    let table = format!("startup-missing-{}", std::process::id());
    let (code, output, run) = start(&table).await.exit().await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("cannot start") && output.contains(&format!("{table:?}")),
        "{output}"
    );
    assert!(output.contains("ResourceNotFoundException"), "{output}");
    run.assert_nothing_answered(&output).await;
}

/// On PostgreSQL, a table that does not exist, or lacks a column the store uses, or has
/// one of another type, stops the worker at start-up as on DynamoDB: status 2, the table
/// named with what is wrong and the DDL that fixes it, the queued message not answered
/// nor claimed. The table `create_table` makes answers it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_that_cannot_work_stops_the_worker_too() {
    use test_support::servers::{postgres_schema, postgres_url};
    let (admin, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let schema = postgres_schema();
    admin
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .await
        .ok();
    let run_id = std::process::id();
    let full = "id text PRIMARY KEY, status text NOT NULL, expiration bigint NOT NULL, \
                in_progress_expiration bigint, data text, validation text, lease_token text";
    for (what, ddl, says) in [
        ("missing", None, "it does not exist"),
        (
            "no_token",
            Some(full.replace(", lease_token text", "")),
            "it has no column lease_token",
        ),
        (
            "int_expiry",
            Some(full.replace("expiration bigint NOT NULL", "expiration integer NOT NULL")),
            "its column expiration is integer, not bigint",
        ),
    ] {
        let table = format!("{schema}.startup_{what}_{run_id}");
        if let Some(ddl) = &ddl {
            admin
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({ddl})"
                ))
                .await
                .unwrap();
        }
        let (code, output, run) = start_postgres(&table).await.exit().await;
        assert_eq!(code, Some(2), "{what}: {output}");
        assert!(
            output.contains("cannot start")
                && output.contains(&format!(
                    "{table:?} (IDEMPOTENCY_TABLE) failed its start-up check"
                ))
                && output.contains(says)
                && output.contains("CREATE TABLE IF NOT EXISTS"),
            "{what}: {output}"
        );
        run.assert_nothing_answered(&output).await;
        if ddl.is_some() {
            let claimed: i64 = admin
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(claimed, 0, "{what}: nothing claimed");
        }
        admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await
            .unwrap();
    }

    let table = format!("{schema}.startup_good_{run_id}");
    let store = lambda_idempotency::PostgresStore::from_url(&postgres_url(), &table).unwrap();
    store.create_table().await.unwrap();
    let mut run = start_postgres(&table).await;
    let (path, _) = run.answer().await;
    assert!(path.ends_with("/response"), "{path}");
    assert_eq!(run.provider.completion_calls(), 1);
    admin
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_keyed_otherwise_than_configured_stops_the_worker_too() {
    let table = TestTable::create_keyed(Emulator::Moto, "startup-keyed", "pk", Some("sk")).await;
    let (code, output, run) = start(&table.name).await.exit().await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains(&format!(
            "table {:?} has key (pk HASH, sk RANGE) but the store was set up for (id HASH)",
            table.name
        )),
        "{output}"
    );
    run.assert_nothing_answered(&output).await;
    let counts = table.counts().await;
    assert_eq!(counts.get("PutItem"), None, "no claim: {counts:?}");
}

/// The table's read is held for a second: init ends (the first `/next`, the message
/// delivered) long before it, and the message waits; the table turns out missing, and the
/// process stops with status 2 without having claimed it or asked the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_ends_before_the_table_check_and_no_message_is_claimed_before_it_passed() {
    let table = TestTable::create("startup-slow-missing").await;
    table.inject_hang("GetItem", 1.0, 1).await;
    table
        .client
        .delete_table()
        .table_name(&table.name)
        .send()
        .await
        .unwrap();
    let (code, output, run) = start(&table.name).await.exit().await;
    let first_poll = run
        .runtime
        .first_poll()
        .await
        .expect("the worker asked for its first message before the check ended");
    assert!(
        first_poll - run.launched < Duration::from_millis(900),
        "init waited for the table's read: {:?}\n{output}",
        first_poll - run.launched
    );
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("cannot start") && output.contains(&format!("{:?}", table.name)),
        "{output}"
    );
    run.assert_nothing_answered(&output).await;
    let counts = table.counts().await;
    assert_eq!(counts.get("PutItem"), None, "no claim: {counts:?}");
}

/// A good table, its read held half a second: the first message waits for it, then is
/// answered with one provider call, one claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_table_answers_its_first_message_with_one_provider_call() {
    let table = TestTable::create("startup-good").await;
    table.inject_hang("GetItem", 0.5, 1).await;
    let mut run = start(&table.name).await;
    let (path, body) = run.answer().await;
    assert!(path.ends_with("/response"), "{path}: {body}");
    assert_eq!(body["batchItemFailures"], serde_json::json!([]), "{body}");
    assert!(
        run.launched.elapsed() >= Duration::from_millis(500),
        "answered before the table's read ended"
    );
    assert_eq!(run.provider.completion_calls(), 1);
    let counts = table.counts().await;
    assert_eq!(
        (counts.get("GetItem"), counts.get("PutItem")),
        (Some(&1), Some(&1)),
        "one read of the table, one claim: {counts:?}"
    );
    assert_eq!(run.child.try_wait().unwrap(), None, "still running");
    run.child.start_kill().unwrap();
}

/// A check that fails for a reason a retry may fix (throttling here; a request cut off
/// when Lambda froze the environment right after init) is tried again, not fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_table_check_is_tried_again() {
    let table = TestTable::create("startup-throttled").await;
    table.inject("GetItem", "throttle", 1).await;
    let mut run = start(&table.name).await;
    let (path, body) = run.answer().await;
    assert!(path.ends_with("/response"), "{path}: {body}");
    assert_eq!(body["batchItemFailures"], serde_json::json!([]), "{body}");
    assert_eq!(run.provider.completion_calls(), 1);
    assert_eq!(table.counts().await.get("GetItem"), Some(&2));
    run.child.start_kill().unwrap();
}

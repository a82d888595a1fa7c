//! The command line of the built `lambda-idempotency` binary: help, version, mistakes and
//! their suggestions, the options the worker's variables back, durations, and the exit
//! status of a store that cannot be opened as set (a refused role or password, a table that
//! is not the worker's), against the real servers.

use serde_json::Value;
use std::process::Output;
use test_support::servers::{postgres_schema, postgres_url, redis_url, unique};

/// The worker's variables, none of them set unless a test sets it.
const WORKER_VARIABLES: &[&str] = &[
    "IDEMPOTENCY_STORE",
    "IDEMPOTENCY_TABLE",
    "IDEMPOTENCY_TABLE_PARTITION_KEY",
    "IDEMPOTENCY_TABLE_SORT_KEY",
    "IDEMPOTENCY_TABLE_PARTITION_VALUE",
    "IDEMPOTENCY_REDIS_NAMESPACE",
    "IDEMPOTENCY_KEY_PREFIX",
    "AWS_LAMBDA_FUNCTION_NAME",
    "REDIS_URL",
    "DATABASE_URL",
];

/// Runs the binary with `args` and `env`; its exit status, stdout and stderr.
async fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lambda-idempotency"));
    command.args(args);
    for name in WORKER_VARIABLES {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = command.kill_on_drop(true).output().await.unwrap();
    (
        status.code().expect("an exit status"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// `--version`, `help COMMAND` and `COMMAND --help` answer on stdout with 0; the help shows
/// the options the worker's variables back, with the variables' names, and `forget` says
/// what happens to the rows its function committed with the record.
#[tokio::test]
async fn help_and_version_answer_on_stdout() {
    let (code, out, err) = run(&["--version"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        concat!("lambda-idempotency ", env!("CARGO_PKG_VERSION"))
    );
    let (code, by_help, err) = run(&["help", "list"], &[]).await;
    assert_eq!(code, 0, "{err}");
    let (code, by_flag, err) = run(&["list", "--help"], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(by_help, by_flag);
    assert!(
        by_flag.contains("--stuck-for <DURATION>") && by_flag.contains("--max-items"),
        "{by_flag}"
    );
    let (code, help, _) = run(&["--help"], &[]).await;
    assert_eq!(code, 0);
    for shown in [
        "[env: IDEMPOTENCY_TABLE",
        "[env: IDEMPOTENCY_TABLE_PARTITION_KEY",
        "[env: IDEMPOTENCY_TABLE_SORT_KEY",
        "[env: IDEMPOTENCY_TABLE_PARTITION_VALUE",
        "[env: IDEMPOTENCY_REDIS_NAMESPACE",
        "[env: AWS_LAMBDA_FUNCTION_NAME",
        "exit status",
    ] {
        assert!(help.contains(shown), "{shown}: {help}");
    }
    let (code, forget, _) = run(&["help", "forget"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        forget.contains("execute_committing") && forget.contains("delete or upsert"),
        "{forget}"
    );
}

/// A mistyped command is answered with the one meant, as a usage error (2); with `--json`,
/// stdout is still one JSON document.
#[tokio::test]
async fn a_mistyped_command_suggests_the_one_meant() {
    let (code, out, err) = run(&["lsit"], &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("similar") && err.contains("'list'"), "{err}");
    let (code, out, _) = run(&["--json", "lsit", "--stuck"], &[]).await;
    assert_eq!(code, 2);
    let value: Value = serde_json::from_str(out.trim()).expect("one JSON document");
    assert_eq!(value["exit"], 2);
    assert!(
        value["error"].as_str().unwrap().contains("'list'"),
        "{value}"
    );
    let (code, _, err) = run(&["list", "--stuck", "--status", "completed"], &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--stuck"), "{err}");
}

/// Durations read as people write them (`1h30m`, `90s`, bare seconds); one that is not a
/// duration is a usage error naming it.
#[tokio::test]
async fn durations_read_as_people_write_them() {
    let namespace = format!("{}:", unique("cli-durations"));
    let url = redis_url();
    for duration in ["1h30m", "90s", "2d", "600"] {
        let (code, out, err) = run(
            &[
                "--store",
                &url,
                "--json",
                "-q",
                "list",
                "--stuck-for",
                duration,
            ],
            &[("IDEMPOTENCY_REDIS_NAMESPACE", &namespace)],
        )
        .await;
        assert_eq!(code, 0, "{duration}: {out} {err}");
    }
    let (code, _, err) = run(&["list", "--stuck-for", "10x"], &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("10x"), "{err}");
}

/// A role or password the server refuses is a setting to fix (2) on every store, named
/// before any record is asked for; PostgreSQL connects when the command opens it.
#[tokio::test]
async fn refused_credentials_are_a_setting_on_every_store() {
    let postgres = postgres_url();
    let (_, host) = postgres
        .split_once("://")
        .map(|(scheme, rest)| (scheme, rest.rsplit('@').next().unwrap_or(rest)))
        .unwrap();
    let no_role = format!("postgres://nosuchrole_cli37:hunter2@{host}");
    let redis = redis_url();
    let redis_host = redis.rsplit(['@', '/']).find(|s| !s.is_empty()).unwrap();
    let wrong_password = format!("redis://nosuchuser_cli37:hunter2@{redis_host}");
    for url in [no_role.as_str(), wrong_password.as_str()] {
        for command in [&["get", "k"][..], &["list"], &["forget", "k"]] {
            let mut args = vec!["--store", url, "--json", "-q"];
            args.extend_from_slice(command);
            let (code, out, err) = run(&args, &[]).await;
            assert_eq!(code, 2, "{url} {command:?}: {out} {err}");
            assert!(!out.contains("hunter2") && !err.contains("hunter2"));
            let value: Value = serde_json::from_str(out.trim()).expect("one JSON document");
            assert_eq!(value["exit"], 2, "{value}");
        }
    }
}

/// PostgreSQL's table is the worker's `IDEMPOTENCY_TABLE`: a table that does not exist is
/// a setting (2) that says to set the variable (or `--table`) to the worker's table, not
/// to create one; `--table` reads the same table the variable would.
#[tokio::test]
async fn a_postgres_table_that_does_not_exist_names_the_worker_s_variable() {
    let url = postgres_url();
    let table = format!("{}.{}", postgres_schema(), unique("cli_no_table"));
    let (code, out, err) = run(
        &["--store", &url, "get", "k"],
        &[("IDEMPOTENCY_TABLE", &table)],
    )
    .await;
    assert_eq!(code, 2, "{out} {err}");
    assert!(
        err.contains(&table)
            && err.contains("IDEMPOTENCY_TABLE")
            && err.contains("worker")
            && !err.contains("create"),
        "{err}"
    );
    let (code, _, by_option) = run(&["--store", &url, "--table", &table, "get", "k"], &[]).await;
    assert_eq!(code, 2, "{by_option}");
    assert!(by_option.contains(&table), "{by_option}");
}

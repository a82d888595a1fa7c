//! Start-up of the model-worker, against the mock Lambda Runtime API. Median of 9 starts
//! per row. Needs the test servers (`scripts/bench-features` finds or starts them).
//!
//! 1. **Per phase, against a bare worker** (`bench-startup phases`, or the first part of
//!    a whole run): on DynamoDB, Redis and PostgreSQL, the worker built with every store
//!    (`target/feature-sets/model-worker-redis-postgres`) and `floor-worker` (a bare
//!    `lambda_runtime` binary doing the same start-up without the library: the secret, the
//!    store's client or connection), with the API key in the environment, then read from
//!    Secrets Manager (the test server's); the starts of all twelve take turns. Each
//!    binary logs one line at the end of init with its phases
//!    (`model_worker::startup::Phases`); the runtime's start (`exec` to `main`) is
//!    `main`'s clock minus the launcher's, the rest to the first
//!    `GET /runtime/invocation/next` and to the first delivery's answer are the mock's.
//! 2. **Per feature set** (`bench-startup features`, or the second part): each build of
//!    `scripts/bench-features` on each store it holds, from `exec` to the first `/next`
//!    and to the first delivery's answer.
//!
//! The binaries are found beside this one: `feature-sets/` in its target directory (or
//! `FEATURE_SETS_DIR`), `floor-worker` in its own directory.

use benchmarks::runtime_api::RuntimeApi;
use benchmarks::{sqs_event, typical_body};
use model_worker::startup::{CHECK_LINE, PHASES_LINE};
use provider_stub::ProviderStub;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use test_support::TestTable;
use test_support::servers::{postgres_schema, postgres_url, redis_prefix, redis_url};
use tokio::io::AsyncBufReadExt;

/// Starts per row, unless `STARTUP_STARTS` says otherwise.
const STARTS: usize = 9;

fn starts() -> usize {
    std::env::var("STARTUP_STARTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(STARTS)
}

/// The stores of the per-phase comparison.
const STORES: [&str; 3] = ["dynamodb", "redis", "postgres"];

/// The rows of the per-phase table: the name in the start-up line (or a measured span),
/// and what the row says.
const PHASES: [(&str, &str); 9] = [
    (
        "runtime",
        "runtime start (`exec` to `main`, tokio's runtime built)",
    ),
    ("configuration", "configuration"),
    ("secret", "secret fetch (Secrets Manager)"),
    ("store_client", "store client"),
    ("store_connect", "table check (its start) / connection"),
    ("worker", "model client (+ answers table)"),
    ("metrics", "metrics recorder"),
    ("to_next", "runtime client to the first `/next`"),
    (
        "first_invocation",
        "first invocation (`/next` to its answer)",
    ),
];

#[tokio::main]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    let bench = Bench::new().await;
    if what.is_empty() || what == "phases" {
        bench.phases().await;
    }
    if what.is_empty() || what == "features" {
        bench.features().await;
    }
}

/// One figure of a start, if it has it.
type Measure<'a> = dyn Fn(&Start) -> Option<f64> + 'a;

/// What one start measured.
#[derive(Debug, Default)]
struct Start {
    /// Phase (or span) to milliseconds.
    ms: BTreeMap<String, f64>,
    /// `exec` to the first `/next`.
    init: f64,
    /// `exec` to the first delivery's answer.
    answer: f64,
}

struct Bench {
    provider: ProviderStub,
    endpoint: String,
    table: TestTable,
    pg_table: String,
    prefix: String,
    secret_arn: String,
    feature_sets: PathBuf,
    floor: PathBuf,
}

impl Bench {
    async fn new() -> Self {
        let exe = std::env::current_exe().expect("this binary's path");
        let dir = exe.parent().expect("a directory").to_owned();
        let feature_sets = std::env::var_os("FEATURE_SETS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                dir.parent()
                    .expect("the target directory")
                    .join("feature-sets")
            });
        let provider = ProviderStub::start().await.unwrap();
        let endpoint = test_support::endpoint().await;
        let table = TestTable::create("startup").await;
        let pg_table = format!("{}.startup_{}", postgres_schema(), std::process::id());
        let store = lambda_idempotency::PostgresStore::from_url(&postgres_url(), &pg_table)
            .unwrap_or_else(|e| panic!("{e}: {}", test_support::servers::HOW));
        store.create_table().await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {}: {e}; {}",
                postgres_url(),
                test_support::servers::HOW
            )
        });
        let secret_arn = create_secret(&endpoint).await;
        Bench {
            provider,
            endpoint,
            table,
            pg_table,
            prefix: redis_prefix("startup"),
            secret_arn,
            feature_sets,
            floor: dir.join("floor-worker"),
        }
    }

    /// The environment of a start on `store`.
    fn env(&self, store: &str, secret: bool) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("IDEMPOTENCY_STORE", store.to_owned()),
            ("MODEL_BASE_URL", self.provider.base_url()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "bench".into()),
            ("AWS_SECRET_ACCESS_KEY", "bench".into()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ];
        if secret {
            env.push(("MODEL_API_KEY_SECRET_ARN", self.secret_arn.clone()));
        }
        match store {
            "dynamodb" => env.push(("IDEMPOTENCY_TABLE", self.table.name.clone())),
            "redis" => {
                env.push(("REDIS_URL", redis_url()));
                env.push(("IDEMPOTENCY_REDIS_NAMESPACE", self.prefix.clone()));
            }
            "postgres" => {
                env.push(("DATABASE_URL", postgres_url()));
                env.push(("IDEMPOTENCY_TABLE", self.pg_table.clone()));
            }
            _ => {}
        }
        env
    }

    /// The per-phase tables, worker against the bare worker on each store: without a
    /// secret, then with one.
    async fn phases(&self) {
        let worker = self.feature_sets.join("model-worker-redis-postgres");
        let starts = starts();
        let mut runs: BTreeMap<(bool, &str, &str), Vec<Start>> = BTreeMap::new();
        for n in 0..starts {
            for store in STORES {
                for (who, binary) in [("worker", &worker), ("bare", &self.floor)] {
                    for secret in [false, true] {
                        let start = start(binary, &self.env(store, secret), n).await;
                        runs.entry((secret, store, who)).or_default().push(start);
                    }
                }
            }
        }
        let median = |runs: &[Start], f: &Measure<'_>| -> Option<f64> {
            let mut v: Vec<f64> = runs.iter().filter_map(f).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            (!v.is_empty()).then(|| v[v.len() / 2])
        };
        let cell = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), |v| format!("{v:.1} ms"));
        println!(
            "## Start-up per phase, worker against a bare worker (median of {starts} starts)\n\n\
             The worker: `{}`; the bare worker: `{}`.\n",
            worker.file_name().unwrap_or_default().display(),
            self.floor.file_name().unwrap_or_default().display()
        );
        for (secret, title) in [
            (false, "API key in the environment (no secret)"),
            (true, "API key read from Secrets Manager"),
        ] {
            println!("### {title}\n");
            let mut header = "| phase |".to_owned();
            let mut rule = "|---|".to_owned();
            for store in STORES {
                header.push_str(&format!(" {store}: worker | {store}: bare |"));
                rule.push_str("---|---|");
            }
            println!("{header}\n{rule}");
            let rows = PHASES.iter().copied().chain([(
                "store_check",
                "the table check, from its start to its end (beside `/next`, not in init)",
            )]);
            for (phase, label) in rows {
                if phase == "secret" && !secret {
                    continue;
                }
                let mut row = format!("| {label} |");
                for store in STORES {
                    for who in ["worker", "bare"] {
                        let runs = &runs[&(secret, store, who)];
                        // The connection, and the start of the table's check.
                        let value = |s: &Start| match phase {
                            "store_connect" => {
                                let parts = [s.ms.get(phase), s.ms.get("table_check")];
                                let found: Vec<f64> =
                                    parts.into_iter().flatten().copied().collect();
                                (!found.is_empty()).then(|| found.iter().sum())
                            }
                            _ => s.ms.get(phase).copied(),
                        };
                        row.push_str(&format!(" {} |", cell(median(runs, &value))));
                    }
                }
                println!("{row}");
            }
            let spans: [(&str, &Measure<'_>); 2] = [
                ("init: `exec` to the first `/next`", &|s| Some(s.init)),
                ("`exec` to the first answer", &|s| Some(s.answer)),
            ];
            for (span, f) in spans {
                let mut row = format!("| **{span}** |");
                let mut ratios = "| ratio worker / bare |".to_owned();
                for store in STORES {
                    let w = median(&runs[&(secret, store, "worker")], f).unwrap_or(f64::NAN);
                    let b = median(&runs[&(secret, store, "bare")], f).unwrap_or(f64::NAN);
                    row.push_str(&format!(" **{w:.1} ms** | **{b:.1} ms** |"));
                    ratios.push_str(&format!(" **{:.2} x** | |", w / b));
                }
                println!("{row}\n{ratios}");
            }
            println!();
        }
    }

    /// The per-feature-set table.
    async fn features(&self) {
        let starts = starts();
        println!(
            "## Start-up per feature set (median of {starts} starts)\n\n| build | store | start-up to first /next | to the first delivery's answer |\n|---|---|---|---|"
        );
        for (build, stores) in [
            ("default", &["memory", "dynamodb"][..]),
            ("redis", &["memory", "dynamodb", "redis"][..]),
            ("postgres", &["memory", "dynamodb", "postgres"][..]),
            ("redis,postgres", &["memory", "redis", "postgres"][..]),
        ] {
            let binary = self
                .feature_sets
                .join(format!("model-worker-{}", build.replace(',', "-")));
            for store in stores {
                let env = self.env(store, false);
                let mut first_poll = Vec::new();
                let mut first_answer = Vec::new();
                for n in 0..starts {
                    let start = start(&binary, &env, n).await;
                    first_poll.push(start.init);
                    first_answer.push(start.answer);
                }
                first_poll.sort_by(|a, b| a.total_cmp(b));
                first_answer.sort_by(|a, b| a.total_cmp(b));
                println!(
                    "| {build} | {store} | {:.1} ms | {:.1} ms |",
                    first_poll[starts / 2],
                    first_answer[starts / 2]
                );
            }
        }
    }
}

/// A secret holding an API key, on the test server (moto serves Secrets Manager on the
/// DynamoDB test server's port).
async fn create_secret(endpoint: &str) -> String {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
            "bench", "bench", None, None, "bench",
        ))
        .load()
        .await;
    aws_sdk_secretsmanager::Client::new(&config)
        .create_secret()
        .name(format!("bench-startup/{}-{}", std::process::id(), nanos()))
        .secret_string("sk-bench")
        .send()
        .await
        .unwrap_or_else(|e| panic!("create a secret on the test server at {endpoint}: {e:?}"))
        .arn
        .expect("an ARN")
}

/// Starts `binary` under a fresh mock Runtime API, delivers one message once it asks for
/// one, and measures.
async fn start(binary: &PathBuf, env: &[(&str, String)], n: usize) -> Start {
    let api = RuntimeApi::start().await.unwrap();
    let launched_unix = SystemTime::now();
    let launched = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &api.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "startup")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("RUST_LOG", "warn,startup=info")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "start {} (build it with scripts/bench-features): {e}",
                binary.display()
            )
        });
    let stdout = child.stdout.take().expect("piped");
    let lines = tokio::spawn(async move {
        let mut out = Vec::new();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            out.push(line);
        }
        out
    });
    let first_poll = loop {
        if let Some(at) = api.first_poll().await {
            break at;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{} exited with {status} before its first /next",
                binary.display()
            );
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    let body = typical_body(Some(&format!(
        "startup-{}-{n}-{}",
        std::process::id(),
        nanos()
    )));
    api.invoke(sqs_event(&[body]));
    let (path, answer) = api.response().await;
    let answered = launched.elapsed();
    assert!(
        path.ends_with("/response") && answer["batchItemFailures"] == serde_json::json!([]),
        "{}: {path} {answer}",
        binary.display()
    );
    // The check's line, if any, is written before the claim the answer needed.
    child.kill().await.unwrap();
    let lines = lines.await.unwrap();
    let mut start = Start {
        init: millis(first_poll - launched),
        answer: millis(answered),
        ..Start::default()
    };
    let fields = |line: &str, prefix: &str| -> Option<Vec<(String, f64)>> {
        let at = line.find(prefix)?;
        Some(
            line[at + prefix.len()..]
                .split_whitespace()
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    };
    let phases = lines
        .iter()
        .find_map(|line| fields(line, PHASES_LINE))
        .unwrap_or_else(|| panic!("{}: no start-up line in {lines:?}", binary.display()));
    for (key, value) in phases {
        match key.as_str() {
            "main_unix_us" => {
                let launched_us = launched_unix
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_micros();
                start
                    .ms
                    .insert("runtime".into(), (value - launched_us as f64) / 1000.0);
            }
            _ => {
                start
                    .ms
                    .insert(key.trim_end_matches("_ms").to_owned(), value);
            }
        }
    }
    if let Some(check) = lines.iter().find_map(|line| fields(line, CHECK_LINE)) {
        for (key, value) in check {
            start
                .ms
                .insert(key.trim_end_matches("_ms").to_owned(), value);
        }
    }
    let main_to_line = start.ms["runtime"] + start.ms["init"];
    start.ms.insert("to_next".into(), start.init - main_to_line);
    start
        .ms
        .insert("first_invocation".into(), start.answer - start.init);
    start
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

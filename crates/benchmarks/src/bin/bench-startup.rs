//! Start-up of the model-worker built with each feature set (`scripts/bench-features`
//! builds them into `target/feature-sets/`): from `exec` to its first
//! `GET /runtime/invocation/next`, and through its first delivery, on each store the build
//! holds. Median of 9 starts. Needs the test servers (the script finds or starts them).

use benchmarks::runtime_api::RuntimeApi;
use benchmarks::{sqs_event, typical_body};
use provider_stub::ProviderStub;
use std::process::Stdio;
use std::time::{Duration, Instant};
use test_support::TestTable;
use test_support::servers::{postgres_schema, postgres_url, redis_prefix, redis_url};

const STARTS: usize = 9;

#[tokio::main]
async fn main() {
    let dir = format!("{}/../../target/feature-sets", env!("CARGO_MANIFEST_DIR"));
    let provider = ProviderStub::start().await.unwrap();
    let endpoint = test_support::endpoint().await;
    let table = TestTable::create("startup").await;
    let pg_table = format!("{}.startup_{}", postgres_schema(), std::process::id());
    let prefix = redis_prefix("startup");
    println!(
        "## Start-up per feature set (median of {STARTS} starts)\n\n| build | store | start-up to first /next | to the first delivery's answer |\n|---|---|---|---|"
    );
    for (build, stores) in [
        ("default", &["memory", "dynamodb"][..]),
        ("redis", &["memory", "dynamodb", "redis"][..]),
        ("postgres", &["memory", "dynamodb", "postgres"][..]),
        ("redis,postgres", &["memory", "redis", "postgres"][..]),
    ] {
        let binary = format!("{dir}/model-worker-{}", build.replace(',', "-"));
        for store in stores {
            let mut env: Vec<(&str, String)> = vec![
                ("IDEMPOTENCY_STORE", store.to_string()),
                ("MODEL_BASE_URL", provider.base_url()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ACCESS_KEY_ID", "bench".into()),
                ("AWS_SECRET_ACCESS_KEY", "bench".into()),
                ("AWS_ENDPOINT_URL", endpoint.clone()),
            ];
            match *store {
                "dynamodb" => env.push(("IDEMPOTENCY_TABLE", table.name.clone())),
                "redis" => {
                    env.push(("REDIS_URL", redis_url()));
                    env.push(("IDEMPOTENCY_REDIS_NAMESPACE", prefix.clone()));
                }
                "postgres" => {
                    env.push(("DATABASE_URL", postgres_url()));
                    env.push(("IDEMPOTENCY_TABLE", pg_table.clone()));
                    let store =
                        lambda_idempotency::PostgresStore::from_url(&postgres_url(), &pg_table)
                            .unwrap();
                    store.create_table().await.unwrap();
                }
                _ => {}
            }
            let mut first_poll = Vec::new();
            let mut first_answer = Vec::new();
            for n in 0..STARTS {
                let (poll, answer) = start(&binary, &env, n).await;
                first_poll.push(poll);
                first_answer.push(answer);
            }
            first_poll.sort();
            first_answer.sort();
            println!(
                "| {build} | {store} | {:.1} ms | {:.1} ms |",
                first_poll[STARTS / 2].as_secs_f64() * 1000.0,
                first_answer[STARTS / 2].as_secs_f64() * 1000.0
            );
        }
    }
}

async fn start(binary: &str, env: &[(&str, String)], n: usize) -> (Duration, Duration) {
    let api = RuntimeApi::start().await.unwrap();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &api.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "startup")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {binary} (build it with scripts/bench-features): {e}"));
    while api.first_poll().await.is_none() {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let poll = api.first_poll().await.unwrap() - started;
    let body = typical_body(Some(&format!(
        "startup-{}-{n}-{}",
        std::process::id(),
        fastrand_id()
    )));
    api.invoke(sqs_event(&[body]));
    let (path, answer) = api.response().await;
    assert!(path.ends_with("/response"), "{binary}: {path} {answer}");
    let answered = started.elapsed();
    child.kill().await.unwrap();
    (poll, answered)
}

fn fastrand_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

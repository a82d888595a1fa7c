//! The release model-worker against the floor (a bare lambda_runtime binary making the same
//! two DynamoDB requests and provider call, no idempotency), driven through a mock Lambda
//! Runtime API: start-up to the first invocation request, CPU per delivery, and peak RSS
//! while serving a batch of ten. Needs the DynamoDB test server and the release binaries
//! (`scripts/bench` builds and starts them).

use benchmarks::runtime_api::RuntimeApi;
use benchmarks::{sqs_event, typical_body};
use provider_stub::ProviderStub;
use std::process::Stdio;
use std::time::{Duration, Instant};
use test_support::TestTable;

const DELIVERIES: usize = 400;
const ROUNDS: usize = 3;

struct Measured {
    startup: Duration,
    cpu_per_delivery: Duration,
    peak_rss_kib: u64,
}

#[tokio::main]
async fn main() {
    let provider = ProviderStub::start().await.unwrap();
    let endpoint = test_support::endpoint().await;
    let mut results: Vec<(&str, Vec<Measured>)> =
        vec![("model-worker", Vec::new()), ("floor-worker", Vec::new())];
    for round in 0..ROUNDS {
        for (binary, runs) in results.iter_mut() {
            let table = TestTable::create(&format!("proc-{binary}")).await;
            runs.push(measure(binary, &table.name, &endpoint, &provider, round).await);
        }
    }
    let median = |v: Vec<f64>| {
        let mut v = v;
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let summary: Vec<(&str, f64, f64, f64)> = results
        .iter()
        .map(|(name, runs)| {
            (
                *name,
                median(
                    runs.iter()
                        .map(|m| m.startup.as_secs_f64() * 1000.0)
                        .collect(),
                ),
                median(
                    runs.iter()
                        .map(|m| m.cpu_per_delivery.as_secs_f64() * 1000.0)
                        .collect(),
                ),
                median(
                    runs.iter()
                        .map(|m| m.peak_rss_kib as f64 / 1024.0)
                        .collect(),
                ),
            )
        })
        .collect();
    println!(
        "## The worker process (median of {ROUNDS} rounds, {DELIVERIES} first deliveries each)\n"
    );
    println!(
        "| binary | start-up to first /next | CPU per delivery | peak RSS (batch of ten) |\n|---|---|---|---|"
    );
    for (name, startup, cpu, rss) in &summary {
        println!("| {name} | {startup:.1} ms | {cpu:.3} ms | {rss:.1} MiB |");
    }
    let (w, f) = (&summary[0], &summary[1]);
    println!(
        "| ratio | {:.2} x | {:.2} x | {:.2} x |",
        w.1 / f.1,
        w.2 / f.2,
        w.3 / f.3
    );
}

async fn measure(
    binary: &str,
    table: &str,
    endpoint: &str,
    provider: &ProviderStub,
    round: usize,
) -> Measured {
    let api = RuntimeApi::start().await.unwrap();
    let path = format!(
        "{}/../../target/release/{binary}",
        env!("CARGO_MANIFEST_DIR")
    );
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&path)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &api.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", binary)
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("IDEMPOTENCY_TABLE", table)
        .env("MODEL_BASE_URL", provider.base_url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {path} (build it with `cargo build --release --bins -p model-worker -p benchmarks`): {e}"));
    let pid = child.id().unwrap();
    while api.first_poll().await.is_none() {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let startup = api.first_poll().await.unwrap() - started;

    let mut n = 0;
    let mut deliver = |count: usize| {
        let bodies: Vec<_> = (0..count)
            .map(|_| {
                n += 1;
                typical_body(Some(&format!("{binary}-{round}-{n}")))
            })
            .collect();
        sqs_event(&bodies)
    };
    for _ in 0..20 {
        api.invoke(deliver(1));
        api.response().await;
    }
    let cpu_before = cpu_time(pid);
    for _ in 0..DELIVERIES {
        api.invoke(deliver(1));
        let (path, body) = api.response().await;
        assert!(
            path.ends_with("/response"),
            "{binary} failed: {path} {body}"
        );
    }
    let cpu = cpu_time(pid) - cpu_before;
    api.invoke(deliver(10));
    api.response().await;
    let peak_rss_kib = peak_rss_kib(pid);
    child.kill().await.unwrap();
    Measured {
        startup,
        cpu_per_delivery: cpu / DELIVERIES as u32,
        peak_rss_kib,
    }
}

/// User + system CPU time of a process, from /proc (clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Peak resident set size (VmHWM) of a process.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

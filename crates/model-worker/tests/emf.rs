//! The worker's metrics as a real run writes them: the binary under a mock Lambda Runtime
//! API in concurrent mode (`AWS_LAMBDA_MAX_CONCURRENCY=4`), a known mix of deliveries, and
//! the CloudWatch embedded metric format lines it writes on stdout, summed.

use provider_stub::ProviderStub;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;
use test_support::runtime_api::RuntimeApi;
use tokio::io::AsyncReadExt;

const SINGLE: &str = include_str!("../../../events/single-request.json");
const POISON: &str = include_str!("../../../events/poison-batch-of-ten.json");

/// The value of every EMF metric of `lines`, summed by (metric, outcome or kind label).
fn sums(lines: &[Value]) -> BTreeMap<(String, String), f64> {
    let mut sums = BTreeMap::new();
    for line in lines {
        for directive in line["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
            for metric in directive["Metrics"].as_array().unwrap() {
                let name = metric["Name"].as_str().unwrap();
                let label = line["outcome"]
                    .as_str()
                    .or(line["kind"].as_str())
                    .unwrap_or("")
                    .to_owned();
                let value = match &line[name] {
                    Value::Number(n) => n.as_f64().unwrap(),
                    // Histograms: their samples.
                    Value::Array(samples) => samples.len() as f64,
                    Value::Object(stats) => stats["SampleCount"].as_f64().unwrap_or(0.0),
                    other => panic!("{name}: {other}"),
                };
                *sums.entry((name.to_owned(), label)).or_insert(0.0) += value;
            }
        }
    }
    sums
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_invocations_write_every_count_once() {
    let provider = ProviderStub::start().await.unwrap();
    // Slow enough that concurrent deliveries of one message meet its claim.
    provider.set_delay(Duration::from_millis(300));
    let runtime = RuntimeApi::start().await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_model-worker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &runtime.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "model-worker")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_MAX_CONCURRENCY", "4")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .env("IDEMPOTENCY_STORE", "memory")
        .env("MODEL_BASE_URL", provider.base_url())
        .env("METRICS_NAMESPACE", "emf-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start model-worker");
    // 8 deliveries of one message at once, then 2 more after, and a batch of ten with one
    // poison record: 20 records in 11 invocations.
    let single: Value = serde_json::from_str(SINGLE).unwrap();
    for _ in 0..8 {
        runtime.invoke(single.clone());
    }
    let mut answers = Vec::new();
    for _ in 0..8 {
        answers.push(runtime.response().await);
    }
    for event in [
        single.clone(),
        single.clone(),
        serde_json::from_str(POISON).unwrap(),
    ] {
        runtime.invoke(event);
        answers.push(runtime.response().await);
    }
    child.start_kill().unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .await
        .unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l.get("_aws").is_some())
        .collect();
    assert!(!lines.is_empty(), "no EMF line in:\n{stdout}");
    for line in &lines {
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "emf-test"
        );
    }
    let sums = sums(&lines);
    let outcome = |o: &str| {
        sums.get(&("idempotency_outcomes_total".to_owned(), o.to_owned()))
            .copied()
            .unwrap_or(0.0)
    };
    // Every record counted once, whichever invocation's line carried it.
    let total: f64 = sums
        .iter()
        .filter(|((name, _), _)| name == "idempotency_outcomes_total")
        .map(|(_, v)| v)
        .sum();
    let handed_back: usize = answers[..8]
        .iter()
        .map(|(_, body)| body["batchItemFailures"].as_array().map_or(0, Vec::len))
        .sum();
    // The poison record never reaches the library (its body does not parse): 19 calls.
    assert_eq!(total, 19.0, "{sums:?}");
    assert_eq!(outcome("executed"), provider.completion_calls() as f64);
    assert_eq!(
        outcome("executed"),
        10.0,
        "the first message once, the batch's nine valid"
    );
    assert_eq!(outcome("in_progress"), handed_back as f64, "{sums:?}");
    assert_eq!(
        outcome("replayed") + outcome("in_progress"),
        9.0,
        "{sums:?}"
    );
    let kind = |k: &str| {
        sums.get(&("idempotency_batch_failures_total".to_owned(), k.to_owned()))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(kind("malformed_body"), 1.0, "{sums:?}");
    assert_eq!(kind("in_progress"), handed_back as f64);
    // No line for a label set with nothing new: at most one line per label set per flush.
    assert!(lines.len() <= 11 * 12, "{} lines", lines.len());
    assert!(
        handed_back >= 1,
        "no delivery met another's claim: the run was not concurrent"
    );
    // Store requests: a claim per call, a completion per execution.
    assert_eq!(
        sums[&("idempotency_store_requests_total".to_owned(), String::new())],
        19.0 + 10.0
    );
}

/// What one flush holds after many calls (a large batch, or several concurrent invocations
/// between two flushes): every count exactly, and at most 100 latency samples per label
/// set (metrics_cloudwatch_embedded keeps no more between flushes), as `model_worker::emf`
/// says.
#[tokio::test]
async fn a_flush_counts_everything_and_samples_latency_at_100_per_label_set() {
    use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
    let collector = model_worker::emf::install("emf-unit").unwrap();
    let idempotency = Idempotency::builder(MemoryStore::new())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("id"));
    for i in 0..150 {
        idempotency
            .execute(&op, &serde_json::json!({"id": i.to_string()}), || async {
                Ok::<_, String>(1u8)
            })
            .await
            .unwrap();
    }
    let mut out = Vec::new();
    model_worker::emf::flush(collector, &mut out);
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sums = sums(&lines);
    let requests = sums[&("idempotency_store_requests_total".to_owned(), String::new())];
    let samples = sums[&(
        "idempotency_store_request_seconds".to_owned(),
        String::new(),
    )];
    assert_eq!(requests, 300.0, "every store request counted: {sums:?}");
    assert_eq!(
        samples, 200.0,
        "100 latency samples for each of the two operations: {sums:?}"
    );
}

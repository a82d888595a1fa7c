//! Lambda's tenant isolation mode through a real run: the worker binary under the mock
//! Lambda Runtime API, which sends the tenant id header. One SQS message twice under a
//! tenant calls the provider once; under another tenant, once more.

use provider_stub::ProviderStub;
use serde_json::Value;
use std::process::Stdio;
use test_support::runtime_api::RuntimeApi;

const SINGLE: &str = include_str!("../../../events/single-request.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_runs_once_per_tenant() {
    let provider = ProviderStub::start().await.unwrap();
    let runtime = RuntimeApi::start().await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_model-worker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &runtime.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "model-worker")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("IDEMPOTENCY_STORE", "memory")
        .env("MODEL_BASE_URL", provider.base_url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start model-worker");
    let single: Value = serde_json::from_str(SINGLE).unwrap();
    let mut calls = Vec::new();
    for tenant in ["tenant-a", "tenant-a", "tenant-b", "tenant-b"] {
        runtime.invoke_as_tenant(single.clone(), tenant);
        let (path, body) = runtime.response().await;
        assert!(path.ends_with("/response"), "{path}: {body}");
        assert_eq!(body["batchItemFailures"], serde_json::json!([]), "{body}");
        calls.push(provider.completion_calls());
    }
    assert_eq!(calls, [1, 1, 2, 2], "one provider call per tenant");
    child.start_kill().unwrap();
}

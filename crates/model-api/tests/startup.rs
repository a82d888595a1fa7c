//! Start-up against a DynamoDB table that cannot work, through the real binary under the
//! mock Lambda Runtime API and the DynamoDB test server (`DYNAMODB_TEST_ENDPOINT`;
//! `scripts/test` starts it): the process stops with status 2 and a message naming the
//! table, and the request it may already have received is not answered. The table's read
//! is held for a second, so the request arrives before it ends.

use provider_stub::ProviderStub;
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use test_support::TestTable;
use test_support::runtime_api::RuntimeApi;

const REQUEST: &str = include_str!("../../../events/function-url-request.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_stops_the_api_with_status_2_before_any_request_is_answered() {
    let endpoint = test_support::endpoint().await;
    let table = TestTable::create("api-startup-missing").await;
    table.inject_hang("GetItem", 1.0, 1).await;
    table
        .client
        .delete_table()
        .table_name(&table.name)
        .send()
        .await
        .unwrap();
    let provider = ProviderStub::start().await.unwrap();
    let runtime = RuntimeApi::start().await.unwrap();
    runtime.invoke(serde_json::from_str::<Value>(REQUEST).unwrap());
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_model-api"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", &runtime.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "model-api")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("IDEMPOTENCY_TABLE", &table.name)
        .env("MODEL_BASE_URL", provider.base_url())
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start model-api");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("model-api exits at start-up")
        .unwrap();
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{output}");
    assert!(
        output.contains("model-api: cannot start") && output.contains(&format!("{:?}", table.name)),
        "{output}"
    );
    assert!(
        runtime.first_poll().await.is_some(),
        "init ended before the table's read: {output}"
    );
    if let Ok((path, body)) =
        tokio::time::timeout(Duration::from_millis(300), runtime.response()).await
    {
        assert!(
            !path.ends_with("/response"),
            "the API answered the request instead of stopping: {path} {body}\n{output}"
        );
    }
    assert_eq!(provider.completion_calls(), 0, "{output}");
    assert_eq!(table.counts().await.get("PutItem"), None);
}

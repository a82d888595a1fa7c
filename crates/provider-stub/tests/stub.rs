//! The stand-in over HTTP, as the worker reaches it.

use provider_stub::ProviderStub;
use serde_json::{Value, json};
use test_support::http::request;

async fn chat(stub: &ProviderStub, content: &str) -> (u16, Value) {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    let url = format!("{}/v1/chat/completions", stub.base_url());
    let (status, body) = request("POST", &url, Some(&body.to_string()))
        .await
        .unwrap();
    (status, serde_json::from_str(&body).unwrap())
}

#[tokio::test]
async fn answers_a_completion_and_logs_the_request() {
    let stub = ProviderStub::start().await.unwrap();
    let (status, answer) = chat(&stub, "hello").await;
    assert_eq!(status, 200);
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "stub completion #1 for: hello"
    );
    assert_eq!(answer["model"], "m");
    stub.wait_for_requests(1).await;
    let log = stub.requests();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].method, "POST");
    assert_eq!(log[0].path, "/v1/chat/completions");
    assert_eq!(log[0].body["messages"][0]["content"], "hello");
    assert_eq!(stub.completion_calls(), 1);
}

#[tokio::test]
async fn fails_the_next_requests_when_told() {
    let stub = ProviderStub::start().await.unwrap();
    stub.fail_next(1);
    assert_eq!(chat(&stub, "a").await.0, 500);
    assert_eq!(chat(&stub, "b").await.0, 200);
    assert_eq!(stub.completion_calls(), 2, "failed calls are logged too");
}

#[tokio::test]
async fn logs_but_does_not_count_other_routes() {
    let stub = ProviderStub::start().await.unwrap();
    let url = format!("{}/v1/models?x=1", stub.base_url());
    let (status, _) = request("GET", &url, None).await.unwrap();
    assert_eq!(status, 404);
    assert_eq!(stub.requests()[0].path, "/v1/models?x=1");
    assert_eq!(stub.completion_calls(), 0);
}

#[tokio::test]
async fn appends_each_request_to_the_log_file() {
    let file = std::env::temp_dir().join(format!("provider-stub-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let stub = ProviderStub::start_on("127.0.0.1:0", Some(file.clone()))
        .await
        .unwrap();
    chat(&stub, "one").await;
    chat(&stub, "two").await;
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["n"], 2);
    assert_eq!(lines[1]["body"]["messages"][0]["content"], "two");
}

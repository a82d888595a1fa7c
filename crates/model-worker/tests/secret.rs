//! The API key read from Secrets Manager at start-up, against a real local Secrets Manager:
//! moto's server mode, the same process as the DynamoDB test server `scripts/test` starts
//! (`DYNAMODB_TEST_ENDPOINT`; moto serves every service it knows on one port).

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_secretsmanager::config::Credentials;
use lambda_idempotency::store::epoch_millis;
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{Worker, WorkerConfig};
use provider_stub::ProviderStub;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

const SINGLE: &str = include_str!("../../../events/single-request.json");

async fn sdk(endpoint: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .load()
        .await
}

/// Creates a secret of this test's own and returns its ARN.
async fn create_secret(sdk: &SdkConfig, test: &str, value: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "model-worker/{test}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    aws_sdk_secretsmanager::Client::new(sdk)
        .create_secret()
        .name(name)
        .secret_string(value)
        .send()
        .await
        .expect("create the secret")
        .arn
        .expect("an ARN")
}

fn config(arn: &str, base_url: &str) -> WorkerConfig {
    let vars = [
        ("IDEMPOTENCY_STORE", "memory".to_owned()),
        ("MODEL_BASE_URL", base_url.to_owned()),
        ("MODEL_API_KEY_SECRET_ARN", arn.to_owned()),
    ];
    WorkerConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("a valid configuration")
}

#[tokio::test]
async fn the_worker_sends_the_key_it_read_from_the_secret() {
    let endpoint = test_support::endpoint().await;
    let sdk = sdk(&endpoint).await;
    let arn = create_secret(&sdk, "plain", "sk-from-the-secret\n").await;
    let provider = ProviderStub::start().await.unwrap();
    let config = config(&arn, &provider.base_url())
        .read_secrets_with(&sdk)
        .await
        .expect("the secret is read");
    assert_eq!(config.model_api_key.as_deref(), Some("sk-from-the-secret"));

    let worker = Worker::from_config(&config).await.unwrap();
    let event: SqsEvent = serde_json::from_str(SINGLE).unwrap();
    let mut context = Context::default();
    context.deadline = epoch_millis(SystemTime::now() + Duration::from_secs(30));
    let response = worker
        .handle(LambdaEvent::new(event, context))
        .await
        .unwrap();
    assert!(response.batch_item_failures.is_empty());
    let requests = provider.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].authorization.as_deref(),
        Some("Bearer sk-from-the-secret")
    );
}

#[tokio::test]
async fn a_json_secret_gives_its_api_key_field() {
    let endpoint = test_support::endpoint().await;
    let sdk = sdk(&endpoint).await;
    let arn = create_secret(&sdk, "json", r#"{"api_key": "sk-json", "owner": "ml"}"#).await;
    let config = config(&arn, "http://127.0.0.1:9")
        .read_secrets_with(&sdk)
        .await
        .unwrap();
    assert_eq!(config.model_api_key.as_deref(), Some("sk-json"));
}

/// Runs the real binary with `arn` as its secret until it exits (it has no Lambda runtime
/// API to serve), and returns its exit code and standard error.
async fn start_binary(endpoint: &str, arn: &str) -> (Option<i32>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_model-worker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("IDEMPOTENCY_STORE", "memory")
        .env("MODEL_BASE_URL", "http://127.0.0.1:9")
        .env("MODEL_API_KEY_SECRET_ARN", arn)
        .env("AWS_ENDPOINT_URL_SECRETS_MANAGER", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        // The worker logs through tracing, to stdout as Lambda's default subscriber does.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start model-worker");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("model-worker exits at start-up")
        .unwrap();
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), output)
}

#[tokio::test]
async fn start_up_fails_with_a_clear_message_when_the_secret_cannot_be_read() {
    let endpoint = test_support::endpoint().await;
    let sdk = sdk(&endpoint).await;

    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:model-worker/absent-AbC123";
    let (code, stderr) = start_binary(&endpoint, missing).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid configuration")
            && stderr.contains(missing)
            && stderr.contains("cannot be read from Secrets Manager")
            && stderr.contains("ResourceNotFoundException"),
        "{stderr}"
    );

    let no_field = create_secret(&sdk, "no-field", r#"{"token": "sk-hidden"}"#).await;
    let (code, stderr) = start_binary(&endpoint, &no_field).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("\"api_key\" field"), "{stderr}");
    assert!(
        !stderr.contains("sk-hidden"),
        "the value is never shown: {stderr}"
    );

    // A readable secret passes start-up; the process then stops for want of a Lambda
    // runtime API, which is not a configuration error.
    let good = create_secret(&sdk, "good", "sk-good").await;
    let (code, stderr) = start_binary(&endpoint, &good).await;
    assert_ne!(code, Some(2), "{stderr}");
    assert!(!stderr.contains("invalid configuration"), "{stderr}");
}

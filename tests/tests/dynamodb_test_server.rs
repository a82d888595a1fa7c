//! The DynamoDB test server itself (`tests/servers/dynamodb_server.py`), through raw SDK
//! requests with retries off: a write whose answer is lost (`applied_internal`) and a slow
//! answer (`hang`) that holds only its own request. A binary of its own: the subject is
//! the test machinery, and its timing checks want the server free of other tests' load.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;
use std::time::{Duration, Instant};
use test_support::TestTable;

/// Like [`test_support::client`], but each attempt gives up after `attempt_timeout`.
fn client_with_attempt_timeout(endpoint: &str, attempt_timeout: Duration) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "e2e-tests"))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        )
        .build();
    Client::from_conf(config)
}

async fn put(client: &Client, table: &TestTable, id: &str) -> Result<(), String> {
    client
        .put_item()
        .table_name(&table.name)
        .item("id", AttributeValue::S(id.to_owned()))
        .item("payload", AttributeValue::S(format!("written as {id}")))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn applied_internal_writes_the_item_but_answers_500() {
    let table = TestTable::create("applied-internal").await;
    table.inject("PutItem", "applied_internal", 1).await;

    let err = table
        .client
        .put_item()
        .table_name(&table.name)
        .item("id", AttributeValue::S("lost-answer".into()))
        .send()
        .await
        .expect_err("the answer is replaced by a 500");
    let status = err.raw_response().map(|r| r.status().as_u16());
    assert_eq!(status, Some(500), "{err:?}");
    assert!(
        err.as_service_error()
            .is_some_and(|e| e.is_internal_server_error()),
        "{err:?}"
    );

    let item = table.get_raw("lost-answer").await;
    assert_eq!(
        item.and_then(|i| i.get("id").cloned()),
        Some(AttributeValue::S("lost-answer".into())),
        "the write was applied although its answer was a 500"
    );

    // The fault was used up: the next PutItem answers normally. get_raw is not counted.
    put(&table.client, &table, "next").await.unwrap();
    let counts = table.counts().await;
    assert_eq!(counts.get("PutItem"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("GetItem"), None, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_outlasts_the_attempt_timeout_and_the_write_lands_late() {
    let hung = TestTable::create("hang").await;
    let other = TestTable::create("hang-other").await;
    let endpoint = test_support::endpoint().await;
    let impatient = client_with_attempt_timeout(&endpoint, Duration::from_millis(300));
    hung.inject_hang("PutItem", 2.0, 1).await;

    let start = Instant::now();
    let err = impatient
        .put_item()
        .table_name(&hung.name)
        .item("id", AttributeValue::S("late".into()))
        .send()
        .await
        .expect_err("the attempt times out before the hung answer");
    let gave_up = start.elapsed();
    assert!(matches!(err, SdkError::TimeoutError(_)), "{err:?}");
    assert!(
        gave_up < Duration::from_secs(1),
        "gave up after {gave_up:?}"
    );

    // While the PutItem hangs, another table, the control API and even a read of the same
    // table answer at once: the hang holds only its own request.
    let t = Instant::now();
    put(&impatient, &other, "meanwhile").await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let t = Instant::now();
    let counts = hung.counts().await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(
        counts.get("PutItem"),
        Some(&1),
        "counted on arrival: {counts:?}"
    );
    let t = Instant::now();
    assert_eq!(hung.get_raw("late").await, None, "not applied yet");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "the checks above must run during the hang; took {:?}",
        start.elapsed()
    );

    // The hung write lands about 2 s after it was sent.
    let landed = loop {
        if hung.get_raw("late").await.is_some() {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the hung write never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(4)).contains(&landed),
        "landed after {landed:?}"
    );
}

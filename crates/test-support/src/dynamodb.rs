//! The local DynamoDB test server and its control API.
//!
//! The server is `tests/servers/dynamodb_server.py` (moto behind a wrapper that serializes
//! requests, counts them and injects faults), started by `scripts/test`. Tests find it at
//! `DYNAMODB_TEST_ENDPOINT`; when it is absent they fail and say how to start it.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::net::TcpStream;

/// The environment variable naming the test server, e.g. `http://127.0.0.1:8000`.
pub const ENDPOINT_ENV: &str = "DYNAMODB_TEST_ENDPOINT";

const HOW_TO_START: &str = "run the whole suite with `scripts/test`, which installs and starts it, \
or start it yourself with `.venv/bin/python tests/servers/dynamodb_server.py --port 8000` \
and set DYNAMODB_TEST_ENDPOINT=http://127.0.0.1:8000";

/// The test server's address. Panics, saying what to start, when it is not reachable.
pub async fn endpoint() -> String {
    let endpoint = std::env::var(ENDPOINT_ENV).unwrap_or_else(|_| {
        panic!("{ENDPOINT_ENV} is not set: these tests need the local DynamoDB test server; {HOW_TO_START}")
    });
    let addr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    if let Err(e) = TcpStream::connect(&addr).await {
        panic!("the DynamoDB test server at {endpoint} is not reachable ({e}); {HOW_TO_START}");
    }
    endpoint
}

/// A DynamoDB client for the test server, with SDK retries off so request counts and
/// fault tests see every request.
pub fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "test-support"))
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(config)
}

/// A fresh idempotency table of a test's own on the test server.
#[derive(Debug, Clone)]
pub struct TestTable {
    /// The client used to create it.
    pub client: Client,
    /// The table's name, unique to this test.
    pub name: String,
    endpoint: String,
}

impl TestTable {
    /// Creates a table named after `test` (plus a counter and the process id).
    pub async fn create(test: &str) -> TestTable {
        static N: AtomicU32 = AtomicU32::new(0);
        let endpoint = endpoint().await;
        let client = client(&endpoint);
        let name = format!(
            "{test}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        client
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("id")
                    .key_type(KeyType::Hash)
                    .build()
                    .unwrap(),
            )
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("id")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("create table {name}: {e:?}"));
        let table = TestTable {
            client,
            name,
            endpoint,
        };
        table.reset().await;
        table
    }

    /// The requests this table received, by operation (`PutItem`, `UpdateItem`, ...).
    pub async fn counts(&self) -> HashMap<String, u64> {
        let body = self
            .control("GET", &format!("/_test/counts?table={}", self.name), None)
            .await;
        serde_json::from_value(body).expect("counts are a map")
    }

    /// Requests to the item operations (Put, Update, Delete, Get) since the last reset.
    pub async fn item_requests(&self) -> u64 {
        let counts = self.counts().await;
        ["PutItem", "UpdateItem", "DeleteItem", "GetItem"]
            .iter()
            .map(|op| counts.get(*op).copied().unwrap_or(0))
            .sum()
    }

    /// Clears this table's counters and pending faults.
    pub async fn reset(&self) {
        self.control("POST", &format!("/_test/reset?table={}", self.name), None)
            .await;
    }

    /// Makes the next `count` requests of `operation` on this table go wrong. `kind` is
    /// - `"throttle"`: a 400 ThrottlingException; the request is not applied;
    /// - `"internal"`: a 500 InternalServerError; the request is not applied;
    /// - `"applied_internal"`: the request is applied (a write happens), then its answer
    ///   is thrown away and a 500 InternalServerError returned: a write whose answer was
    ///   lost;
    /// - `"hang"`: the request is held for 5 s, then applied and answered normally (see
    ///   [`TestTable::inject_hang`] to choose the time).
    ///
    /// Faults queue per (table, operation) in the order injected; a request takes the
    /// first one pending.
    pub async fn inject(&self, operation: &str, kind: &str, count: u32) {
        let spec =
            json!({"table": self.name, "operation": operation, "kind": kind, "count": count});
        self.control("POST", "/_test/faults", Some(spec)).await;
    }

    /// Makes the next `count` requests of `operation` on this table hang for `seconds`
    /// (at most 60) before the server applies and answers them. The server waits outside
    /// its global lock, so other requests, tables and the control API go on meanwhile. A
    /// client whose attempt timeout is shorter gives up first, and the write lands late.
    pub async fn inject_hang(&self, operation: &str, seconds: f64, count: u32) {
        let spec = json!({
            "table": self.name, "operation": operation, "kind": "hang",
            "seconds": seconds, "count": count,
        });
        self.control("POST", "/_test/faults", Some(spec)).await;
    }

    /// The item whose `id` is `id`, as stored, read with a consistent GetItem through
    /// [`TestTable::client`]; `None` when there is none. The request carries the header
    /// `x-test-uncounted: 1`, so the server neither counts it in [`TestTable::counts`]
    /// nor hands it a queued fault: looking does not disturb what a test measures.
    pub async fn get_raw(&self, id: &str) -> Option<HashMap<String, AttributeValue>> {
        self.client
            .get_item()
            .table_name(&self.name)
            .key("id", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .customize()
            .mutate_request(|request| {
                request.headers_mut().insert("x-test-uncounted", "1");
            })
            .send()
            .await
            .unwrap_or_else(|e| panic!("get {id} from {}: {e:?}", self.name))
            .item
    }

    /// Makes conditional-check failures on this table come back without the old item, as
    /// some DynamoDB-compatible servers answer `ReturnValuesOnConditionCheckFailure`.
    pub async fn strip_old_item_on_conflict(&self) {
        self.control(
            "POST",
            &format!("/_test/strip-old-item?table={}", self.name),
            None,
        )
        .await;
    }

    async fn control(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.endpoint);
        let body = body.map(|b| b.to_string());
        let (status, body) = crate::http::request(method, &url, body.as_deref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 200, "{method} {url}: {body}");
        serde_json::from_str(&body).expect("control answers are JSON")
    }
}

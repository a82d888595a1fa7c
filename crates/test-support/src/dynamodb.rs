//! The local DynamoDB test servers and the test server's control API.
//!
//! Two emulators ([`Emulator`]), both started by `scripts/test`:
//! - the test server, `tests/servers/dynamodb_server.py` (moto behind a wrapper that
//!   serializes requests, counts them and injects faults), at `DYNAMODB_TEST_ENDPOINT`;
//! - dynalite (from npm; `start_dynalite` in `scripts/lib/env.sh`), which validates
//!   requests more strictly, at `DYNALITE_TEST_ENDPOINT`.
//!
//! When one is absent, the tests that need it fail and say how to start it.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, TableStatus,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;

/// The environment variable naming the test server, e.g. `http://127.0.0.1:8000`.
pub const ENDPOINT_ENV: &str = "DYNAMODB_TEST_ENDPOINT";

/// The environment variable naming the dynalite server, e.g. `http://127.0.0.1:4567`.
pub const DYNALITE_ENDPOINT_ENV: &str = "DYNALITE_TEST_ENDPOINT";

const HOW_TO_START: &str = "run the whole suite with `scripts/test`, which installs and starts it, \
or start it yourself with `.venv/bin/python tests/servers/dynamodb_server.py --port 8000` \
and set DYNAMODB_TEST_ENDPOINT=http://127.0.0.1:8000";

const HOW_TO_START_DYNALITE: &str = "run the whole suite with `scripts/test`, which installs and starts it, \
or start it yourself with `npm install --prefix target/dynalite dynalite@4.0.0` and \
`target/dynalite/node_modules/.bin/dynalite --host 127.0.0.1 --port 4567 --createTableMs 0` \
and set DYNALITE_TEST_ENDPOINT=http://127.0.0.1:4567";

/// A DynamoDB emulator the tests run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulator {
    /// The test server (moto behind our wrapper): request counts and injected faults.
    Moto,
    /// dynalite: stricter validation of requests and expressions; no control API.
    Dynalite,
}

impl Emulator {
    fn env(self) -> (&'static str, &'static str) {
        match self {
            Emulator::Moto => (ENDPOINT_ENV, HOW_TO_START),
            Emulator::Dynalite => (DYNALITE_ENDPOINT_ENV, HOW_TO_START_DYNALITE),
        }
    }

    /// The emulator's address. Panics, saying what to start, when it is not reachable.
    pub async fn endpoint(self) -> String {
        let (env, how) = self.env();
        let endpoint = std::env::var(env).unwrap_or_else(|_| {
            panic!("{env} is not set: these tests need the {self:?} DynamoDB emulator; {how}")
        });
        let addr = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        if let Err(e) = TcpStream::connect(&addr).await {
            panic!("the {self:?} DynamoDB emulator at {endpoint} is not reachable ({e}); {how}");
        }
        endpoint
    }
}

/// The test server's address. Panics, saying what to start, when it is not reachable.
pub async fn endpoint() -> String {
    Emulator::Moto.endpoint().await
}

/// A DynamoDB client for the test server, with SDK retries off so request counts and
/// fault tests see every request.
pub fn client(endpoint: &str) -> Client {
    client_refusing(endpoint, Refusals::default())
}

/// [`client`], whose requests `refusals` may stop before they leave.
fn client_refusing(endpoint: &str, refusals: Refusals) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "test-support"))
        .retry_config(RetryConfig::disabled())
        .interceptor(refusals)
        .build();
    Client::from_conf(config)
}

/// Requests to fail before they are sent, per operation: the client's side of a
/// connection that failed (the SDK's dispatch failure, which the store calls retryable).
/// Nothing reaches the server, so nothing is applied; this works on every emulator.
#[derive(Debug, Clone, Default)]
struct Refusals(Arc<Mutex<HashMap<String, u32>>>);

impl Intercept for Refusals {
    fn name(&self) -> &'static str {
        "test-support refusals"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context.request().headers().get("x-amz-target");
        let operation = target
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or_default();
        let mut pending = self.0.lock().unwrap();
        match pending.get_mut(operation) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(format!("{operation} refused before it was sent (injected by the test)").into())
            }
            _ => Ok(()),
        }
    }
}

/// A fresh idempotency table of a test's own on an emulator.
#[derive(Debug, Clone)]
pub struct TestTable {
    /// The client used to create it (requests [`TestTable::refuse`] stops included).
    pub client: Client,
    /// The table's name, unique to this test.
    pub name: String,
    /// The emulator it lives on.
    pub emulator: Emulator,
    /// The partition key's name.
    pub partition_key: String,
    /// The sort key's name, if the table has one.
    pub sort_key: Option<String>,
    endpoint: String,
    refusals: Refusals,
}

impl TestTable {
    /// Creates a table named after `test` (plus a counter and the process id) on the test
    /// server, with the store's default key: partition key `id`, no sort key.
    pub async fn create(test: &str) -> TestTable {
        Self::create_keyed(Emulator::Moto, test, "id", None).await
    }

    /// Creates a table named after `test` on `emulator`, with the partition key
    /// `partition_key` and the sort key `sort_key` if given (both strings), and waits
    /// until it is active.
    pub async fn create_keyed(
        emulator: Emulator,
        test: &str,
        partition_key: &str,
        sort_key: Option<&str>,
    ) -> TestTable {
        static N: AtomicU32 = AtomicU32::new(0);
        let endpoint = emulator.endpoint().await;
        let refusals = Refusals::default();
        let client = client_refusing(&endpoint, refusals.clone());
        let name = format!(
            "{test}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let keys = std::iter::once((partition_key, KeyType::Hash))
            .chain(sort_key.map(|sort_key| (sort_key, KeyType::Range)));
        let mut create = client
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest);
        for (attribute, key_type) in keys {
            create = create
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(attribute)
                        .key_type(key_type)
                        .build()
                        .unwrap(),
                )
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(attribute)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .unwrap(),
                );
        }
        create
            .send()
            .await
            .unwrap_or_else(|e| panic!("create table {name} on {emulator:?}: {e:?}"));
        let table = TestTable {
            client,
            name,
            emulator,
            partition_key: partition_key.to_owned(),
            sort_key: sort_key.map(str::to_owned),
            endpoint,
            refusals,
        };
        table.wait_until_active().await;
        if emulator == Emulator::Moto {
            table.reset().await;
        }
        table
    }

    /// Waits until the table is `ACTIVE` (dynalite's tables are `CREATING` for a while).
    async fn wait_until_active(&self) {
        for _ in 0..200 {
            let out = self
                .client
                .describe_table()
                .table_name(&self.name)
                .send()
                .await
                .unwrap_or_else(|e| panic!("describe table {}: {e:?}", self.name));
            if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "table {} on {:?} did not become active within 10 s",
            self.name, self.emulator
        );
    }

    /// The emulator's URL, for a process that reaches the table itself.
    pub fn endpoint_url(&self) -> &str {
        &self.endpoint
    }

    /// Makes the next `count` requests of `operation` (`PutItem`, ...) through
    /// [`TestTable::client`] fail before they are sent, as a connection that failed does:
    /// a retryable error, nothing applied. On every emulator.
    pub fn refuse(&self, operation: &str, count: u32) {
        *self
            .refusals
            .0
            .lock()
            .unwrap()
            .entry(operation.to_owned())
            .or_default() += count;
    }

    /// The requests this table received, by operation (`PutItem`, `UpdateItem`, ...).
    pub async fn counts(&self) -> HashMap<String, u64> {
        let body = self
            .control("GET", &format!("/_test/counts?table={}", self.name), None)
            .await;
        serde_json::from_value(body).expect("counts are a map")
    }

    /// Requests to the item operations (Put, Update, Delete, Get, and TransactWriteItems,
    /// counted on each table it names) since the last reset.
    pub async fn item_requests(&self) -> u64 {
        let counts = self.counts().await;
        [
            "PutItem",
            "UpdateItem",
            "DeleteItem",
            "GetItem",
            "TransactWriteItems",
        ]
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
        assert!(
            self.sort_key.is_none(),
            "table {} has a sort key: use get_raw_key",
            self.name
        );
        self.get_raw_key(&[(&self.partition_key, id)]).await
    }

    /// The item at the primary key `key` (attribute name and string value, each key
    /// attribute), read as [`TestTable::get_raw`] reads.
    pub async fn get_raw_key(
        &self,
        key: &[(&str, &str)],
    ) -> Option<HashMap<String, AttributeValue>> {
        let id = format!("{key:?}");
        let key = key
            .iter()
            .map(|(name, value)| (name.to_string(), AttributeValue::S(value.to_string())))
            .collect();
        self.client
            .get_item()
            .table_name(&self.name)
            .set_key(Some(key))
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
        assert_eq!(
            self.emulator,
            Emulator::Moto,
            "request counts and server faults are the test server's: table {} is on {:?} (use TestTable::refuse there)",
            self.name,
            self.emulator
        );
        let url = format!("{}{path}", self.endpoint);
        let body = body.map(|b| b.to_string());
        let (status, body) = crate::http::request(method, &url, body.as_deref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 200, "{method} {url}: {body}");
        serde_json::from_str(&body).expect("control answers are JSON")
    }
}

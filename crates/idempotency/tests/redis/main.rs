//! The Redis store on one node: the whole contract, the stored layout, round trips at the
//! server, and ids; its connections, server states and the cluster in their modules.
//!
//! The servers are `REDIS_TEST_URL` (default the local 127.0.0.1:6379) and
//! `REDIS_CLUSTER_TEST_URLS` (a three-node cluster `scripts/test` starts), or a private
//! `redis-server` of the test's own. Every test writes under its own key prefix.
#![cfg(feature = "redis")]

mod bounds;
mod cluster;
mod connection;
mod listing;
mod server;

use lambda_idempotency::store::conformance;
use lambda_idempotency::store::redis::{KEY_GRACE, RedisStore};
use lambda_idempotency::store::{Claim, ClaimOutcome, IdempotencyStore, Status, epoch_secs};
use lambda_idempotency::{Error, Idempotency, KeyStrategy, Operation, Outcome};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use test_support::redis_server::PrivateRedis;
use test_support::servers::{HOW, redis_prefix, redis_url};

/// A store on the shared node, under a prefix of `test`'s own.
async fn node(test: &str) -> RedisStore {
    let url = redis_url();
    RedisStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}; {HOW}"))
        .namespace(redis_prefix(test))
}

/// Deletes the keys under the store's prefix (one node only: a test cluster is thrown
/// away with its servers).
async fn clean(store: &RedisStore) {
    let mut cursor = 0u64;
    loop {
        let reply = store
            .query(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", store.namespace_of_keys()))
                    .arg("COUNT")
                    .arg(1000),
            )
            .await
            .unwrap();
        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply).unwrap();
        if !keys.is_empty() {
            store.query(redis::cmd("DEL").arg(keys)).await.unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// The whole contract on one node. The contract's store failures are the store's
/// connection killed from an admin connection (`CLIENT KILL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_node_keeps_the_whole_contract() {
    let store = node("conformance").await;
    let admin = node("admin").await;
    let killed = store.clone();
    conformance::run_whole_contract(
        store.clone(),
        async |_op| kill(&admin, client_id(&killed).await).await,
        12,
        None,
    )
    .await;
    clean(&store).await;
}

/// The client id of the store's connection (on the node that holds `key`).
async fn client_id(store: &RedisStore) -> i64 {
    redis::from_redis_value(
        store
            .query(&redis::cmd("CLIENT").arg("ID").clone())
            .await
            .unwrap(),
    )
    .unwrap()
}

async fn kill(admin: &RedisStore, id: i64) {
    let killed: i64 = redis::from_redis_value(
        admin
            .query(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(killed, 1, "CLIENT KILL found the store's connection");
}

fn claim(id: &str, token: &str) -> Claim {
    let now = SystemTime::now();
    let mut claim = conformance::claim_at(id, now, Duration::from_secs(30), token);
    claim.expiration = now + Duration::from_secs(3_600);
    claim
}

/// The store's own error inside [`Error::Store`], and the chain under it.
fn store_source(err: &Error) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match err {
        Error::Store { source, .. } => &**source,
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// The stored layout: one hash with Powertools' fields, numbers in their units, the
/// result byte for byte, and the key's own expiry past the record's and the lease's.
#[tokio::test]
async fn a_record_is_one_hash_that_redis_expires() {
    let store = node("layout").await;
    let c = claim("conformance.layout#k", "tok");
    store.claim(&c).await.unwrap();
    let key = store.key(&c.id);
    let pexpiretime = |store: RedisStore, key: String| async move {
        let v = store
            .query(redis::cmd("PEXPIRETIME").arg(key))
            .await
            .unwrap();
        redis::from_redis_value::<u64>(v).unwrap()
    };
    let lease_ms = lambda_idempotency::store::epoch_millis(c.lease_until);
    let exp_ms = (epoch_secs(c.expiration) + 1) * 1000;
    assert_eq!(
        pexpiretime(store.clone(), key.clone()).await,
        exp_ms.max(lease_ms + 1) + KEY_GRACE.as_millis() as u64
    );
    let data = r#"{"b":1,  "a":[2.50, "é"]}"#;
    let done = SystemTime::now() + Duration::from_secs(7_200);
    store.complete(&c, Some(data), done).await.unwrap();
    let raw: std::collections::HashMap<String, String> =
        redis::from_redis_value(store.query(redis::cmd("HGETALL").arg(&key)).await.unwrap())
            .unwrap();
    assert_eq!(raw["status"], "COMPLETED");
    assert_eq!(raw["expiration"], epoch_secs(done).to_string());
    assert_eq!(raw["in_progress_expiration"], lease_ms.to_string());
    assert_eq!(raw["data"], data, "the result is stored as given");
    assert_eq!(raw["validation"], "v1");
    assert_eq!(raw["lease_token"], "tok");
    assert_eq!(raw.len(), 6, "no other fields: {raw:?}");
    assert_eq!(
        pexpiretime(store.clone(), key.clone()).await,
        (epoch_secs(done) + 1) * 1000 + KEY_GRACE.as_millis() as u64
    );
    // A completion without data removes the field.
    store.complete(&c, None, done).await.unwrap();
    let record = store.get(&c.id).await.unwrap().unwrap();
    assert_eq!((record.status, record.data), (Status::Completed, None));
    clean(&store).await;
}

/// What the server saw, from `MONITOR`: the commands under one key prefix, not counting
/// those a script ran.
struct Monitor {
    lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Monitor {
    async fn start(url: &str) -> Self {
        use futures_util::StreamExt;
        let client = redis::Client::open(url).unwrap();
        let monitor = client.get_async_monitor().await.unwrap();
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut stream = monitor.into_on_message::<String>();
            while let Some(line) = stream.next().await {
                sink.lock().unwrap().push(line);
            }
        });
        Self { lines }
    }

    /// The requests `store` sent since the last call: an `ECHO` marks the end (the
    /// store's connection keeps order), then the lines before it under its prefix.
    async fn requests(&self, store: &RedisStore) -> Vec<String> {
        let marker = format!("marker-{:016x}", fastrand::u64(..));
        store.query(redis::cmd("ECHO").arg(&marker)).await.unwrap();
        for _ in 0..500 {
            let seen: Option<Vec<String>> = {
                let mut lines = self.lines.lock().unwrap();
                let at = lines.iter().position(|l| l.contains(&marker));
                at.map(|at| lines.drain(..=at).collect())
            };
            if let Some(seen) = seen {
                return seen
                    .into_iter()
                    .filter(|l| l.contains(store.namespace_of_keys()) && !l.contains(" lua]"))
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("MONITOR never showed {marker}");
    }
}

/// Round trips per message, counted by the server: a first delivery 2 (claim,
/// completion), a completed or in-progress duplicate 1, a takeover's claim 1. A server
/// that forgot the scripts (`SCRIPT FLUSH`, a restart, a failover) costs one more
/// request, the script itself through `EVAL`, and the operations still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_message_at_the_server() {
    // A server of its own: another client's `EVAL` or `SCRIPT FLUSH` would change what
    // this test counts.
    let server = PrivateRedis::start().await;
    let addr = server.addr();
    let url = format!("redis://{addr}");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .namespace(redis_prefix("round-trips"));
    let monitor = Monitor::start(&url).await;
    let idempotency = Idempotency::new(store.clone());
    let op = Operation::new("generate", KeyStrategy::field("request_id"));
    let run = |id: &'static str| {
        let idempotency = idempotency.clone();
        let op = op.clone();
        async move {
            idempotency
                .execute(&op, &json!({ "request_id": id }), || async {
                    Ok::<_, Error>("answer".to_string())
                })
                .await
        }
    };
    let commands = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.split('"').nth(1).unwrap_or_default().to_owned())
            .collect()
    };
    // Warm: the scripts are loaded (another test may have flushed them).
    run("warm").await.unwrap();
    monitor.requests(&store).await;

    run("r-1").await.unwrap();
    let first = monitor.requests(&store).await;
    assert_eq!(
        commands(&first),
        ["EVALSHA", "EVALSHA"],
        "first delivery: {first:#?}"
    );

    let (_, outcome) = run("r-1").await.unwrap();
    assert_eq!(outcome, Outcome::Replayed);
    let duplicate = monitor.requests(&store).await;
    assert_eq!(
        commands(&duplicate),
        ["EVALSHA"],
        "completed duplicate: {duplicate:#?}"
    );

    // Another worker holds r-2; then its lease has ended (r-3).
    let held = idempotency
        .idempotency_id(&op, &json!({"request_id": "r-2"}))
        .unwrap();
    store.claim(&claim(&held, "other")).await.unwrap();
    let stale = idempotency
        .idempotency_id(&op, &json!({"request_id": "r-3"}))
        .unwrap();
    let past = SystemTime::now() - Duration::from_secs(120);
    store
        .claim(&conformance::claim_at(
            &stale,
            past,
            Duration::from_secs(1),
            "dead",
        ))
        .await
        .unwrap();
    monitor.requests(&store).await;
    assert!(matches!(
        run("r-2").await,
        Err(lambda_idempotency::ExecuteError::Idempotency(
            Error::AlreadyInProgress { .. }
        ))
    ));
    let in_progress = monitor.requests(&store).await;
    assert_eq!(
        commands(&in_progress),
        ["EVALSHA"],
        "in-progress duplicate: {in_progress:#?}"
    );
    let (_, outcome) = run("r-3").await.unwrap();
    assert_eq!(outcome, Outcome::TookOver);
    let takeover = monitor.requests(&store).await;
    assert_eq!(
        commands(&takeover),
        ["EVALSHA", "EVALSHA"],
        "takeover: one claim, one completion: {takeover:#?}"
    );

    // Without the scripts: EVALSHA answers NOSCRIPT, EVAL runs the script.
    store
        .query(redis::cmd("SCRIPT").arg("FLUSH"))
        .await
        .unwrap();
    monitor.requests(&store).await;
    run("r-4").await.unwrap();
    let reloaded = monitor.requests(&store).await;
    assert_eq!(
        commands(&reloaded),
        ["EVALSHA", "EVAL", "EVALSHA", "EVAL"],
        "each script is sent once more, then known: {reloaded:#?}"
    );
    clean(&store).await;
}

/// A record another program wrote in a shape we do not know is a clear, non-retryable
/// error, and the claim leaves it alone.
#[tokio::test]
async fn a_foreign_hash_is_a_clear_error() {
    let store = node("foreign").await;
    let c = claim("conformance.foreign#k", "t1");
    let far = (epoch_secs(SystemTime::now()) + 3_600).to_string();
    store
        .query(
            redis::cmd("HSET")
                .arg(store.key(&c.id))
                .arg("status")
                .arg("DONE")
                .arg("expiration")
                .arg(&far),
        )
        .await
        .unwrap();
    match store.claim(&c).await {
        Err(Error::Store {
            backend: "redis",
            retryable: false,
            source,
        }) => assert!(source.to_string().contains("DONE"), "{source}"),
        other => panic!("a foreign record must be a malformed-record error, got {other:?}"),
    }
    clean(&store).await;
}

/// An id with a NUL character (valid in a JSON string key) is claimed.
#[tokio::test]
async fn an_id_with_a_nul_is_claimed() {
    let store = node("nul").await;
    let id = "fn.op#order\u{0}42";
    let outcome = store.claim(&claim(id, "t1")).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "{outcome:?}"
    );
    store.release(&claim(id, "t1")).await.unwrap();
}

#[tokio::test]
async fn a_zero_request_timeout_is_refused_at_construction() {
    let store = node("zero-timeout").await;
    let refused = std::panic::AssertUnwindSafe(async move {
        store.request_timeout(Duration::ZERO);
    });
    let panic = futures_util::FutureExt::catch_unwind(refused)
        .await
        .expect_err("a zero request timeout is refused");
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(message.contains("must be more than zero"), "{message}");
}

/// The longest request timeout, `Duration::MAX`, bounds nothing and overflows nothing: a
/// call runs and its duplicate is answered.
#[tokio::test]
async fn the_longest_request_timeout_works() {
    let store = node("max-timeout").await.request_timeout(Duration::MAX);
    let idem = Idempotency::builder(store.clone())
        .store_attempt_timeout(Duration::MAX)
        .build();
    let op = Operation::new("max", KeyStrategy::field("id"));
    for expected in [Outcome::Executed, Outcome::Replayed] {
        let (_, outcome) = idem
            .execute(&op, &json!({"id": "1"}), || async { Ok::<_, String>(1) })
            .await
            .unwrap();
        assert_eq!(outcome, expected);
    }
    clean(&store).await;
}

//! The Redis store against real servers: one node (`REDIS_TEST_URL`, default the local
//! 127.0.0.1:6379) and a three-node cluster (`REDIS_CLUSTER_TEST_URLS`, comma-separated,
//! started by `scripts/test`). The conformance suite, the engine over the store, the
//! model's histories, connection kills and the stored layout.
//!
//! Every test writes under its own key prefix and deletes its keys at the end.
#![cfg(feature = "redis")]

use lambda_idempotency::store::conformance::{self, model};
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::redis::{KEY_GRACE, RedisStore};
use lambda_idempotency::store::{Claim, ClaimOutcome, IdempotencyStore, Status, epoch_secs};
use lambda_idempotency::{Error, Idempotency, KeyStrategy, Operation, Outcome};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

mod common;
use common::{private_redis, private_redis_with, redis_url, test_certificates};

const HOW: &str = "run scripts/test (it finds or starts Redis and a three-node cluster), or start \
    redis-server on 127.0.0.1:6379, or set REDIS_TEST_URL / REDIS_CLUSTER_TEST_URLS";

fn cluster_urls() -> Vec<String> {
    let urls = std::env::var("REDIS_CLUSTER_TEST_URLS")
        .unwrap_or_else(|_| panic!("REDIS_CLUSTER_TEST_URLS is not set: {HOW}"));
    urls.split(',').map(str::to_owned).collect()
}

/// `REDIS_TEST_PREFIX` (one per `scripts/test` run, removed when it ends), the test's
/// name and a random part.
fn prefix(test: &str) -> String {
    let run = std::env::var("REDIS_TEST_PREFIX").unwrap_or_else(|_| "idem-test:".into());
    format!("{run}{test}:{:016x}:", fastrand::u64(..))
}

async fn node(test: &str) -> RedisStore {
    let url = redis_url();
    RedisStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}; {HOW}"))
        .namespace(prefix(test))
}

async fn cluster(test: &str) -> RedisStore {
    let urls = cluster_urls();
    RedisStore::connect_cluster(urls.clone())
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis cluster at {urls:?}: {e}; {HOW}"))
        .namespace(prefix(test))
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

/// The contract, the engine over the store, and the model's histories. The contract's
/// store failures are the store's connection killed from an admin connection
/// (`CLIENT KILL`) on a single node, and the fault wrapper on a cluster (its client
/// retries a dropped connection itself).
async fn conformance_suite(store: RedisStore, seeds: u64, kill_connections: bool) {
    if !kill_connections {
        let faulty = FaultyStore::new(store.clone());
        let faults = faulty.clone();
        conformance::run_all(&faulty, async |op| faults.inject(op, Fault::Unavailable, 1)).await;
    } else {
        let admin = node("admin").await;
        conformance::run_all(&store, async |_op| {
            kill(&admin, client_id(&store).await).await
        })
        .await;
    }
    conformance::engine::run_all(store.clone()).await;
    for expires_after in [Duration::from_secs(3_600), Duration::from_secs(3)] {
        for seed in model::seeds(seeds) {
            model::run_seed(store.clone(), seed, model::Setup { expires_after }, 40).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_node_passes_the_conformance_suite() {
    let store = node("conformance").await;
    conformance_suite(store.clone(), 12, true).await;
    clean(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_passes_the_conformance_suite() {
    let store = cluster("conformance").await;
    conformance_suite(store, 6, false).await;
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

/// A connection killed by the server (as after a Lambda freeze longer than the server's
/// idle timeout) costs one retryable error; the next request reconnects, and the records
/// are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_a_retryable_error_then_reconnects() {
    let store = node("kill").await;
    let admin = node("kill-admin").await;
    let c = claim("conformance.kill#a", "t1");
    store.claim(&c).await.unwrap();
    kill(&admin, client_id(&store).await).await;
    let mut errors = 0;
    let record = loop {
        match store.get(&c.id).await {
            Ok(record) => break record,
            Err(Error::Store {
                backend: "redis",
                retryable: true,
                ref source,
            }) if errors == 0 => {
                assert!(
                    source.downcast_ref::<redis::RedisError>().is_some(),
                    "the driver's error is the source: {source:?}"
                );
                errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("after a kill: one retryable error, got {e:?}"),
        }
    };
    assert_eq!(
        errors, 1,
        "the request on the killed connection fails, retryably"
    );
    let record = record.expect("the claim survives the kill");
    assert_eq!(record.lease_token.as_deref(), Some("t1"));
    store
        .complete(&c, Some("1"), SystemTime::now() + Duration::from_secs(60))
        .await
        .expect("the reconnected store completes");
    clean(&store).await;
}

/// Through the engine: the connection dies between the claim and the completion; the
/// engine's retry completes on the new connection and the function ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_completes_across_a_killed_connection() {
    let store = node("kill-engine").await;
    let admin = node("kill-engine-admin").await;
    let idempotency = Idempotency::new(store.clone());
    let op = Operation::new("generate", KeyStrategy::field("request_id"));
    let calls = Arc::new(AtomicU32::new(0));
    let payload = json!({"request_id": "r-1"});
    let id = client_id(&store).await;
    let (result, outcome) = idempotency
        .execute(&op, &payload, || {
            let calls = calls.clone();
            let admin = admin.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                kill(&admin, id).await;
                Ok::<_, Error>("answer".to_string())
            }
        })
        .await
        .expect("the completion is retried on a new connection");
    assert_eq!((result.as_str(), outcome), ("answer", Outcome::Executed));
    let (again, outcome) = idempotency
        .execute(&op, &payload, || async {
            Ok::<_, Error>("second".to_string())
        })
        .await
        .unwrap();
    assert_eq!((again.as_str(), outcome), ("answer", Outcome::Replayed));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    clean(&store).await;
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
    let (_server, addr) = private_redis().await;
    let url = format!("redis://{addr}");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .namespace(prefix("round-trips"));
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

/// Nothing listens: the first connection fails with a retryable error naming Redis.
#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    match RedisStore::connect(&format!("redis://127.0.0.1:{port}")).await {
        Err(
            e @ Error::Store {
                backend: "redis", ..
            },
        ) => {
            assert!(e.is_retryable(), "{e}")
        }
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// In-transit encryption and ACL credentials, as ElastiCache uses them: a private server
/// that speaks only TLS and knows only the user `worker`. A client built with the test CA
/// works; a wrong password and an untrusted certificate are errors no retry fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_acl_credentials() {
    let (_server, addr) = private_redis_with(|port, dir| {
        test_certificates(dir);
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &file("server.crt"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.crt"),
            "--tls-auth-clients",
            "no",
            "--user",
            "default",
            "off",
            "--user",
            "worker",
            "on",
            ">secret",
            "~*",
            "+@all",
        ]
        .map(str::to_owned)
        .to_vec()
    })
    .await;
    let dir = std::env::temp_dir().join(format!("idem-test-redis-{}", addr.port()));
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let client = |password: &str| {
        redis::Client::build_with_tls(
            format!("rediss://worker:{password}@localhost:{}", addr.port()),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            },
        )
        .unwrap()
    };
    let store = RedisStore::from_client(client("secret"))
        .await
        .expect("TLS with the test CA and the worker's credentials")
        .namespace(prefix("tls"));
    let c = claim("conformance.tls#k", "t1");
    store.claim(&c).await.unwrap();
    store
        .complete(&c, Some("1"), SystemTime::now() + Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store.get(&c.id).await.unwrap().unwrap().status,
        Status::Completed
    );
    match RedisStore::from_client(client("wrong")).await {
        Err(
            e @ Error::Store {
                backend: "redis", ..
            },
        ) => {
            assert!(!e.is_retryable(), "a wrong password is not retryable: {e}")
        }
        other => panic!("a wrong password must fail, got {other:?}"),
    }
    // The system's roots do not hold the test CA: refused, and no retry fixes that.
    match RedisStore::connect(&format!("rediss://worker:secret@localhost:{}", addr.port())).await {
        Err(
            e @ Error::Store {
                backend: "redis", ..
            },
        ) => {
            assert!(
                !e.is_retryable(),
                "an untrusted certificate is not retryable: {e}"
            )
        }
        other => panic!("an untrusted certificate must fail, got {other:?}"),
    }
}

/// The store's own error inside [`Error::Store`], and the chain under it.
fn store_source(err: &Error) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match err {
        Error::Store { source, .. } => &**source,
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// A refused connection names the server, says the cause once, and keeps the driver's
/// error as its source. Was: "Connection refused (os error 111): Connection refused (os
/// error 111)", neither host nor port.
#[tokio::test]
async fn a_connection_error_names_the_host_and_port() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let node = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens");
    let cluster = RedisStore::connect_cluster([format!("redis://127.0.0.1:{port}")])
        .await
        .expect_err("nothing listens");
    for (err, expected) in [
        (
            node,
            format!("cannot connect to Redis at 127.0.0.1:{port}: "),
        ),
        (
            cluster,
            format!("cannot connect to the Redis cluster at 127.0.0.1:{port}: "),
        ),
    ] {
        assert!(err.is_retryable(), "{err:?}");
        let own = store_source(&err);
        let text = own.to_string();
        assert!(text.starts_with(&expected), "{text}");
        assert_eq!(text.matches("refused").count(), 1, "the cause once: {text}");
        let driver = own.source().expect("the driver's error as the source");
        assert!(
            driver.downcast_ref::<redis::RedisError>().is_some(),
            "{driver:?}"
        );
        assert!(text.ends_with(&driver.to_string()), "{text} / {driver}");
    }
}

/// `Debug` of a store never shows the password of its URL; it says one is set.
#[tokio::test]
async fn debug_never_shows_the_password() {
    let (_server, addr) = private_redis_with(|port, _| {
        [
            "--port",
            &port.to_string(),
            "--requirepass",
            "hunter2-redis",
        ]
        .map(str::to_owned)
        .to_vec()
    })
    .await;
    let store = RedisStore::connect(&format!("redis://:hunter2-redis@{addr}"))
        .await
        .unwrap();
    let text = format!("{store:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        text.contains("<redacted>") && text.contains(&addr.to_string()),
        "{text}"
    );
    let wrong = RedisStore::connect(&format!("redis://:hunter2-wrong@{addr}"))
        .await
        .expect_err("a wrong password");
    for text in [format!("{wrong}"), format!("{wrong:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
}

/// A full Redis under `maxmemory-policy noeviction` (used memory past `maxmemory`) answers
/// `OOM` to a script whose first write adds data: a fresh claim is refused (no call is
/// made), a completion too (the engine retries it within the lease), both retryable and
/// nothing half-written; reads work, and so does a script that deletes first (a release;
/// a claim over a claimable record, which deletes it, then writes). Once memory is freed
/// the same completion succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_refuses_writes_retryably_and_keeps_records_whole() {
    let (_server, addr) = private_redis_with(|port, _| {
        [
            "--port",
            &port.to_string(),
            "--maxmemory-policy",
            "noeviction",
        ]
        .map(str::to_owned)
        .to_vec()
    })
    .await;
    let store = RedisStore::connect(&format!("redis://{addr}"))
        .await
        .unwrap();
    let maxmemory = |limit: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory").arg(limit);
        cmd
    };
    let held = claim("conformance.oom#held", "t1");
    store.claim(&held).await.unwrap();
    store
        .query(redis::cmd("SET").arg("filler").arg(vec![b'x'; 2 << 20]))
        .await
        .unwrap();
    // Full: more in use than allowed.
    store.query(&maxmemory("1mb")).await.unwrap();
    let fresh = store.claim(&claim("conformance.oom#fresh", "t2")).await;
    let completed = store
        .complete(
            &held,
            Some("{\"answer\":1}"),
            SystemTime::now() + Duration::from_secs(60),
        )
        .await;
    let read = store.get(&held.id).await;
    let reclaimed = store.claim(&held).await;
    let released = store.release(&held).await;
    let after_release = store.claim(&held).await;
    store.query(&maxmemory("0")).await.unwrap();
    for (what, result) in [
        ("a fresh claim", fresh.map(drop)),
        ("a completion", completed),
        ("a claim after the release", after_release.map(drop)),
    ] {
        match result {
            Err(err @ Error::Store { .. }) => {
                let text = store_source(&err).to_string();
                assert!(text.contains("OOM"), "{what}: {text}");
                assert!(err.is_retryable(), "{what}: OOM must be retryable: {err:?}");
            }
            other => panic!("{what} on a full Redis: {other:?}"),
        }
    }
    let record = read
        .expect("reads work on a full Redis")
        .expect("the record");
    assert_eq!(record.status, Status::InProgress, "nothing half-written");
    assert_eq!(record.data, None);
    assert!(
        matches!(reclaimed, Ok(ClaimOutcome::Claimed { .. })),
        "the claim script deletes the claimable record first, then writes: {reclaimed:?}"
    );
    assert!(
        released.is_ok(),
        "a release (a DEL) is allowed: {released:?}"
    );
    store
        .claim(&held)
        .await
        .expect("memory freed: the claim succeeds");
    store
        .complete(
            &held,
            Some("1"),
            SystemTime::now() + Duration::from_secs(60),
        )
        .await
        .expect("and the completion");
}

/// A server busy running another client's long script answers `BUSY` to every request:
/// retryable, and the connection is kept (it answers once the script ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_redis_is_retryable() {
    let (_server, addr) = private_redis_with(|port, _| {
        ["--port", &port.to_string(), "--busy-reply-threshold", "100"]
            .map(str::to_owned)
            .to_vec()
    })
    .await;
    let url = format!("redis://{addr}");
    let store = RedisStore::connect(&url).await.unwrap();
    let c = claim("conformance.busy#k", "t1");
    store.get(&c.id).await.unwrap();
    let looping = RedisStore::connect(&url)
        .await
        .unwrap()
        .request_timeout(Duration::from_secs(30));
    let script = tokio::spawn(async move {
        looping
            .query(redis::cmd("EVAL").arg("while true do end").arg(0))
            .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let busy = store.claim(&c).await;
    let killer = RedisStore::connect(&url).await;
    let killed = match &killer {
        Ok(k) => k.query(redis::cmd("SCRIPT").arg("KILL")).await.map(drop),
        Err(_) => Ok(()),
    };
    let _ = script.await;
    match busy {
        Err(err @ Error::Store { .. }) => {
            let text = store_source(&err).to_string();
            assert!(text.contains("BUSY"), "{text}");
            assert!(err.is_retryable(), "BUSY must be retryable: {err:?}");
        }
        other => panic!("a claim on a busy Redis: {other:?}"),
    }
    killer.expect("SCRIPT KILL may be sent to a busy server");
    killed.expect("SCRIPT KILL");
    store
        .claim(&c)
        .await
        .expect("the script ended: the claim works");
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

//! The Redis store's connections: killed, refused, untrusted, frozen, slow, failed over.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use test_support::certs::test_certificates;
use test_support::proxy::Proxy;
use test_support::servers::redis_addr;

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

/// A refused connection names the server's host and port, says the cause once, and keeps
/// the driver's error as its source.
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

/// A Lambda `main` that returns a start-up error with `?` prints its `Debug`: the sentence
/// and its causes, as `report` gives them, never the URL's password; `{:#?}` keeps a
/// structured form.
#[tokio::test]
async fn a_start_up_error_returned_from_main_prints_its_report() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let err = RedisStore::connect(&format!("redis://worker:hunter2-redis@127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens");
    let report = lambda_idempotency::report(&err);
    // What `fn main() -> Result<(), lambda_runtime::Error>` prints after `Error: `.
    let from_main: lambda_runtime::Error = err.into();
    let text = format!("{from_main:?}");
    assert_eq!(text, report);
    assert!(
        text.starts_with(&format!(
            "redis idempotency store error (retryable): cannot connect to Redis at 127.0.0.1:{port}: "
        )) && text.contains("refused"),
        "{text}"
    );
    let structured = format!("{from_main:#?}");
    assert!(
        structured.starts_with("Store {") && structured.contains("retryable: true"),
        "{structured}"
    );
    for text in [text, structured] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    // A URL that does not parse: the sentence, and still no password.
    let err = RedisStore::connect("redis://worker:hunter2-redis@127.0.0.1:port/0")
        .await
        .expect_err("no port");
    for text in [format!("{err:?}"), format!("{err:#?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
}

/// In-transit encryption and ACL credentials, as ElastiCache uses them: a private server
/// that speaks only TLS and knows only the user `worker`. A client built with the test CA
/// works; a wrong password and an untrusted certificate are errors no retry fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_acl_credentials() {
    let server = PrivateRedis::start_with(|port, dir| {
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
    let addr = server.addr();
    let ca = std::fs::read(server.dir().join("ca.crt")).unwrap();
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
        .namespace(redis_prefix("tls"));
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

/// `Debug` of a store never shows the password of its URL; it says one is set.
#[tokio::test]
async fn debug_never_shows_the_password() {
    let server = PrivateRedis::start_with(|port, _| {
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
    let addr = server.addr();
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

/// A connection that stops answering (half-open TCP: a Lambda freeze behind a NAT idle
/// timeout, a blackholed node) is rebuilt on the next call: a timeout is a reason to
/// reconnect, whether the store or the engine cut the request off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stopped_answering_is_rebuilt() {
    let proxy = Proxy::start(redis_addr(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace(redis_prefix("faults"));
    store.get("k").await.expect("works through the proxy");
    proxy.freeze();
    // The engine's default: 3 attempts of up to 2 s each, plus backoff. Give the store
    // ten attempts over ~10 s: a fresh connection through the proxy answers at once.
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        let r = tokio::time::timeout(Duration::from_secs(1), store.get("k")).await;
        let ok = matches!(r, Ok(Ok(_)));
        outcomes.push(match r {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(e)) => format!("err: {e}"),
            Err(_) => "engine timeout".to_string(),
        });
        if ok {
            break;
        }
    }
    assert!(
        outcomes.last().is_some_and(|o| o == "ok"),
        "the store never left the dead connection (connections made: {}); attempts: {outcomes:#?}",
        proxy.accepted()
    );
}

/// A request on the old connection that is cut off late, after the store moved to a new
/// connection, leaves the new one alone: only the connection it was sent on is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cut_off_on_an_old_connection_keeps_the_new_one() {
    let proxy = Proxy::start(redis_addr(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace(redis_prefix("stale"));
    store.get("k").await.unwrap();
    proxy.freeze();
    // Two requests on the frozen connection, cut off at different times.
    let late = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(1500), store.get("k"))
                .await
                .is_err()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let early = tokio::time::timeout(Duration::from_millis(200), store.get("k")).await;
    assert!(early.is_err(), "the frozen connection does not answer");
    store.get("k").await.expect("a new connection answers");
    assert_eq!(proxy.accepted(), 2);
    assert!(late.await.unwrap(), "the late request was cut off");
    store.get("k").await.unwrap();
    assert_eq!(
        proxy.accepted(),
        2,
        "the late cut-off on the old connection must not drop the new one"
    );
}

/// A reply may take as long as the engine's store attempt timeout allows: the driver's
/// own response timeout does not cut it off first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_may_take_as_long_as_the_engine_allows() {
    let proxy = Proxy::start(redis_addr(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace(redis_prefix("faults"));
    // Slow answers from now on (not during the connect, whose own bound is 1 s).
    proxy.set_delay(Duration::from_millis(700));
    // The engine's own attempt timeout is 2 s: emulate it.
    let r = tokio::time::timeout(Duration::from_secs(2), store.get("k")).await;
    assert!(
        matches!(r, Ok(Ok(None))),
        "a 700 ms answer within the engine's 2 s attempt timeout must be accepted, got {r:?}"
    );
}

/// After a failover that demotes the node the connection is on (the primary endpoint's
/// DNS now names the new primary), `READONLY` drops the connection and the retry reaches
/// the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_demoted_the_node_is_followed() {
    let old_primary = PrivateRedis::start().await;
    let new_primary = PrivateRedis::start().await;
    let (old_addr, new_addr) = (old_primary.addr(), new_primary.addr());
    let proxy = Proxy::start(old_addr, Duration::ZERO).await; // "the primary endpoint"
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace("idem-faults:");
    store.claim(&claim("before", "t0")).await.unwrap();
    // Failover: the old primary becomes a replica (of a master that is not there yet),
    // the endpoint now leads to the new primary.
    let admin = RedisStore::connect(&format!("redis://{old_addr}"))
        .await
        .unwrap();
    admin
        .query(
            redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(new_addr.port()),
        )
        .await
        .unwrap();
    proxy.redirect(new_addr);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut outcomes = Vec::new();
    for i in 0..10 {
        let c = claim("after", "t1");
        let r = tokio::time::timeout(Duration::from_secs(2), store.claim(&c)).await;
        let ok = matches!(r, Ok(Ok(ClaimOutcome::Claimed { .. })));
        outcomes.push(format!("{i}: {r:?}"));
        if ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        outcomes.last().is_some_and(|o| o.contains("Claimed")),
        "every retry went to the demoted node (connections made: {}): {outcomes:#?}",
        proxy.accepted()
    );
}

/// `RedisStore::query` (for health checks) and `IdempotencyStore::get`, called outside the
/// engine, are bounded by the store's request timeout: a server that stops answering (a
/// frozen node, a half-open connection after a Lambda freeze) never hangs the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_on_a_server_that_stopped_answering_returns() {
    let server = PrivateRedis::start().await;
    let addr = server.addr();
    let store = RedisStore::connect(&format!("redis://{addr}"))
        .await
        .unwrap()
        .request_timeout(Duration::from_millis(500));
    store
        .query(&redis::cmd("PING"))
        .await
        .expect("the server answers");
    // The node freezes: the TCP connection stays up, nothing answers.
    server.freeze();
    let health =
        tokio::time::timeout(Duration::from_secs(10), store.query(&redis::cmd("PING"))).await;
    let get = tokio::time::timeout(Duration::from_secs(2), store.get("k")).await;
    server.thaw();
    assert!(
        matches!(health, Ok(Err(_))),
        "a health check against a frozen Redis must end in an error, got {health:?} (still waiting after 10 s)"
    );
    assert!(
        matches!(get, Ok(Err(_))),
        "get() against a frozen Redis must end in an error, got {get:?}"
    );
}

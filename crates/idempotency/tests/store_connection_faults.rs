#![cfg(all(feature = "redis", feature = "postgres"))]
//! The Redis and PostgreSQL stores against the faults a hostile review found them open to,
//! each behind a real server and, where the fault is in the network, a TCP proxy that
//! freezes, slows or redirects connections. Each section's comment says what went wrong
//! before the fix; `control_*` tests show the other store under the same fault.

use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::store::{Claim, ClaimOutcome, IdempotencyStore, Status};
use lambda_idempotency::store::{epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{postgres_schema, postgres_url, private_redis, redis_url};

async fn pg_store(test: &str) -> PostgresStore {
    let admin = pg_admin().await;
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\"",
            postgres_schema()
        ))
        .await
        .ok();
    let table = format!(
        "{}.idem_faults_{test}_{:012x}",
        postgres_schema(),
        fastrand::u64(..) >> 16
    );
    let store = PostgresStore::from_url(&postgres_url(), table).unwrap();
    store.create_table().await.unwrap();
    store
}

async fn pg_admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn claim(id: &str, now: SystemTime, token: &str) -> Claim {
    // Claim is #[non_exhaustive]: build it from a record-shaped default through the
    // public fields the conformance suite uses.
    let mut c =
        lambda_idempotency::store::conformance::claim_at(id, now, Duration::from_secs(60), token);
    c.expiration = now + Duration::from_secs(3600);
    c
}

// ---------------------------------------------------------------------------------------
// 1. Redis: a connection that stops answering (half-open TCP: a Lambda freeze behind a
//    NAT / Hyperplane ENI idle timeout, a blackholed node) is rebuilt on the next call.
//    Was: redis-rs's ConnectionManager retried on the same dead socket (a timeout is not
//    a reason for it to reconnect, and an attempt the engine cut off it never saw), so
//    every request timed out until the kernel gave up.
// ---------------------------------------------------------------------------------------

/// A TCP proxy to `upstream`. `freeze()` makes every connection accepted so far stop
/// forwarding (sockets stay open, nothing is closed or reset: a half-open connection);
/// connections accepted later forward normally. `delay` adds latency to every reply.
struct Proxy {
    addr: std::net::SocketAddr,
    generation: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// Where connections accepted from now on go.
    upstream: Arc<std::sync::Mutex<std::net::SocketAddr>>,
    /// How long every answer is held back, in milliseconds (changeable at any time).
    delay_ms: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr, delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let generation = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (gen2, acc2) = (generation.clone(), accepted.clone());
        let upstream = Arc::new(std::sync::Mutex::new(upstream));
        let up2 = upstream.clone();
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let delay2 = delay_ms.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let upstream = *up2.lock().unwrap();
                acc2.fetch_add(1, Ordering::SeqCst);
                let mine = gen2.load(Ordering::SeqCst);
                let generation = gen2.clone();
                let delay = delay2.clone();
                tokio::spawn(async move {
                    let server = TcpStream::connect(upstream).await.unwrap();
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let frozen = {
                        let g = generation.clone();
                        move || g.load(Ordering::SeqCst) != mine
                    };
                    let f1 = frozen.clone();
                    let up = tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if f1() {
                                // Swallow everything, keep the socket open.
                                std::future::pending::<()>().await;
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                    let down = tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let held = delay.load(Ordering::SeqCst);
                            if held > 0 {
                                tokio::time::sleep(Duration::from_millis(held)).await;
                            }
                            if frozen() {
                                std::future::pending::<()>().await;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Proxy {
            addr,
            generation,
            accepted,
            upstream,
            delay_ms,
        }
    }

    fn freeze(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

fn redis_upstream() -> std::net::SocketAddr {
    let url = redis_url();
    let hostport = url
        .trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    use std::net::ToSocketAddrs;
    hostport.to_socket_addrs().unwrap().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rebuilds_a_connection_that_stopped_answering() {
    let proxy = Proxy::start(redis_upstream(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr))
        .await
        .unwrap()
        .namespace(format!("idem-faults:{:016x}:", fastrand::u64(..)));
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
        proxy.accepted.load(Ordering::SeqCst)
    );
}

/// A request on the old connection that is cut off late, after the store moved to a new
/// connection, leaves the new one alone: only the connection it was sent on is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cut_off_on_an_old_connection_keeps_the_new_one() {
    let proxy = Proxy::start(redis_upstream(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr))
        .await
        .unwrap()
        .namespace(format!("stale:{:016x}:", fastrand::u64(..)));
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
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2);
    assert!(late.await.unwrap(), "the late request was cut off");
    store.get("k").await.unwrap();
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        2,
        "the late cut-off on the old connection must not drop the new one"
    );
}

/// Control: the PostgreSQL store does rebuild after an attempt is cut off (Call::drop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_postgres_rebuilds_a_connection_that_stopped_answering() {
    let base = pg_store("freeze").await;
    let upstream: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let proxy = Proxy::start(upstream, Duration::ZERO).await;
    let url = format!("postgres://postgres@{}/test?sslmode=disable", proxy.addr);
    let store = PostgresStore::from_url(&url, base.table()).unwrap();
    store.get("k").await.unwrap();
    proxy.freeze();
    let mut ok = false;
    for _ in 0..5 {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), store.get("k")).await {
            ok = true;
            break;
        }
    }
    assert!(ok);
}

// ---------------------------------------------------------------------------------------
// 2. Redis: a reply may take as long as the engine's store_attempt_timeout allows.
//    Was: redis-rs's default 500 ms response timeout cut every request off whatever the
//    engine allowed, so a server answering in 700 ms processed nothing.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_waits_as_long_as_the_engine_allows() {
    let proxy = Proxy::start(redis_upstream(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr))
        .await
        .unwrap()
        .namespace(format!("idem-faults:{:016x}:", fastrand::u64(..)));
    // Slow answers from now on (not during the connect, whose own bound is 1 s).
    proxy.delay_ms.store(700, Ordering::SeqCst);
    // The engine's own attempt timeout is 2 s: emulate it.
    let r = tokio::time::timeout(Duration::from_secs(2), store.get("k")).await;
    assert!(
        matches!(r, Ok(Ok(None))),
        "a 700 ms answer within the engine's 2 s attempt timeout must be accepted, got {r:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. PostgreSQL: sslmode=prefer (the default) with root certificates given is `require`.
//    Was: a server (or a man in the middle) that answered the SSLRequest with 'N' got a
//    plaintext session, and the password in clear text if it asked for it.
// ---------------------------------------------------------------------------------------

/// A fake PostgreSQL server: refuses TLS, asks for a cleartext password, returns it.
async fn downgrading_server() -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Receiver<Vec<u8>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
        s.read_exact(&mut rest).await.unwrap();
        if rest[..4] == 80877103u32.to_be_bytes() {
            // SSLRequest: "no TLS here".
            s.write_all(b"N").await.unwrap();
            s.read_exact(&mut len).await.unwrap();
            rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut rest).await.unwrap();
        }
        // AuthenticationCleartextPassword.
        s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).await.unwrap();
        let mut tag = [0u8; 1];
        if s.read_exact(&mut tag).await.is_ok() && tag[0] == b'p' {
            s.read_exact(&mut len).await.unwrap();
            let mut pw = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut pw).await.unwrap();
            let _ = tx.send(pw);
        }
    });
    (addr, rx)
}

fn some_root_pem() -> Vec<u8> {
    for path in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ] {
        if let Ok(pem) = std::fs::read(path) {
            return pem;
        }
    }
    panic!("no CA bundle on this machine");
}

#[tokio::test]
async fn postgres_prefer_with_roots_never_falls_back_to_plaintext() {
    let (addr, password) = downgrading_server().await;
    // No sslmode: prefer, the documented default; the RDS bundle given as in docs/stores.md.
    let url = format!("postgres://worker:s3cret@{addr}/app");
    let store = PostgresStore::from_url(&url, "idempotency")
        .unwrap()
        .root_certificates_pem(&some_root_pem())
        .unwrap();
    let connected = tokio::time::timeout(Duration::from_secs(3), store.ensure_connected())
        .await
        .expect("the refusal is immediate");
    match connected {
        Err(e) => {
            let chain = lambda_idempotency::report(&e).to_lowercase();
            assert!(
                chain.contains("tls") || chain.contains("ssl"),
                "refused for declining TLS, not for something else: {chain}"
            )
        }
        Ok(()) => panic!("a server that declines TLS must be refused"),
    }
    let leaked = tokio::time::timeout(Duration::from_millis(500), password)
        .await
        .ok()
        .and_then(Result::ok);
    assert_eq!(
        leaked.as_deref().map(String::from_utf8_lossy),
        None,
        "docs: with roots given, prefer is 'verified as require'; yet the password went out in clear text"
    );
}

// ---------------------------------------------------------------------------------------
// 4. PostgreSQL: an id with a NUL character (the key taken verbatim from a JSON string,
//    "\u0000", by KeyStrategy pointer) is stored escaped. Was: `text` refused it, every
//    claim failed with a permanent error and the message went to the DLQ unprocessed.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn postgres_claims_an_id_with_a_nul() {
    let store = pg_store("nul").await;
    let now = SystemTime::now();
    let id = "fn.op#order\u{0}42";
    let outcome = store.claim(&claim(id, now, "t1")).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "a NUL in the id (valid in a JSON string key): {outcome:?}"
    );
}

#[tokio::test]
async fn control_redis_claims_an_id_with_a_nul() {
    let store = RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .namespace(format!("idem-faults:{:016x}:", fastrand::u64(..)));
    let id = "fn.op#order\u{0}42";
    let outcome = store.claim(&claim(id, SystemTime::now(), "t1")).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "{outcome:?}"
    );
    store
        .release(&claim(id, SystemTime::now(), "t1"))
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// 5. PostgreSQL: the pg_cron DELETE in purge_expired's docs truncates seconds and
//    milliseconds as is_claimable_at does. Was: `extract(epoch FROM now())::bigint`
//    rounds, so at 1000.6 s it deleted a record expiring at 1000 (live by whole seconds).
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn postgres_pg_cron_purge_keeps_live_records() {
    let store = pg_store("cron").await;
    let admin = pg_admin().await;
    // A moment with a fraction above one half, in seconds and in milliseconds.
    let at_ms: u64 = 1_900_000_000_000 + 600; // .600 s
    let at = from_epoch_millis(at_ms) + Duration::from_micros(700); // .6007 s: X.7 ms
    let completed_id = "completed-live";
    let leased_id = "leased-live";
    // Completed record expiring in the current second: live at `at` by whole seconds.
    let mut c = claim(completed_id, at, "tc");
    c.expiration = from_epoch_secs(epoch_secs(at));
    c.lease_until = at + Duration::from_secs(1);
    store.claim(&c).await.unwrap();
    store
        .complete(&c, Some("1"), from_epoch_secs(epoch_secs(at)))
        .await
        .unwrap();
    // In progress, expired, the lease ending in this very millisecond: live.
    let mut l = claim(leased_id, at - Duration::from_secs(10), "tl");
    l.expiration = from_epoch_secs(epoch_secs(at) - 5);
    l.lease_until = from_epoch_millis(epoch_millis(at));
    store.claim(&l).await.unwrap();
    for id in [completed_id, leased_id] {
        let r = store.get(id).await.unwrap().unwrap();
        assert!(
            !r.is_claimable_at(at),
            "{id} is live at `at` (reference semantics)"
        );
    }
    // And one that is over: expired a second before, no lease.
    let mut over = claim("completed-over", at, "to");
    over.lease_until = at;
    store.claim(&over).await.unwrap();
    store
        .complete(&over, Some("1"), from_epoch_secs(epoch_secs(at) - 1))
        .await
        .unwrap();
    // The pg_cron DELETE as `purge_expired`'s docs give it (the file they include), with
    // now() pinned to `at` plus the documented grace: the boundary it must get right.
    let documented: String = include_str!("../src/store/postgres/pg_cron_purge.sql")
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let shifted_ms = at_ms + 60_000;
    let ts = format!(
        "to_timestamp({}.{:06})",
        shifted_ms / 1000,
        (shifted_ms % 1000) * 1000 + 700
    );
    let table = format!("\"{}\"", store.table().replacen('.', "\".\"", 1));
    let sql = documented
        .replace("DELETE FROM idempotency", &format!("DELETE FROM {table}"))
        .replace("now()", &ts);
    admin.batch_execute(&sql).await.unwrap();
    let mut gone = Vec::new();
    for id in [completed_id, leased_id] {
        if store.get(id).await.unwrap().is_none() {
            gone.push(id);
        }
    }
    assert!(
        gone.is_empty(),
        "the documented pg_cron purge deleted live records: {gone:?}\n{sql}"
    );
    assert!(
        store.get("completed-over").await.unwrap().is_none(),
        "the documented pg_cron purge deletes what is over: {sql}"
    );
}

/// Control: purge_expired_at itself keeps them.
#[tokio::test]
async fn control_postgres_purge_expired_at_keeps_live_records() {
    let store = pg_store("purge_ok").await;
    let at = from_epoch_millis(1_900_000_000_600) + Duration::from_micros(700);
    let mut c = claim("c", at, "tc");
    c.expiration = from_epoch_secs(epoch_secs(at));
    store.claim(&c).await.unwrap();
    store
        .complete(&c, Some("1"), from_epoch_secs(epoch_secs(at)))
        .await
        .unwrap();
    assert_eq!(store.purge_expired_at(at, 100).await.unwrap(), 0);
    assert_eq!(
        store.get("c").await.unwrap().unwrap().status,
        Status::Completed
    );
}

// ---------------------------------------------------------------------------------------
// 6. Redis (one node): after a failover that demotes the node the connection is on
//    (the primary endpoint's DNS now names the new primary), READONLY drops the
//    connection and the retry reaches the new primary. Was: ConnectionManager kept the
//    connection to the demoted node, and no write succeeded.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_follows_a_failover_that_demoted_its_node() {
    let (_old_primary, old_addr) = private_redis().await;
    let (_new_primary, new_addr) = private_redis().await;
    let proxy = Proxy::start(old_addr, Duration::ZERO).await; // "the primary endpoint"
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr))
        .await
        .unwrap()
        .namespace("idem-faults:");
    let now = SystemTime::now();
    store.claim(&claim("before", now, "t0")).await.unwrap();
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
    *proxy.upstream.lock().unwrap() = new_addr;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut outcomes = Vec::new();
    for i in 0..10 {
        let c = claim("after", SystemTime::now(), "t1");
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
        proxy.accepted.load(Ordering::SeqCst)
    );
}

// ---------------------------------------------------------------------------------------
// 7. PostgreSQL: a request made outside the engine (a health check's `get`, a scheduled
//    `purge_expired`, `create_table` at start-up) on a connection whose server stopped
//    answering ends with a retryable error within the store's request timeout, and the
//    next call reconnects. Was: no bound at all (only the engine's attempt timeout), so
//    such a call waited forever.
// ---------------------------------------------------------------------------------------

fn postgres_upstream() -> std::net::SocketAddr {
    let config: tokio_postgres::Config = postgres_url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[allow(unreachable_patterns)]
        other => panic!("POSTGRES_TEST_URL must be a TCP host: {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    use std::net::ToSocketAddrs;
    (host.as_str(), port)
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap()
}

/// `POSTGRES_TEST_URL` through `proxy`, without TLS (the proxy freezes bytes, not TLS
/// records), with `extra` query parameters.
fn postgres_url_via(proxy: &Proxy, extra: &str) -> String {
    let config: tokio_postgres::Config = postgres_url().parse().unwrap();
    format!(
        "postgres://{}@{}/{}?sslmode=disable{extra}",
        config.get_user().unwrap_or("postgres"),
        proxy.addr,
        config.get_dbname().unwrap_or("test"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_requests_outside_the_engine_are_bounded_when_the_server_stops_answering() {
    let base = pg_store("bound").await;
    let proxy = Proxy::start(postgres_upstream(), Duration::ZERO).await;
    // `get` with the default bound (5 s), the others with a short one (same connection).
    let store = PostgresStore::from_url(&postgres_url_via(&proxy, ""), base.table()).unwrap();
    let short = store.clone().request_timeout(Duration::from_millis(300));
    for (what, store) in [
        ("get", &store),
        ("purge_expired", &short),
        ("create_table", &short),
    ] {
        // A working connection (a new one after the previous call was cut off), then frozen.
        store.get("warm").await.unwrap();
        proxy.freeze();
        let started = std::time::Instant::now();
        let call = async {
            match what {
                "get" => store.get("k").await.map(drop),
                "purge_expired" => store.purge_expired(10).await.map(drop),
                _ => store.create_table().await,
            }
        };
        let result = tokio::time::timeout(Duration::from_secs(8), call).await;
        match result {
            Ok(Err(err)) => assert!(err.is_retryable(), "{what}: {err:?}"),
            Ok(Ok(())) => panic!("{what}: answered through a frozen connection"),
            Err(_) => panic!(
                "{what} still waits after {:?} on a server that stopped answering",
                started.elapsed()
            ),
        }
    }
    store.get("k").await.expect("the next call reconnects");
}

// ---------------------------------------------------------------------------------------
// 8. PostgreSQL: a session the server ended for idling (`idle_session_timeout`, SQLSTATE
//    57P05) is retryable, like an administrator's termination (57P01), and the next call
//    reconnects. The server's notice is held back by the proxy so that it answers a
//    request sent after the session ended.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_idle_session_timeout_is_retryable_and_the_next_call_reconnects() {
    let base = pg_store("idle").await;
    let proxy = Proxy::start(postgres_upstream(), Duration::ZERO).await;
    let url = postgres_url_via(&proxy, "&options=-c%20idle_session_timeout%3D300");
    let store = PostgresStore::from_url(&url, base.table()).unwrap();
    store.get("k").await.unwrap();
    // The server ends the session at ~300 ms; its FATAL reaches the store at ~1.3 s.
    proxy.delay_ms.store(1000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let err = store.get("k").await.expect_err("the session is gone");
    proxy.delay_ms.store(0, Ordering::SeqCst);
    let mut code = None;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(c) = cause {
        if let Some(pg) = c.downcast_ref::<tokio_postgres::Error>() {
            code = pg.code().map(|c| c.code().to_owned());
        }
        cause = c.source();
    }
    assert_eq!(code.as_deref(), Some("57P05"), "{err:?}");
    assert!(err.is_retryable(), "57P05 must be retryable: {err:?}");
    store.get("k").await.expect("the next call reconnects");
}

//! The PostgreSQL store's connections: killed, never answering, stopped answering, ended
//! for idling, and TLS.

use super::*;
use test_support::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The server kills the store's connection between calls: the next call fails
/// retryably or has already reconnected, the one after succeeds, records are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_rebuilt() {
    let table = TestTable::new("kill").await;
    let store = table.store();
    let idem = Idempotency::new(store.clone());
    let calls = AtomicU32::new(0);
    let call = async |key: &str| {
        idem.execute(&op(), &payload(key), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("answer".to_string())
        })
        .await
    };
    assert_eq!(call("k").await.unwrap().1, Outcome::Executed);
    let id = idem.idempotency_id(&op(), &payload("k")).unwrap();
    for round in 0..3 {
        table.kill_connections().await;
        match store.get(&id).await {
            Ok(record) => assert_eq!(record.unwrap().status, Status::Completed),
            Err(Error::Store {
                backend: "postgres",
                retryable: true,
                ..
            }) => {}
            Err(other) => panic!("round {round}: a killed connection gave {other:?}"),
        }
        let record = store.get(&id).await.expect("reconnected").expect("intact");
        assert_eq!(
            (record.status, record.data.as_deref()),
            (Status::Completed, Some("\"answer\""))
        );
        // Through the engine, which retries a failed store call: nothing runs twice.
        table.kill_connections().await;
        assert_eq!(call("k").await.unwrap().1, Outcome::Replayed);
    }
    // A call cut off mid-flight (the engine's attempt timeout) leaves the store usable.
    for _ in 0..5 {
        let _ = tokio::time::timeout(Duration::from_micros(50), store.get(&id)).await;
        assert!(store.get(&id).await.unwrap().is_some());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    table.drop_table().await;
}

/// The start-up check on a connection the server killed (its answer lost): retryable,
/// and the next check reconnects and passes; cut off mid-flight, the next one passes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_check_on_a_killed_connection_is_retryable() {
    let table = TestTable::new("kill_check").await;
    let store = table.store();
    store.check_table().await.unwrap();
    table.kill_connections().await;
    match store.check_table().await {
        Ok(()) => {}
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
    }
    store.check_table().await.expect("reconnected");
    for _ in 0..5 {
        let _ = tokio::time::timeout(Duration::from_micros(50), store.check_table()).await;
        store.check_table().await.expect("the next check passes");
    }
    table.drop_table().await;
}

/// A connection that stops answering (half-open TCP) is rebuilt once an attempt is cut
/// off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stopped_answering_is_rebuilt() {
    let table = TestTable::new("freeze").await;
    let proxy = Proxy::start(postgres_upstream(), Duration::ZERO).await;
    let store = PostgresStore::from_url(&postgres_url_via(&proxy, ""), &table.qualified).unwrap();
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
    table.drop_table().await;
}

/// The text of every error in `err`'s chain, outermost first.
fn chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut texts = Vec::new();
    let mut cause = Some(err);
    while let Some(c) = cause {
        texts.push(c.to_string());
        cause = c.source();
    }
    texts
}

/// A server that accepts the TCP connection and never answers (a stalled proxy, a
/// process stopped mid-start-up): the connect, TLS negotiation and start-up included, is
/// bounded by the connect timeout, whichever `sslmode`: `ensure_connected` (the worker's
/// start-up) never waits forever.
#[tokio::test]
async fn connect_is_bounded_when_the_server_never_answers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            held.push(socket);
        }
    });
    let attempt = |query: &'static str, bound: Duration| async move {
        let url = format!("postgres://postgres@{addr}/test?{query}");
        let store = PostgresStore::from_url(&url, "t").unwrap();
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(bound, store.ensure_connected()).await;
        (query, result, started.elapsed())
    };
    let attempts = futures_util::future::join_all([
        attempt("sslmode=prefer&connect_timeout=1", Duration::from_secs(4)),
        attempt("sslmode=require&connect_timeout=1", Duration::from_secs(4)),
        attempt("sslmode=disable&connect_timeout=1", Duration::from_secs(4)),
        // No connect_timeout: the store's default, 5 s.
        attempt("sslmode=prefer", Duration::from_secs(9)),
    ])
    .await;
    holder.abort();
    for (query, result, elapsed) in attempts {
        match result {
            Ok(Err(err)) => {
                assert!(
                    err.is_retryable(),
                    "{query}: a timeout is retryable: {err:?}"
                );
                let texts = chain(&err);
                assert!(
                    texts.iter().any(|t| t.contains(&addr.to_string())),
                    "{query}: the error names the server: {texts:?}"
                );
                assert!(elapsed < Duration::from_secs(7), "{query}: {elapsed:?}");
            }
            Ok(Ok(())) => panic!("{query}: connected to a server that never answers"),
            Err(_) => panic!(
                "{query}: ensure_connected still waits after {elapsed:?} on a server that never answers"
            ),
        }
    }
}

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
        proxy.addr(),
        config.get_dbname().unwrap_or("test"),
    )
}

/// A request made outside the engine (a health check's `get`, a scheduled
/// `purge_expired`, `create_table` at start-up) on a connection whose server stopped
/// answering ends with a retryable error within the store's request timeout, and the
/// next call reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_the_engine_are_bounded_when_the_server_stops_answering() {
    let table = TestTable::new("bound").await;
    let proxy = Proxy::start(postgres_upstream(), Duration::ZERO).await;
    // `get` with the default bound (5 s), the others with a short one (same connection).
    let store = PostgresStore::from_url(&postgres_url_via(&proxy, ""), &table.qualified).unwrap();
    let short = store.clone().request_timeout(Duration::from_millis(300));
    for (what, store) in [
        ("get", &store),
        ("purge_expired", &short),
        ("create_table", &short),
        ("check_table", &short),
    ] {
        // A working connection (a new one after the previous call was cut off), then frozen.
        store.get("warm").await.unwrap();
        proxy.freeze();
        let started = std::time::Instant::now();
        let call = async {
            match what {
                "get" => store.get("k").await.map(drop),
                "purge_expired" => store.purge_expired(10).await.map(drop),
                "check_table" => store.check_table().await,
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
    table.drop_table().await;
}

/// A session the server ended for idling (`idle_session_timeout`, SQLSTATE 57P05) is
/// retryable, like an administrator's termination (57P01), and the next call reconnects.
/// The proxy holds the server's notice back so that it answers a request sent after the
/// session ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_timeout_is_retryable_and_the_next_call_reconnects() {
    let table = TestTable::new("idle").await;
    let proxy = Proxy::start(postgres_upstream(), Duration::ZERO).await;
    let url = postgres_url_via(&proxy, "&options=-c%20idle_session_timeout%3D300");
    let store = PostgresStore::from_url(&url, &table.qualified).unwrap();
    store.get("k").await.unwrap();
    // The server ends the session at ~300 ms; its FATAL reaches the store at ~1.3 s.
    proxy.set_delay(Duration::from_millis(1000));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let err = store.get("k").await.expect_err("the session is gone");
    proxy.set_delay(Duration::ZERO);
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
    table.drop_table().await;
}

/// `sslmode`: the default (`prefer`) encrypts when the server offers TLS; `require`
/// verifies the certificate, so a self-signed one is refused, permanently.
#[tokio::test]
async fn tls_follows_sslmode() {
    let table = TestTable::new("tls").await;
    let ssl_on: String = table.admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    let store = table.store();
    store.ensure_connected().await.unwrap();
    let encrypted: Option<bool> = table
        .admin
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&table.name],
        )
        .await
        .unwrap()
        .get(0);
    let url = postgres_url();
    if ssl_on == "on" && !url.contains("sslmode=disable") {
        assert_eq!(
            encrypted,
            Some(true),
            "sslmode=prefer encrypts when offered"
        );
        let sep = if url.contains('?') { '&' } else { '?' };
        let require = table.store_with(&format!("{url}{sep}sslmode=require"));
        let required = require.ensure_connected().await;
        match required {
            // A certificate from a public CA (a managed server) is fine too.
            Ok(()) => {}
            Err(Error::Store {
                retryable: false, ..
            }) => {}
            Err(other) => panic!("an untrusted certificate must be permanent: {other:?}"),
        }
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let plain = table.store_with(&format!("{url}{sep}sslmode=disable"));
    plain.get("x").await.unwrap();
    assert!(plain.root_certificates_pem(b"not a certificate").is_err());
    table.drop_table().await;
}

/// Root certificates or a TLS configuration given after the store connected apply to the
/// next connection: the connection made under `prefer` (unverified) is not kept, so the
/// certificate check the caller asked for runs.
#[tokio::test]
async fn tls_settings_given_after_the_first_connection_apply_to_the_next_one() {
    let table = TestTable::new("late_tls").await;
    // A configuration that trusts nothing: no server, with TLS or without, passes it.
    let trusts_nothing = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let store = table.store();
    store.ensure_connected().await.unwrap();
    let store = store.tls(trusts_nothing);
    let after = store.get("k").await;
    assert!(
        matches!(
            after,
            Err(Error::Store {
                retryable: false,
                ..
            })
        ),
        "a TLS configuration that trusts no server must refuse the next call, got {after:?}"
    );

    // Roots: the connection is new (a certificate from a public CA may pass).
    let store = table.store();
    let before = store.backend_pid().await.unwrap();
    let pem = std::fs::read(
        [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/cert.pem",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("a CA bundle on this machine"),
    )
    .unwrap();
    let store = store.root_certificates_pem(&pem).unwrap();
    match store.backend_pid().await {
        Ok(after) => assert_ne!(before, after, "the unverified connection was kept"),
        Err(err) => assert!(!err.is_retryable(), "{err:?}"),
    }
    table.drop_table().await;
}

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

/// `sslmode=prefer` (the default) with root certificates given is `require`: a server (or
/// a man in the middle) that declines TLS is refused before the password goes out.
#[tokio::test]
async fn prefer_with_roots_never_falls_back_to_plaintext() {
    let (addr, password) = downgrading_server().await;
    // No sslmode: prefer, the documented default; the RDS bundle given as in the README.
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

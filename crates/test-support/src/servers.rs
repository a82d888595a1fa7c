//! Where the test servers are, as `scripts/test` leaves them: `REDIS_TEST_URL` (default
//! the local 127.0.0.1:6379), `REDIS_CLUSTER_TEST_URLS`, `POSTGRES_TEST_URL` (default the
//! local 127.0.0.1:5432, database `test`) and the run's own Redis key prefix and
//! PostgreSQL schema. A missing server fails the test and says what to start ([`HOW`]).

/// What to do when a server is missing.
pub const HOW: &str = "run scripts/test, which finds or starts every test server, or set \
    DYNAMODB_TEST_ENDPOINT, REDIS_TEST_URL, REDIS_CLUSTER_TEST_URLS and POSTGRES_TEST_URL";

/// `REDIS_TEST_URL`, or the local server.
pub fn redis_url() -> String {
    std::env::var("REDIS_TEST_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `REDIS_CLUSTER_TEST_URLS`, split; panics, saying what to start, when unset.
pub fn redis_cluster_urls() -> Vec<String> {
    std::env::var("REDIS_CLUSTER_TEST_URLS")
        .unwrap_or_else(|_| panic!("REDIS_CLUSTER_TEST_URLS is not set: {HOW}"))
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// A key prefix of `test`'s own: `REDIS_TEST_PREFIX` (one per `scripts/test` run, whose
/// keys it deletes when it ends), then [`unique`]`(test)`.
pub fn redis_prefix(test: &str) -> String {
    let run = std::env::var("REDIS_TEST_PREFIX").unwrap_or_else(|_| "idem-test:".into());
    format!("{run}{}:", unique(test))
}

/// `POSTGRES_TEST_URL`, or the local server.
pub fn postgres_url() -> String {
    std::env::var("POSTGRES_TEST_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `POSTGRES_TEST_SCHEMA` (one per `scripts/test` run, dropped when it ends), or else
/// [`LOCAL_SCHEMA`], made if missing: never `public`, which other applications share.
pub fn postgres_schema() -> String {
    if let Ok(schema) = std::env::var("POSTGRES_TEST_SCHEMA") {
        return schema;
    }
    #[cfg(feature = "stores")]
    make_local_schema();
    LOCAL_SCHEMA.into()
}

/// Makes [`LOCAL_SCHEMA`] once per process, if missing.
#[cfg(feature = "stores")]
fn make_local_schema() {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        // A thread and a runtime of its own: this may be called inside a test's runtime.
        let made = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let (client, connection) =
                    tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {LOCAL_SCHEMA}"))
                    .await
            })
        });
        // A server that does not answer fails the test where it connects, saying what to run.
        let _ = made.join();
    });
}

/// The schema of a test run outside `scripts/test`; drop it when done:
/// `psql "$POSTGRES_TEST_URL" -c 'DROP SCHEMA idem_test_local CASCADE'`.
pub const LOCAL_SCHEMA: &str = "idem_test_local";

/// `test` as an identifier (every other character an underscore) and a random part: a
/// name no other test or run uses.
pub fn unique(test: &str) -> String {
    format!(
        "{}_{:012x}",
        test.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
        random() >> 16
    )
}

/// 64 random bits, from the standard library's randomly seeded hasher.
pub(crate) fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

/// The address of [`redis_url`]'s server (its user and password dropped), for a proxy in
/// front of it.
pub fn redis_addr() -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let url = redis_url();
    let hostport = url
        .trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_owned();
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("REDIS_TEST_URL {url} names no TCP address"))
}

/// A server on 127.0.0.1 that takes every connection and never says a byte: a store or
/// provider that hangs (a TLS handshake that never ends, a request never answered). It
/// lives as long as the test process; its address.
pub fn silent_listener() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    addr
}

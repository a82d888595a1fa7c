//! Every idempotency store on its test server, so one end-to-end test runs over each.
//!
//! The servers are found as `scripts/test` leaves them: `DYNAMODB_TEST_ENDPOINT`,
//! `REDIS_TEST_URL` (default the local 127.0.0.1:6379), `REDIS_CLUSTER_TEST_URLS` and
//! `POSTGRES_TEST_URL` (default the local 127.0.0.1:5432, database `test`). A missing
//! server fails the test and says what to start.

use crate::TestTable;
use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::{DynamoDbStore, MemoryStore};
use std::fmt;
use std::sync::Arc;

const HOW: &str = "run scripts/test, which finds or starts every test server, or set \
    DYNAMODB_TEST_ENDPOINT, REDIS_TEST_URL, REDIS_CLUSTER_TEST_URLS and POSTGRES_TEST_URL";

/// A store backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`MemoryStore`].
    Memory,
    /// [`DynamoDbStore`] on the local DynamoDB test server.
    DynamoDb,
    /// [`RedisStore`] on one node.
    Redis,
    /// [`RedisStore`] on the three-node test cluster.
    RedisCluster,
    /// [`PostgresStore`].
    Postgres,
}

impl Backend {
    /// Every backend.
    pub const ALL: [Backend; 5] = [
        Backend::Memory,
        Backend::DynamoDb,
        Backend::Redis,
        Backend::RedisCluster,
        Backend::Postgres,
    ];
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Memory => "memory",
            Backend::DynamoDb => "dynamodb",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis-cluster",
            Backend::Postgres => "postgres",
        })
    }
}

/// A store of a test's own: a fresh table, key prefix or schema table.
#[derive(Debug, Clone)]
pub struct TestStore {
    /// Which backend.
    pub backend: Backend,
    /// The store.
    pub store: Arc<dyn IdempotencyStore>,
    /// The DynamoDB test table, for [`Backend::DynamoDb`].
    pub table: Option<TestTable>,
    redis: Option<(RedisStore, RedisStore)>,
    postgres: Option<(PostgresStore, String)>,
}

fn unique(test: &str) -> String {
    format!(
        "{}_{:012x}",
        test.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
        fastrand::u64(..) >> 16
    )
}

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

/// `POSTGRES_TEST_URL`, or the local server.
pub fn postgres_url() -> String {
    std::env::var("POSTGRES_TEST_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn redis_prefix(test: &str) -> String {
    let run = std::env::var("REDIS_TEST_PREFIX").unwrap_or_else(|_| "idem-test:".into());
    format!("{run}{}:", unique(test))
}

impl TestStore {
    /// A fresh store of `backend` for `test`.
    pub async fn open(backend: Backend, test: &str) -> TestStore {
        let mut this = TestStore {
            backend,
            store: Arc::new(MemoryStore::new()),
            table: None,
            redis: None,
            postgres: None,
        };
        match backend {
            Backend::Memory => {}
            Backend::DynamoDb => {
                let table = TestTable::create(test).await;
                this.store = Arc::new(DynamoDbStore::new(table.client.clone(), &table.name));
                this.table = Some(table);
            }
            Backend::Redis => {
                let url = redis_url();
                let connect = || async {
                    RedisStore::connect(&url)
                        .await
                        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}; {HOW}"))
                };
                let store = connect().await.namespace(redis_prefix(test));
                this.store = Arc::new(store.clone());
                this.redis = Some((store, connect().await));
            }
            Backend::RedisCluster => {
                let urls = redis_cluster_urls();
                let store = RedisStore::connect_cluster(urls.clone())
                    .await
                    .unwrap_or_else(|e| {
                        panic!("cannot reach the Redis cluster at {urls:?}: {e}; {HOW}")
                    })
                    .namespace(redis_prefix(test));
                this.store = Arc::new(store);
            }
            Backend::Postgres => {
                let url = postgres_url();
                let schema =
                    std::env::var("POSTGRES_TEST_SCHEMA").unwrap_or_else(|_| "public".into());
                let table = format!("{schema}.idem_{}", unique(test));
                let store = PostgresStore::from_url(&url, &table)
                    .unwrap_or_else(|e| panic!("bad POSTGRES_TEST_URL {url}: {e}"));
                store
                    .create_table()
                    .await
                    .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {url}: {e}; {HOW}"));
                this.store = Arc::new(store.clone());
                this.postgres = Some((store, table));
            }
        }
        this
    }

    /// Drops the store's connections from the server's side, as a server restart, an
    /// idle timeout after a Lambda freeze, or a failover does: `CLIENT KILL` on Redis,
    /// `pg_terminate_backend` on PostgreSQL. Returns whether the backend has such a
    /// fault (memory, DynamoDB over HTTP and the cluster client, which retries, do not).
    pub async fn kill_connections(&self) -> bool {
        if let Some((store, admin)) = &self.redis {
            let id = match store.query(&redis::cmd("CLIENT").arg("ID").clone()).await {
                Ok(redis::Value::Int(id)) => id,
                // The connection is down already: nothing to kill.
                _ => return true,
            };
            admin
                .query(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id))
                .await
                .expect("CLIENT KILL from the admin connection");
            return true;
        }
        if let Some((store, _)) = &self.postgres {
            let pid = match store.backend_pid().await {
                Ok(pid) => pid,
                Err(_) => return true,
            };
            let (admin, connection) =
                tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
                    .await
                    .expect("an admin connection to PostgreSQL");
            tokio::spawn(connection);
            admin
                .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .expect("pg_terminate_backend from an admin connection");
            return true;
        }
        false
    }
}

//! Every idempotency store on its test server, so one end-to-end test runs over each:
//! [`TestStore`], and [`every_backend!`](crate::every_backend), the one way to run a test
//! over every [`Backend`].
//!
//! The servers are found as [`servers`](crate::servers) says, the DynamoDB test server at
//! `DYNAMODB_TEST_ENDPOINT`.

use crate::TestTable;
use crate::servers::{
    HOW, postgres_schema, postgres_url, redis_cluster_urls, redis_prefix, redis_url, unique,
};
use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::{DynamoDbStore, MemoryStore};
use std::fmt;
use std::sync::Arc;

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
    /// Every backend, in the order [`every_backend!`](crate::every_backend) runs them.
    pub const ALL: [Backend; 5] = [
        Backend::Memory,
        Backend::DynamoDb,
        Backend::Redis,
        Backend::RedisCluster,
        Backend::Postgres,
    ];
}

/// Runs each named test once per [`Backend`], as `<backend>::<test>`: for every `test`,
/// `async fn test(backend: Backend)` must be in scope. The one way to run a test over
/// every store: a backend added to [`Backend`] and not here fails to compile.
///
/// `every_backend!(replays)`, with `async fn replays(backend: Backend)` beside it, makes
/// the tests `memory::replays`, `dynamodb::replays`, `redis::replays`,
/// `redis_cluster::replays` and `postgres::replays`.
#[macro_export]
macro_rules! every_backend {
    ($($test:ident),* $(,)?) => {
        $crate::every_backend!(@backends [$($test),*]
            memory Memory,
            dynamodb DynamoDb,
            redis Redis,
            redis_cluster RedisCluster,
            postgres Postgres);
    };
    (@backends $tests:tt $($module:ident $variant:ident),*) => {
        // Every variant, or this match does not compile.
        const _: fn($crate::stores::Backend) = |backend| match backend {
            $($crate::stores::Backend::$variant)|* => {}
        };
        $($crate::every_backend!(@backend $module $variant $tests);)*
    };
    (@backend $module:ident $variant:ident [$($test:ident),*]) => {
        mod $module {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::stores::Backend::$variant).await
                }
            )*
        }
    };
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
    /// The in-memory store itself, for [`Backend::Memory`] (its own tables included).
    pub memory: Option<MemoryStore>,
    redis: Option<(RedisStore, RedisStore)>,
    /// The PostgreSQL store and its table, for [`Backend::Postgres`].
    pub postgres: Option<(PostgresStore, String)>,
    /// The Redis key namespace, for [`Backend::Redis`] and [`Backend::RedisCluster`].
    namespace: Option<String>,
    /// What it leaves on a shared server, removed when its last clone is dropped.
    _leftovers: Arc<Leftovers>,
}

/// What a [`TestStore`] writes on a server other runs share, removed when the test is done
/// (passed or failed): the keys under its Redis namespace (records live 15 days by
/// default), its PostgreSQL table and the `_answers` table beside it. The cluster's keys
/// go with the private cluster `scripts/test` starts.
#[derive(Debug, Default)]
struct Leftovers {
    redis_namespace: Option<String>,
    postgres_table: Option<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let (namespace, table) = (self.redis_namespace.take(), self.postgres_table.take());
        if namespace.is_none() && table.is_none() {
            return;
        }
        // A thread and a runtime of its own: the test's runtime may be the one dropping.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the clean-up");
            runtime.block_on(async move {
                if let Some(namespace) = namespace {
                    delete_redis_keys(&namespace).await;
                }
                if let Some(table) = table {
                    drop_postgres_tables(&table).await;
                }
            })
        });
        let _ = cleanup.join();
    }
}

/// Deletes every key under `namespace` on [`redis_url`]'s server (best effort).
async fn delete_redis_keys(namespace: &str) {
    let Ok(redis) = RedisStore::connect(&redis_url()).await else {
        return;
    };
    let mut cursor = "0".to_owned();
    loop {
        let scan = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg(format!("{namespace}*"))
            .arg("COUNT")
            .arg(1000)
            .clone();
        let Ok(reply) = redis.query(&scan).await else {
            return;
        };
        let Ok((next, keys)) = redis::from_redis_value::<(String, Vec<String>)>(reply) else {
            return;
        };
        if !keys.is_empty() {
            let _ = redis.query(redis::cmd("DEL").arg(&keys)).await;
        }
        if next == "0" {
            return;
        }
        cursor = next;
    }
}

/// Drops `table` and the `_answers` table a test may make beside it (best effort).
async fn drop_postgres_tables(table: &str) {
    let Ok((client, connection)) =
        tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await
    else {
        return;
    };
    tokio::spawn(connection);
    let _ = client
        .batch_execute(&format!(
            "SET lock_timeout = '5s'; DROP TABLE IF EXISTS {table}, {table}_answers"
        ))
        .await;
}

impl TestStore {
    /// A fresh store of `backend` for `test`.
    pub async fn open(backend: Backend, test: &str) -> TestStore {
        let mut this = TestStore {
            backend,
            store: Arc::new(MemoryStore::new()),
            table: None,
            memory: None,
            redis: None,
            postgres: None,
            namespace: None,
            _leftovers: Arc::new(Leftovers::default()),
        };
        let mut leftovers = Leftovers::default();
        match backend {
            Backend::Memory => {
                let store = MemoryStore::new();
                this.store = Arc::new(store.clone());
                this.memory = Some(store);
            }
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
                let namespace = redis_prefix(test);
                let store = connect().await.namespace(namespace.clone());
                leftovers.redis_namespace = Some(namespace.clone());
                this.namespace = Some(namespace);
                this.store = Arc::new(store.clone());
                this.redis = Some((store, connect().await));
            }
            Backend::RedisCluster => {
                let namespace = redis_prefix(test);
                let urls = redis_cluster_urls();
                let store = RedisStore::connect_cluster(urls.clone())
                    .await
                    .unwrap_or_else(|e| {
                        panic!("cannot reach the Redis cluster at {urls:?}: {e}; {HOW}")
                    })
                    .namespace(namespace.clone());
                this.namespace = Some(namespace);
                this.store = Arc::new(store);
            }
            Backend::Postgres => {
                let url = postgres_url();
                let table = format!("{}.idem_{}", postgres_schema(), unique(test));
                let store = PostgresStore::from_url(&url, &table)
                    .unwrap_or_else(|e| panic!("bad POSTGRES_TEST_URL {url}: {e}"));
                store
                    .create_table()
                    .await
                    .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {url}: {e}; {HOW}"));
                this.store = Arc::new(store.clone());
                leftovers.postgres_table = Some(table.clone());
                this.postgres = Some((store, table));
            }
        }
        this._leftovers = Arc::new(leftovers);
        this
    }

    /// How the `lambda-idempotency` command reaches this store: its `--store` URL and the
    /// variables it reads beside it (the worker's names). `None` for the in-memory store,
    /// which no other process can reach.
    pub fn command_line(&self) -> Option<(String, Vec<(&'static str, String)>)> {
        match self.backend {
            Backend::Memory => None,
            Backend::DynamoDb => {
                let table = self.table.as_ref()?;
                Some((
                    format!("dynamodb://{}", table.name),
                    vec![
                        ("AWS_ENDPOINT_URL_DYNAMODB", table.endpoint_url().to_owned()),
                        ("AWS_REGION", "us-east-1".into()),
                        ("AWS_ACCESS_KEY_ID", "test".into()),
                        ("AWS_SECRET_ACCESS_KEY", "test".into()),
                    ],
                ))
            }
            Backend::Redis | Backend::RedisCluster => {
                let url = match self.backend {
                    Backend::Redis => redis_url(),
                    _ => redis_cluster_urls().join(","),
                };
                let namespace = self.namespace.clone()?;
                Some((url, vec![("IDEMPOTENCY_REDIS_NAMESPACE", namespace)]))
            }
            Backend::Postgres => {
                let (_, table) = self.postgres.as_ref()?;
                Some((postgres_url(), vec![("IDEMPOTENCY_TABLE", table.clone())]))
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A test's store leaves nothing on the servers other runs share once it is dropped:
    /// neither a 15-day key under its namespace nor its table.
    #[tokio::test]
    async fn a_dropped_test_store_leaves_no_key_and_no_table() {
        let store = TestStore::open(Backend::Redis, "leftovers").await;
        let namespace = store.namespace.clone().expect("a namespace");
        let (_, admin) = store.redis.clone().expect("the admin connection");
        let key = format!("{namespace}fn.op#a key with spaces");
        admin
            .query(
                redis::cmd("SET")
                    .arg(&key)
                    .arg("v")
                    .arg("EX")
                    .arg(1_296_000),
            )
            .await
            .unwrap();
        drop(store);
        let left = admin.query(redis::cmd("EXISTS").arg(&key)).await.unwrap();
        assert_eq!(left, redis::Value::Int(0), "{key} is left");

        let store = TestStore::open(Backend::Postgres, "leftovers").await;
        let (_, table) = store.postgres.clone().expect("a table");
        drop(store);
        let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await
            .unwrap()
            .get(0);
        assert!(!exists, "{table} is left");
    }
}

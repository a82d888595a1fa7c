//! The PostgreSQL store: the whole contract (over one connection and spread over
//! several), races between connections, the table, its rows and its errors; connections,
//! ids, purging and the function's writes in their modules.
//!
//! `POSTGRES_TEST_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `POSTGRES_TEST_SCHEMA` (default `idem_test_local`, never `public`) say where; every test makes its own table.
#![cfg(feature = "postgres")]

mod connection;
mod ids;
mod purge;
mod writes;

use lambda_idempotency::clock::TestClock;
use lambda_idempotency::store::conformance;
use lambda_idempotency::store::conformance::writes::{KitWrite, WritesKit};
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::store::postgres::PostgresWrites;
use lambda_idempotency::store::{
    BoxFuture, Claim, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, Record, RecordPage,
    Status, StoreLimits, Writes, epoch_millis, epoch_secs, from_epoch_secs,
};
use lambda_idempotency::{
    Error, ExecuteError, Idempotency, KeyStrategy, Operation, Outcome, PostgresStore,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};
use test_support::servers::{HOW, postgres_schema, postgres_url, unique};
use tokio_postgres::NoTls;

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A table of its own for one test, and an admin connection beside the store's.
struct TestTable {
    /// `idem_<test>_<hex>`, also the store connections' `application_name`.
    name: String,
    /// `schema.name`, as the store is given it.
    qualified: String,
    /// Quoted for SQL.
    quoted: String,
    admin: tokio_postgres::Client,
}

impl TestTable {
    async fn new(test: &str) -> Self {
        Self::named(&format!("idem_{}", unique(test))).await
    }

    async fn named(name: &str) -> Self {
        let admin = admin().await;
        let schema = postgres_schema();
        // Concurrent tests may race to create the schema: a duplicate is fine.
        if let Err(e) = admin
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", quote(&schema)))
            .await
        {
            assert!(
                e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
                "create schema {schema}: {e}"
            );
        }
        let table = Self {
            name: name.to_owned(),
            qualified: format!("{schema}.{name}"),
            quoted: format!("{}.{}", quote(&schema), quote(name)),
            admin,
        };
        table.store().create_table().await.expect("create_table");
        table
    }

    /// A store with a connection of its own, named after the table.
    fn store(&self) -> PostgresStore {
        self.store_with(&postgres_url())
    }

    fn store_with(&self, url: &str) -> PostgresStore {
        let mut config: tokio_postgres::Config = url.parse().expect("POSTGRES_TEST_URL parses");
        config.application_name(&self.name);
        PostgresStore::from_config(config, &self.qualified).expect("store")
    }

    /// Terminates every store connection of this table, and waits until they are gone.
    async fn kill_connections(&self) {
        let killed: i64 = self
            .admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1) AS k",
                &[&self.name],
            )
            .await
            .unwrap()
            .get(0);
        assert!(killed > 0, "no store connection to kill");
        for _ in 0..100 {
            let left: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&self.name],
                )
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the store's connections outlived pg_terminate_backend");
    }

    /// The test's own table for the function's writes (`key text primary key, value
    /// text`), beside the records' table, and the conformance suite's kit over it.
    async fn writes_kit(&self) -> PgKit {
        let quoted = self.writes_quoted();
        self.admin
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {quoted} (key text PRIMARY KEY, value text)"
            ))
            .await
            .expect("create the writes table");
        PgKit {
            admin: admin().await,
            quoted,
        }
    }

    /// The writes table, quoted: `<name>_w`, in the same schema.
    fn writes_quoted(&self) -> String {
        format!(
            "{}.{}",
            quote(&postgres_schema()),
            quote(&format!("{}_w", self.name))
        )
    }

    async fn drop_table(self) {
        self.admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {}",
                self.quoted,
                self.writes_quoted()
            ))
            .await
            .expect("drop the test table");
    }
}

/// The conformance suite's writes on a table of the test's own: `Put` an upsert,
/// `PutNew` an `INSERT` without `ON CONFLICT` (a key taken is SQLSTATE 23505: refused).
struct PgKit {
    admin: tokio_postgres::Client,
    quoted: String,
}

impl PgKit {
    /// The value under `key`, if any.
    async fn read_value(&self, key: &str) -> Option<String> {
        self.read(key).await
    }
}

impl WritesKit for PgKit {
    fn writes(&self, writes: &[KitWrite]) -> Writes {
        let t = &self.quoted;
        Writes::new(
            writes
                .iter()
                .fold(PostgresWrites::new(), |w, write| match write {
                    KitWrite::Put(k, v) => w.execute(
                        format!(
                            "INSERT INTO {t} (key, value) VALUES ($1, $2) \
                             ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                        ),
                        (k.clone(), v.clone()),
                    ),
                    KitWrite::PutNew(k, v) => w.execute(
                        format!("INSERT INTO {t} (key, value) VALUES ($1, $2)"),
                        (k.clone(), v.clone()),
                    ),
                    other => panic!("a write this kit does not know: {other:?}"),
                }),
        )
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            self.admin
                .query_opt(
                    &format!("SELECT value FROM {} WHERE key = $1", self.quoted),
                    &[&key],
                )
                .await
                .expect("read the writes table")
                .map(|row| row.get(0))
        })
    }
}

async fn admin() -> tokio_postgres::Client {
    let url = postgres_url();
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e} ({e:?}); {HOW}"));
    tokio::spawn(connection);
    client
}

fn op() -> Operation {
    Operation::new("generate", KeyStrategy::field("request_id")).validate(["prompt"])
}

fn payload(id: &str) -> serde_json::Value {
    json!({"request_id": id, "prompt": "hi"})
}

/// A claim on `id` at `now` with a lease of a minute and an expiration in an hour.
fn claim(id: &str, now: SystemTime, token: &str) -> Claim {
    conformance::claim_at(id, now, Duration::from_secs(60), token)
}

/// Spreads calls round-robin over several stores (separate connections) and counts
/// `Vanished` answers, which this backend never needs.
#[derive(Debug, Clone)]
struct Spread {
    stores: Arc<Vec<PostgresStore>>,
    next: Arc<AtomicUsize>,
    vanished: Arc<AtomicUsize>,
}

impl Spread {
    fn new(table: &TestTable, n: usize) -> Self {
        Self {
            stores: Arc::new((0..n).map(|_| table.store()).collect()),
            next: Arc::default(),
            vanished: Arc::default(),
        }
    }

    fn pick(&self) -> &PostgresStore {
        &self.stores[self.next.fetch_add(1, Ordering::Relaxed) % self.stores.len()]
    }
}

impl IdempotencyStore for Spread {
    fn name(&self) -> &'static str {
        self.stores[0].name()
    }
    fn limits(&self) -> StoreLimits {
        self.stores[0].limits()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        let store = self.pick();
        Box::pin(async move {
            let outcome = store.claim(claim).await;
            if matches!(outcome, Ok(ClaimOutcome::Vanished)) {
                self.vanished.fetch_add(1, Ordering::Relaxed);
            }
            outcome
        })
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.pick().complete(claim, data, expiration)
    }
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.pick().complete_with(claim, data, expiration, writes)
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        self.pick().release(claim)
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.pick().get(id)
    }
    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        self.pick().forget(record)
    }
    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        self.pick().list(request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_whole_contract() {
    let table = TestTable::new("conformance").await;
    let kit = table.writes_kit().await;
    let store = FaultyStore::new(table.store());
    let faults = store.clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        12,
        Some(&kit),
    )
    .await;
    table.drop_table().await;
}

/// The whole contract with unnamed statements (prepared statements off, as behind a
/// pooler that cannot carry them): the server parses every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_whole_contract_without_prepared_statements() {
    let table = TestTable::new("conformance_unprepared").await;
    let kit = table.writes_kit().await;
    let store = FaultyStore::new(table.store().prepared_statements(false));
    let faults = store.clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        4,
        Some(&kit),
    )
    .await;
    table.drop_table().await;
}

/// Prepared statements live with their connection: a connection killed between two
/// requests is replaced, and the next request prepares its statement again on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_prepares_its_statements_again() {
    let table = TestTable::new("prepared_reconnect").await;
    let store = table.store();
    let idempotency = lambda_idempotency::Idempotency::new(store.clone());
    let op = lambda_idempotency::Operation::new("op", lambda_idempotency::KeyStrategy::field("id"));
    let run = |id: &'static str| {
        let (idempotency, op) = (idempotency.clone(), op.clone());
        async move {
            idempotency
                .run(&op, &serde_json::json!({"id": id}), || async {
                    Ok::<_, lambda_idempotency::Error>(id.to_owned())
                })
                .await
        }
    };
    assert_eq!(run("a").await.unwrap(), "a");
    let pid = store.backend_pid().await.unwrap();
    let (admin, connection) = tokio_postgres::connect(
        &test_support::servers::postgres_url(),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // The first request after the kill may find the connection broken (a retryable store
    // error, retried by the engine); none finds a statement the new server session lacks.
    assert_eq!(run("b").await.unwrap(), "b");
    assert_eq!(
        run("a").await.unwrap(),
        "a",
        "replayed on the new connection"
    );
    assert_ne!(store.backend_pid().await.unwrap(), pid);
    table.drop_table().await;
}

/// The whole contract again with every call on the next of several connections: the
/// claims of the concurrency case race from separate sessions, and more rounds of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_whole_contract_across_connections() {
    let table = TestTable::new("conformance_spread").await;
    let kit = table.writes_kit().await;
    let spread = Spread::new(&table, 6);
    let store = FaultyStore::new(spread.clone());
    let faults = store.clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        4,
        Some(&kit),
    )
    .await;
    for _ in 0..10 {
        conformance::concurrent_claims_have_one_winner(&spread, 24).await;
    }
    assert_eq!(spread.vanished.load(Ordering::Relaxed), 0, "no Vanished");
    table.drop_table().await;
}

/// Workers on separate connections race for fresh keys, and for keys whose record just
/// expired: exactly one runs, every other one sees its live record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_connections_race_with_exactly_one_winner() {
    let table = TestTable::new("race").await;
    let clock = TestClock::new(SystemTime::now());
    let workers: Vec<Idempotency> = (0..8)
        .map(|_| {
            let store = table.store();
            Idempotency::builder(store)
                .clock(clock.clone())
                .expires_after(Duration::from_secs(60))
                .lease(Duration::from_secs(30))
                .build()
        })
        .collect();
    for w in &workers {
        w.store().get("warm-up").await.unwrap();
    }
    let race = async |key: &str| {
        let ran = Arc::new(AtomicU32::new(0));
        let outcomes = futures_util::future::join_all(workers.iter().map(|w| {
            let ran = ran.clone();
            async move {
                w.execute(&op(), &payload(key), || async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    // Hold the lease while the others arrive.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, String>(key.to_owned())
                })
                .await
            }
        }))
        .await;
        (ran.load(Ordering::SeqCst), outcomes)
    };
    for round in 0..10 {
        let key = format!("fresh-{round}");
        let (ran, outcomes) = race(&key).await;
        assert_eq!(ran, 1, "fresh key {key}: {outcomes:?}");
        for o in &outcomes {
            assert!(
                matches!(
                    o,
                    Ok((_, Outcome::Executed | Outcome::Replayed))
                        | Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
                ),
                "fresh key {key}: {o:?}"
            );
        }
    }
    // Every record expires: each key is taken over by exactly one worker.
    clock.advance(Duration::from_secs(120));
    for round in 0..10 {
        let key = format!("fresh-{round}");
        let (ran, outcomes) = race(&key).await;
        assert_eq!(ran, 1, "expired key {key}: {outcomes:?}");
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Ok((_, Outcome::TookOver))))
                .count(),
            1,
            "expired key {key}: {outcomes:?}"
        );
    }
    table.drop_table().await;
}

/// The columns are typed as documented: seconds, milliseconds, and the result's text
/// byte for byte (not `jsonb`). Table names are quoted, so odd ones work.
#[tokio::test]
async fn the_table_holds_typed_columns_and_text_unchanged() {
    let table =
        TestTable::named(&format!("idem_Typed \"quoted\" {:016x}", fastrand::u64(..))).await;
    let store = table.store();
    let idem = Idempotency::new(store.clone());
    let (value, _) = idem
        .execute(&op(), &payload("t"), || async {
            Ok::<_, String>(json!({"b": 1, "a": [2, "x"]}))
        })
        .await
        .unwrap();
    let id = idem.idempotency_id(&op(), &payload("t")).unwrap();
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(record.data.as_deref().unwrap()).unwrap(),
        value
    );
    let row = table
        .admin
        .query_one(
            &format!(
                "SELECT status, expiration, in_progress_expiration, data, validation, lease_token \
                 FROM {} WHERE id = $1",
                table.quoted
            ),
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "COMPLETED");
    assert_eq!(
        row.get::<_, i64>(1),
        epoch_secs(record.expiration) as i64,
        "seconds"
    );
    let lease: i64 = row.get::<_, Option<i64>>(2).expect("the lease stays");
    assert!(
        lease > 1_000_000_000_000,
        "in_progress_expiration is milliseconds: {lease}"
    );
    assert_eq!(
        Some(lease as u64),
        record.in_progress_expiration.map(epoch_millis)
    );
    assert_eq!(row.get::<_, Option<String>>(3), record.data);
    assert_eq!(row.get::<_, Option<String>>(4).map(|v| v.len()), Some(64));
    assert!(row.get::<_, Option<String>>(5).is_some());

    // Text, not jsonb: what is stored is read back byte for byte.
    let raw = r#"{"b":1,  "a":2}"#;
    table
        .admin
        .execute(
            &format!(
                "INSERT INTO {} (id, status, expiration, data) VALUES ('raw', 'COMPLETED', $1, $2)",
                table.quoted
            ),
            &[&(epoch_secs(SystemTime::now()) as i64 + 600), &raw],
        )
        .await
        .unwrap();
    let stored = store.get("raw").await.unwrap().unwrap();
    assert_eq!(stored.data.as_deref(), Some(raw));
    assert_eq!(stored.in_progress_expiration, None);

    let types: Vec<(String, String, String)> = table
        .admin
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
            &[&postgres_schema(), &table.name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expect = [
        ("id", "text", "NO"),
        ("status", "text", "NO"),
        ("expiration", "bigint", "NO"),
        ("in_progress_expiration", "bigint", "YES"),
        ("data", "text", "YES"),
        ("validation", "text", "YES"),
        ("lease_token", "text", "YES"),
    ];
    let types: Vec<(&str, &str, &str)> = types
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(types, expect);
    let indexed: i64 = table
        .admin
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 \
             AND indexdef LIKE '%(expiration)%'",
            &[&postgres_schema(), &table.name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexed, 1, "an index on expiration");
    let weird = table
        .admin
        .execute(
            &format!(
                "INSERT INTO {} (id, status, expiration) VALUES ('w', 'WEIRD', 1)",
                table.quoted
            ),
            &[],
        )
        .await;
    assert_eq!(
        weird.unwrap_err().code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
        "the status is checked"
    );
    // create_table is idempotent.
    store.create_table().await.unwrap();
    table.drop_table().await;
}

#[tokio::test]
async fn a_missing_table_is_a_clear_permanent_error() {
    let admin = admin().await;
    drop(admin);
    let name = format!(
        "{}.idem_missing_{:016x}",
        postgres_schema(),
        fastrand::u64(..)
    );
    let store = PostgresStore::from_url(&postgres_url(), &name).unwrap();
    let err = store.get("x").await.unwrap_err();
    let message = lambda_idempotency::report(&err);
    assert!(
        matches!(
            err,
            Error::Store {
                backend: "postgres",
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        message.contains(&name) && message.contains("create_table"),
        "{message}"
    );
    let mut source = std::error::Error::source(&err);
    let mut found = false;
    while let Some(s) = source {
        if let Some(pg) = s.downcast_ref::<tokio_postgres::Error>() {
            assert_eq!(
                pg.code(),
                Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
            );
            found = true;
        }
        source = s.source();
    }
    assert!(found, "the tokio_postgres::Error is in the chain: {err:?}");
}

/// The start-up check (`check_table`, and `connect`, which calls it): a table that cannot
/// hold the records (missing, a column missing, of another type, NOT NULL where the store
/// writes NULL, `id` without a unique index of its own, a view) fails it, not retryable,
/// naming the table, every problem and the DDL that fixes it; the table `create_table`
/// makes passes, and so does one made before with the database's collation.
#[tokio::test]
async fn the_start_up_check_refuses_a_table_that_cannot_hold_the_records() {
    let good = TestTable::new("check_good").await;
    good.store()
        .check_table()
        .await
        .expect("create_table's table passes");
    PostgresStore::connect(&postgres_url(), &good.qualified)
        .await
        .expect("connect checks it");
    good.drop_table().await;

    let schema = quote(&postgres_schema());
    let full = "id text PRIMARY KEY, status text NOT NULL, expiration bigint NOT NULL, \
                in_progress_expiration bigint, data text, validation text, lease_token text";
    for (what, ddl, says) in [
        ("missing", None, vec!["does not exist"]),
        // A table made before the DDL sorted ids by bytes, or with varchar: it works.
        (
            "collated",
            Some(full.replace("id text", "id text COLLATE \"en_US\"")),
            vec![],
        ),
        (
            "varchar",
            Some(full.replace("data text", "data varchar")),
            vec![],
        ),
        (
            "no_column",
            Some(full.replace(", lease_token text", "")),
            vec!["no column lease_token"],
        ),
        (
            "int_column",
            Some(full.replace("expiration bigint NOT NULL", "expiration integer NOT NULL")),
            vec!["its column expiration is integer, not bigint"],
        ),
        (
            "two_problems",
            Some(
                full.replace("data text", "data jsonb")
                    .replace("validation text", "validation text NOT NULL"),
            ),
            vec![
                "its column data is jsonb, not text",
                "its column validation is NOT NULL",
            ],
        ),
        (
            "no_key",
            Some(full.replace("id text PRIMARY KEY", "id text")),
            vec!["no primary key or unique index is on id alone"],
        ),
    ] {
        let name = format!("idem_check_{what}_{:08x}", fastrand::u32(..));
        let qualified = format!("{}.{name}", postgres_schema());
        let admin = admin().await;
        if let Some(ddl) = &ddl {
            let ddl = ddl.replace(
                "COLLATE \"en_US\"",
                &format!("COLLATE {}", any_other_collation(&admin).await),
            );
            admin
                .batch_execute(&format!("CREATE TABLE {schema}.{} ({ddl})", quote(&name)))
                .await
                .unwrap();
        }
        let store = PostgresStore::from_url(&postgres_url(), &qualified).unwrap();
        let checked = store.check_table().await;
        let connected = PostgresStore::connect(&postgres_url(), &qualified).await;
        if says.is_empty() {
            assert!(
                checked.is_ok() && connected.is_ok(),
                "{what}: {checked:?} {connected:?}"
            );
        } else {
            for err in [checked.unwrap_err(), connected.unwrap_err()] {
                assert!(
                    matches!(
                        err,
                        Error::Store {
                            backend: "postgres",
                            retryable: false,
                            ..
                        }
                    ),
                    "{what}: {err:?}"
                );
                let message = lambda_idempotency::report(&err);
                for said in &says {
                    assert!(message.contains(said), "{what}: {said}: {message}");
                }
                assert!(
                    message.contains(&format!("{qualified:?}")),
                    "{what}: {message}"
                );
                assert!(
                    message.contains("PostgresStore::create_table")
                        && message.contains(&store.create_table_sql()),
                    "{what}: the fix: {message}"
                );
            }
        }
        admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {schema}.{}", quote(&name)))
            .await
            .unwrap();
    }

    // A view over a good table is no table for the claim's ON CONFLICT.
    let table = TestTable::new("check_view").await;
    let view = format!("{}_v", table.name);
    table
        .admin
        .batch_execute(&format!(
            "CREATE VIEW {schema}.{} AS SELECT * FROM {}",
            quote(&view),
            table.quoted
        ))
        .await
        .unwrap();
    let store =
        PostgresStore::from_url(&postgres_url(), format!("{}.{view}", postgres_schema())).unwrap();
    let message = lambda_idempotency::report(&store.check_table().await.unwrap_err());
    assert!(message.contains("it is not a table"), "{message}");
    table
        .admin
        .batch_execute(&format!("DROP VIEW {schema}.{}", quote(&view)))
        .await
        .unwrap();
    table.drop_table().await;
}

/// How many rows of `table` the server has read so far (sequential and index scans), once
/// `store`'s connection reported its statements: a session reports them when a statement
/// ends a second or more after its last report, so the store reads a missing id (which
/// reads no row) after a second, until the count moves past `after`.
async fn rows_read(
    admin: &tokio_postgres::Client,
    store: &PostgresStore,
    table: &str,
    after: i64,
) -> i64 {
    let read = async || -> i64 {
        admin
            .query_one(
                "SELECT (coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::bigint \
                 FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
                &[&table],
            )
            .await
            .unwrap()
            .get(0)
    };
    if after < 0 {
        // Every session's earlier statements (the admin's inserts) reported first.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        admin.batch_execute("SELECT 1").await.unwrap();
        store.get("stats.report#nothing").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        return read().await;
    }
    let mut now = read().await;
    for _ in 0..10 {
        if now > after {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        store.get("stats.report#nothing").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = read().await;
    }
    now
}

/// On a table of 20 000 rows, a page of 10 under a prefix reads about 10 rows, wherever the
/// prefix falls, and `examined` says how many it read (the server's own count agrees); a
/// listing's pages find every record under the prefix and none other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_reads_rows_in_proportion_to_the_page_on_a_big_table() {
    let table = TestTable::new("list_big").await;
    let q = &table.quoted;
    table
        .admin
        .batch_execute(&format!(
            "INSERT INTO {q} (id, status, expiration) \
               SELECT 'a.other#' || g, 'COMPLETED', 4000000000 FROM generate_series(1, 10000) g; \
             INSERT INTO {q} (id, status, expiration) \
               SELECT 'f.mine#' || lpad(g::text, 3, '0'), 'COMPLETED', 4000000000 FROM generate_series(1, 25) g; \
             INSERT INTO {q} (id, status, expiration) \
               SELECT 'f.mine' || g, 'COMPLETED', 4000000000 FROM generate_series(1, 2000) g; \
             INSERT INTO {q} (id, status, expiration) \
               SELECT 'z.other#' || g, 'COMPLETED', 4000000000 FROM generate_series(1, 7975) g; \
             ANALYZE {q}"
        ))
        .await
        .unwrap();
    let store = table.store();
    store.check_table().await.unwrap();
    let before = rows_read(&table.admin, &store, q, -1).await;
    let page = store.list(&ListRequest::new("f.mine#", 10)).await.unwrap();
    assert_eq!(page.records.len(), 10, "{page:?}");
    assert!(page.next.is_some());
    assert!((10..=21).contains(&page.examined), "{}", page.examined);
    let read = rows_read(&table.admin, &store, q, before).await - before;
    // Planning a range reads the index's two ends (`get_actual_variable_range`): two rows.
    assert!(
        read <= page.examined as i64 + 2,
        "the page read {read} rows of the table and said it examined {}",
        page.examined
    );

    // Page after page (a prepared statement's plan turns generic after five), 3 at a time.
    let before = before + read;
    let (mut found, mut examined, mut pages) = (Vec::new(), 0, 0);
    let mut request = ListRequest::new("f.mine#", 3);
    loop {
        let page = store.list(&request).await.unwrap();
        pages += 1;
        examined += page.examined;
        assert!(page.examined <= 7, "{}", page.examined);
        found.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            None => break,
            next => request = request.after(next),
        }
    }
    let expected: Vec<String> = (1..=25).map(|g| format!("f.mine#{g:03}")).collect();
    assert_eq!(found, expected);
    assert!(
        pages <= 9 && examined <= 35,
        "{pages} pages, {examined} examined"
    );
    let read = rows_read(&table.admin, &store, q, before).await - before;
    assert!(
        read <= (examined + 2 * pages) as i64,
        "{pages} pages read {read} rows of the table and said they examined {examined}"
    );
    table.drop_table().await;
}

/// A table made before the DDL sorted ids by bytes (a language's collation) is listed
/// correctly, and still a bounded page at a time: its rows in order, at most a page's
/// worth per request, the ones under the prefix kept (pages may come back empty, with more
/// to come); `examined` counts every row read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_not_sorted_by_bytes_is_listed_a_bounded_page_at_a_time() {
    let table = TestTable::new("list_collated").await;
    let q = &table.quoted;
    let collation = any_other_collation(&table.admin).await;
    table
        .admin
        .batch_execute(&format!(
            "DROP TABLE {q}; CREATE TABLE {q} (id text COLLATE {collation} PRIMARY KEY, \
             status text NOT NULL, expiration bigint NOT NULL, in_progress_expiration bigint, \
             data text, validation text, lease_token text); \
             INSERT INTO {q} (id, status, expiration) \
               SELECT 'f-mine#' || g, 'COMPLETED', 4000000000 FROM generate_series(1, 150) g; \
             INSERT INTO {q} (id, status, expiration) \
               SELECT 'fmine#' || g, 'COMPLETED', 4000000000 FROM generate_series(1, 150) g"
        ))
        .await
        .unwrap();
    let store = table.store();
    let now = SystemTime::now();
    for id in ["f-mine#a", "f-mine#nul\u{0}", "fmine#b"] {
        store.claim(&claim(id, now, "t")).await.unwrap();
    }
    let (mut found, mut examined, mut pages) = (Vec::new(), 0, 0);
    let mut request = ListRequest::new("f-mine#", 10);
    loop {
        let page = store.list(&request).await.unwrap();
        // A page's rows, and the cursor's own row, passed over.
        assert!(page.examined <= 11 && page.records.len() <= 10, "{page:?}");
        examined += page.examined;
        pages += 1;
        found.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            None => break,
            next => request = request.after(next),
        }
    }
    assert!(
        (303..303 + pages).contains(&examined),
        "every row read once, and each page's cursor: {examined} in {pages} pages"
    );
    found.sort();
    let mut expected: Vec<String> = (1..=150).map(|g| format!("f-mine#{g}")).collect();
    expected.extend(["f-mine#a".to_owned(), "f-mine#nul\u{0}".to_owned()]);
    expected.sort();
    assert_eq!(found, expected);
    table.drop_table().await;
}

/// A collation of the server's that does not sort by bytes, quoted: a table made before
/// the DDL said `COLLATE "C"`, in a database whose default is a language's.
async fn any_other_collation(admin: &tokio_postgres::Client) -> String {
    let row = admin
        .query_one(
            "SELECT collname FROM pg_collation WHERE collprovider IN ('c', 'i') \
             AND collname NOT IN ('C', 'POSIX', 'ucs_basic', 'default') \
             AND collencoding IN (-1, (SELECT encoding FROM pg_database WHERE datname = current_database())) \
             ORDER BY collname = 'en_US' DESC, collname LIMIT 1",
            &[],
        )
        .await
        .expect("a language's collation");
    quote(row.get::<_, &str>(0))
}

#[tokio::test]
async fn errors_keep_the_driver_error_and_say_whether_to_retry() {
    // Nothing listens on port 1: refused, retryable, the driver's error in the chain, the
    // server named (host and port) and the password never, however the URL gives it.
    for url in [
        "postgres://postgres:pw-hunter2@127.0.0.1:1/test",
        "postgres://127.0.0.1:1/test?user=postgres&password=pw-hunter2",
        "host=127.0.0.1 port=1 user=postgres password=pw-hunter2 dbname=test",
    ] {
        let store = PostgresStore::from_url(url, "t").unwrap();
        let get = store.get("x").await.unwrap_err();
        let connect = store.ensure_connected().await.unwrap_err();
        let connected = PostgresStore::connect(url, "t").await.unwrap_err();
        for err in [get, connect, connected] {
            match &err {
                Error::Store {
                    backend: "postgres",
                    retryable: true,
                    ..
                } => {}
                other => panic!("{url}: {other:?}"),
            }
            let mut source = std::error::Error::source(&err);
            let mut found = false;
            while let Some(s) = source {
                found |= s.downcast_ref::<tokio_postgres::Error>().is_some();
                source = s.source();
            }
            assert!(found, "{url}: the driver's error is in the chain: {err:?}");
            let text = lambda_idempotency::report(&err);
            assert!(text.contains("127.0.0.1:1"), "{url}: {text}");
            for shown in [text, format!("{err:?}")] {
                assert!(!shown.contains("hunter2"), "{url}: {shown}");
                assert!(!shown.contains("postgres:pw"), "{url}: {shown}");
            }
        }
    }
    // A malformed URL: permanent.
    assert!(matches!(
        PostgresStore::from_url("postgres://u@h:port/db", "t"),
        Err(Error::Store {
            retryable: false,
            ..
        })
    ));
    // A SQL error from the server: the driver's error, with its code.
    let table = TestTable::new("errors").await;
    let store = table.store();
    let err = store.get(&"x".repeat(3000)).await.map(|_| ());
    assert!(
        err.is_ok(),
        "a long id is only refused by the engine: {err:?}"
    );
    table
        .admin
        .batch_execute(&format!(
            "ALTER TABLE {} ALTER COLUMN expiration TYPE integer",
            table.quoted
        ))
        .await
        .unwrap();
    table
        .admin
        .execute(
            &format!(
                "INSERT INTO {} (id, status, expiration) VALUES ('small', 'COMPLETED', 1)",
                table.quoted
            ),
            &[],
        )
        .await
        .unwrap();
    let err = store.get("small").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store {
                retryable: false,
                ..
            }
        ),
        "a column of the wrong type: {err:?}"
    );
    table.drop_table().await;
}

/// Rows this store did not write: a negative number is a clean permanent error, never a
/// panic, and a claim may still take such a row over; huge numbers are capped.
#[tokio::test]
async fn malformed_rows_are_clean_errors() {
    let table = TestTable::new("malformed").await;
    let store = table.store();
    let insert = async |id: &str, status: &str, exp: i64, lease: Option<i64>| {
        table
            .admin
            .execute(
                &format!(
                    "INSERT INTO {} (id, status, expiration, in_progress_expiration) \
                     VALUES ($1, $2, $3, $4)",
                    table.quoted
                ),
                &[&id, &status, &exp, &lease],
            )
            .await
            .unwrap();
    };
    insert("negative-exp", "COMPLETED", -5, None).await;
    insert("negative-lease", "INPROGRESS", 4_000_000_000, Some(-1)).await;
    insert("huge", "COMPLETED", i64::MAX, Some(i64::MAX)).await;
    for id in ["negative-exp", "negative-lease"] {
        let err = store.get(id).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Store {
                    backend: "postgres",
                    retryable: false,
                    ..
                }
            ),
            "{id}: {err:?}"
        );
        let chain = lambda_idempotency::report(&err);
        assert!(chain.contains("malformed"), "{chain}");
    }
    let huge = store.get("huge").await.unwrap().unwrap();
    assert_eq!(huge.expiration, from_epoch_secs(u64::MAX), "capped");
    // Through the engine: both rows are claimable by their numbers and taken over.
    let idem = Idempotency::builder(store.clone())
        .function_name("f")
        .build();
    let op = Operation::new("o", KeyStrategy::field("id"));
    for key in ["a", "b"] {
        let id = idem.idempotency_id(&op, &json!({"id": key})).unwrap();
        insert(&id, "COMPLETED", -5, None).await;
        let (_, outcome) = idem
            .execute(&op, &json!({"id": key}), || async { Ok::<_, String>(1) })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Executed,
            "previous unreadable: not reported"
        );
        assert_eq!(
            store.get(&id).await.unwrap().unwrap().status,
            Status::Completed
        );
    }
    table.drop_table().await;
}

#[test]
fn name_and_limits() {
    let store = PostgresStore::from_url("postgres://u@h/db", "s.t").unwrap();
    assert_eq!(store.name(), "postgres");
    assert_eq!(store.limits(), StoreLimits::DYNAMODB);
    assert_eq!(store.table(), "s.t");
    assert!(
        store
            .create_table_sql()
            .contains("CREATE TABLE IF NOT EXISTS \"s\".\"t\"")
    );
    assert!(store.claim_sql().contains("ON CONFLICT (id) DO UPDATE"));
    assert!(!format!("{store:?}").contains("password"));
}

/// The race the claim statement must get right: the conflicting row is committed after
/// the statement's snapshot was taken (the claim waits on the inserting transaction).
/// A live row is answered as the live record (never made up, never `Vanished`); a
/// claimable one is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_the_claims_snapshot_is_answered_exactly() {
    let table = TestTable::new("snapshot").await;
    let spread = Spread::new(&table, 1);
    let idem = Idempotency::builder(spread.clone())
        .function_name("f")
        .lease(Duration::from_secs(30))
        .store_attempt_timeout(Duration::from_secs(10))
        .build();
    let op = Operation::new("o", KeyStrategy::field("id"));
    let other = admin().await;
    let now = SystemTime::now();
    let (s, ms) = (epoch_secs(now) as i64, epoch_millis(now) as i64);
    for (key, status, exp, lease, data) in [
        // Another worker's live claim.
        ("live", "INPROGRESS", s + 600, Some(ms + 60_000), None),
        // A completed record.
        ("done", "COMPLETED", s + 600, None, Some("\"theirs\"")),
        // An expired record: claimable.
        ("expired", "COMPLETED", s - 60, None, Some("\"old\"")),
    ] {
        let payload = json!({"id": key});
        let id = idem.idempotency_id(&op, &payload).unwrap();
        other.batch_execute("BEGIN").await.unwrap();
        other
            .execute(
                &format!(
                    "INSERT INTO {} (id, status, expiration, in_progress_expiration, data, lease_token) \
                     VALUES ($1, $2, $3, $4, $5, 'their-token')",
                    table.quoted
                ),
                &[&id, &status, &exp, &lease, &data],
            )
            .await
            .unwrap();
        let ran = AtomicU32::new(0);
        let claim = idem.execute(&op, &payload, || async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("mine".to_string())
        });
        let commit = async {
            // Wait until the claim is blocked on the inserting transaction, then commit.
            for _ in 0..200 {
                let waiting: i64 = table
                    .admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                         AND wait_event_type = 'Lock'",
                        &[&table.name],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if waiting > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other.batch_execute("COMMIT").await.unwrap();
        };
        let (result, ()) = tokio::join!(claim, commit);
        let ran = ran.load(Ordering::SeqCst);
        match key {
            "live" => {
                assert!(
                    matches!(
                        result,
                        Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. }))
                    ),
                    "{key}: {result:?}"
                );
                assert_eq!(ran, 0);
            }
            "done" => {
                assert_eq!(result.unwrap(), ("theirs".into(), Outcome::Replayed));
                assert_eq!(ran, 0);
            }
            _ => {
                assert_eq!(result.unwrap().0, "mine");
                assert_eq!(ran, 1);
            }
        }
        let record = spread.get(&id).await.unwrap().unwrap();
        if key == "live" {
            assert_eq!(record.lease_token.as_deref(), Some("their-token"));
            assert_eq!(
                record.in_progress_expiration.map(epoch_millis),
                lease.map(|l| l as u64)
            );
        }
    }
    assert_eq!(spread.vanished.load(Ordering::Relaxed), 0);
    table.drop_table().await;
}

/// PostgreSQL cuts identifiers at 63 bytes: two stores whose long table names differ only
/// after that would share one table and answer each other's claims. Such a name is refused
/// when the store is made (a configuration mistake fails at start-up); 63 bytes is fine and
/// names the table exactly.
#[tokio::test]
async fn table_and_schema_names_over_63_bytes_are_refused() {
    let long = "t".repeat(64);
    for name in [
        long.clone(),
        format!("{long}.idempotency"),
        format!("public.{long}"),
        // 64 bytes in 32 characters.
        format!("public.{}", "é".repeat(32)),
    ] {
        match PostgresStore::from_url(&postgres_url(), &name) {
            Err(Error::InvalidName {
                what: "table name",
                reason: text,
                ..
            }) => {
                assert!(
                    text.contains("63 bytes") && text.contains("64"),
                    "{name}: the error says what is wrong: {text}"
                );
            }
            other => panic!("{name:?} must be refused, got {other:?}"),
        }
    }
    // Exactly 63 bytes: accepted, and the table has exactly that name.
    let name = format!("idem_{:016x}_{}", fastrand::u64(..), "n".repeat(63 - 22));
    assert_eq!(name.len(), 63);
    let table = TestTable::named(&name).await;
    let found: i64 = table
        .admin
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2",
            &[&postgres_schema(), &name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(found, 1);
    table.drop_table().await;
}

/// The longest request timeout, `Duration::MAX`, bounds nothing and overflows nothing: a
/// call runs and its duplicate is answered.
#[tokio::test]
async fn the_longest_request_timeout_works() {
    let table = TestTable::new("max_timeout").await;
    let store = table.store().request_timeout(Duration::MAX);
    let idem = Idempotency::builder(store)
        .store_attempt_timeout(Duration::MAX)
        .build();
    for expected in [Outcome::Executed, Outcome::Replayed] {
        let (_, outcome) = idem
            .execute(&op(), &payload("max"), || async { Ok::<_, String>(1) })
            .await
            .unwrap();
        assert_eq!(outcome, expected);
    }
    table.drop_table().await;
}

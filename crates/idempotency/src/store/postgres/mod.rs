//! The PostgreSQL store.
//!
//! # Table
//! One row per record, typed columns, the status checked by the table:
//!
#![doc = concat!("```sql\n", table::ddl!("idempotency", "idempotency_expiration_idx"), "```")]
//!
//! [`PostgresStore::create_table`] runs this DDL (for tests and first runs), and
//! [`PostgresStore::check_table`] checks a table against it at start-up. `data` is
//! `text`, not `jsonb`: `jsonb` rewrites the JSON (key order, spaces). `id` sorts by
//! bytes (`COLLATE "C"`), so a listing under a prefix reads a range of the primary key;
//! a table made before with the database's collation still works, and lists by reading
//! its rows in order, a page at a time (`ALTER TABLE idempotency ALTER COLUMN id TYPE
//! text COLLATE "C"` makes it a range; it rewrites the table). The table name may
//! be schema-qualified (`schema.table`, split at the first dot); each part is quoted as
//! given, so it is case-sensitive.
//!
//! # Protocol
//! Each call is one statement in one round trip. By default each statement is prepared
//! once per connection, as a named statement (its first use costs one more round trip),
//! and then executed by name; with
//! [`prepared_statements(false)`](PostgresStore::prepared_statements) each call is an
//! unnamed statement with its parameter types given, which nothing keeps in the session.
//! 1. **Claim**: one `INSERT … ON CONFLICT (id) DO UPDATE … WHERE` the stored row is
//!    claimable ([`Record::is_claimable_by`]), beside a `SELECT … FOR UPDATE` of the
//!    current row in the same statement, so a duplicate learns the live record from the
//!    same round trip (see [below](#why-the-claim-is-exact-under-races) for why it is exact under races).
//! 2. **Complete**: `UPDATE … WHERE id = $1 AND lease_token = $2`.
//! 3. **Release**: `DELETE … WHERE id = $1 AND lease_token = $2`.
//!
//! A first delivery costs two round trips; a duplicate costs one.
//!
//! # The function's writes
//! [`complete_with`](IdempotencyStore::complete_with) with [`PostgresWrites`] is one
//! transaction: `BEGIN` with `SET LOCAL lock_timeout` and
//! `idle_in_transaction_session_timeout` (the request timeout, set in every transaction in
//! the same round trip, so nothing an earlier one ran weakens them); `SELECT status, lease_token … WHERE id = $1 FOR UPDATE` (no row
//! or another token: `ROLLBACK`, [`Error::LeaseLost`]; completed with our token, an
//! earlier attempt whose answer was lost: `ROLLBACK`, success, nothing run again); the
//! function's statements in order (an integrity constraint broken, SQLSTATE class `23`, or
//! a row count other than [`execute_expecting`](PostgresWrites::execute_expecting)'s:
//! `ROLLBACK`, [`Error::WritesRefused`]); the completion's `UPDATE`; `COMMIT`. Four round
//! trips and one per statement (and one per statement's first use on the connection,
//! which prepares it).
//!
//! It runs on a second connection of the store's, not the shared one (whose concurrent
//! requests would land inside the transaction): opened on first use with the same
//! configuration and TLS, used by one transaction at a time (concurrent completions with
//! writes wait in turn), and the whole transaction, that wait included, bounded by the
//! request timeout. A transaction cut off (by that bound or the engine's attempt timeout)
//! asks the server to cancel its statement and drops its connection: the server rolls it
//! back and frees the record's row lock at once. A `COMMIT` whose answer was lost is
//! resolved by the retry, under the record's lock.
//!
//! # Expired rows
//! PostgreSQL has no TTL. Expired rows stay claimable, so correctness never depends on
//! deleting them; to keep the table small, call [`PostgresStore::purge_expired`] on a
//! schedule (an EventBridge-scheduled Lambda), or run the same `DELETE` with `pg_cron`.
//!
//! # Connection
//! One connection per store (per Lambda execution environment; a second one for the
//! transactions of [completions with writes](#the-functions-writes)), made on first use,
//! reused across invocations and rebuilt on the next call after it broke (closed,
//! an I/O error, a server shutdown) or after a call was cut off by the engine's attempt
//! timeout. The only session state the store uses is its named prepared statements, so
//! behind a pooler in transaction mode, where the next transaction may run on another
//! server connection, turn them off with
//! [`prepared_statements(false)`](PostgresStore::prepared_statements): PgBouncer before
//! 1.21 or without `max_prepared_statements` (otherwise: `prepared statement "sN" does
//! not exist`), and RDS Proxy (otherwise a prepare pins the client to one database
//! connection). A direct connection, PgBouncer in session mode, or PgBouncer 1.21+ with
//! `max_prepared_statements` keep the default. A statement the session lost anyway (a
//! pooler's `DISCARD ALL`) is a retryable error; the retry prepares it again.
//!
//! A connect (TCP, TLS negotiation and start-up together) is bounded by the URL's
//! `connect_timeout` (5 s when it sets none; once per host when it names several), and
//! every request by the store's request timeout ([`DEFAULT_REQUEST_TIMEOUT`], 5 s,
//! [`request_timeout`](PostgresStore::request_timeout)), so a call made outside
//! the engine (`get` in a health check, `purge_expired`, `create_table`, the start-up's
//! `check_table`) never waits forever on a server that stopped
//! answering; inside the engine, its attempt timeout (2 s by default) is the bound that
//! counts, and the store sets no timer of its own when that bound is the shorter (one
//! timer per request). A request cut off by either bound drops its connection; the next
//! call reconnects.
//!
//! A call cut off while the server still works on it (waiting for a row lock another
//! session holds) leaves that server process working until it next writes to the gone
//! client, while the store opens a new connection. Bound statements on the server side
//! too, so cut-off calls cannot pile up towards `max_connections`: add
//! `options=-c%20statement_timeout%3D5000` to the URL (or `ALTER ROLE … SET
//! statement_timeout`), a little above the engine's attempt timeout.
//!
//! # TLS
//! From the URL's `sslmode`: `disable` connects without TLS; `require` uses TLS and
//! verifies the server certificate against the system's roots and the ones given with
//! [`root_certificates_pem`](PostgresStore::root_certificates_pem) (RDS's CA
//! bundle is not among the public roots); `prefer` (the default) uses TLS when the server
//! offers it, without verifying the certificate as libpq does, unless roots or a TLS
//! configuration were given: then it is `require`, TLS mandatory and the certificate
//! checked (a server that declines TLS is refused, never given a plaintext session). TLS
//! is rustls with the aws-lc-rs provider, set explicitly (no process-wide default is
//! needed). tokio-postgres reads no `verify-ca`/`verify-full`: use `require`, which checks
//! the certificate and the host name (so connect by the name the certificate holds).
//!
//! # Errors
//! [`Error::Store`] with backend `"postgres"`. Retryable: connection loss, I/O errors and
//! timeouts, SQLSTATE class `08`, `40001`, `40P01`, `55P03`, `57014`, `57P01`–`57P03`,
//! `57P05` (the server ended an idle session: `idle_session_timeout`), `53300`, `25006` (a
//! writer that became a reader after a failover), and a connect or request that timed
//! out. The boxed source is the [`tokio_postgres::Error`], except for a missing table (a
//! message naming the table, whose `source()` is the `tokio_postgres::Error`), a timeout
//! (a message naming the server and the bound) and a malformed row (a message).
//!
//! # Names
//! A table or schema name longer than 63 bytes is refused when the store is made
//! (PostgreSQL would cut it, and two stores with long names differing after the 63rd byte
//! would share one table).
//!
//! # Limits
//! PostgreSQL's `text` holds up to 1 GB, but a result is read back on every duplicate:
//! the limits are DynamoDB's ([`StoreLimits::DYNAMODB`]), 2048-byte ids and 400 KB
//! records, so a function moved between stores fails alike.
//!
//! # Why the claim is exact under races
//! READ COMMITTED, each call its own transaction:
//! - `old` reads the row with `FOR UPDATE`: if the row is in the statement's snapshot,
//!   the lock waits for any writer and returns its latest version, locked, so the
//!   upsert (sequenced after `old` by `FROM (SELECT count(*) FROM old)`) evaluates the
//!   claim's condition against exactly that version. `old` is then the claimed-over
//!   record (`previous`) or the live one (`Exists`); a duplicate changes no row (its
//!   row lock is all it writes).
//! - A row committed after the snapshot is invisible to `old` but not to
//!   `ON CONFLICT`, which always sees and locks the latest row. Then (`old` empty) the
//!   update always applies, writing the claim if the row is claimable and the row
//!   unchanged otherwise (each column `CASE`d on the same condition), so `RETURNING`
//!   shows the live record: never a made-up one, never a retry.
//! - The upsert's row is this claim's exactly when it is in progress with the claim's
//!   token: tokens are unique per claim.

mod connection;
mod error;
mod id;
mod purge;
mod requests;
mod row;
mod sql;
mod table;
mod tls;
mod transaction;
mod writes;

pub use purge::PURGE_GRACE;
pub use writes::{Param, Params, PostgresWrites};

use super::{
    BoxFuture, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, RecordPage, StoreLimits,
    Writes,
};
use crate::error::Error;
use crate::record::{Claim, Record};
use connection::DEFAULT_CONNECT_TIMEOUT;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sql::Statements;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use table::Table;
use tls::{Tls, require_tls};
use tokio_postgres::Client;

const BACKEND: &str = "postgres";

/// The longest a request may wait for its answer by default, so a call made outside the
/// engine (a health check's `get`, `purge_expired`, `create_table`) never waits forever on
/// a server that stopped answering. Above the engine's attempt timeout (2 s by default),
/// which is the bound that normally counts.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An [`IdempotencyStore`] on a PostgreSQL table. Cloning shares the connection.
///
/// ```no_run
/// # async fn f() -> Result<(), lambda_idempotency::Error> {
/// use lambda_idempotency::{Idempotency, PostgresStore};
/// let url = std::env::var("DATABASE_URL").unwrap(); // postgres://user:pw@host/db?sslmode=require
/// // RDS: its CA bundle, from https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem
/// let rds_ca = std::fs::read("global-bundle.pem").unwrap();
/// let store = PostgresStore::from_url(&url, "idempotency")?.root_certificates_pem(&rds_ca)?;
/// store.check_table().await?; // fail at init, not on the first message: URL, password, table
/// let idempotency = Idempotency::new(store);
/// # let _ = idempotency;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    request_timeout: Duration,
    /// Whether statements are prepared once per connection (see
    /// [`prepared_statements`](Self::prepared_statements)).
    prepared: bool,
}

struct Inner {
    config: tokio_postgres::Config,
    tls: Tls,
    table: Table,
    sql: Statements,
    /// The live connection, if any. A plain mutex: held only to copy or swap the `Arc`.
    client: Mutex<Option<Arc<Client>>>,
    /// Serialises connects, so concurrent calls share one new connection.
    connecting: tokio::sync::Mutex<()>,
    /// The statements prepared on the live connection (the `Weak` names it: it keeps its
    /// allocation, so no later connection can take its address), with their SQL text.
    statements: Mutex<PreparedStatements>,
    /// The connection the completions with writes run their transactions on (one at a
    /// time), apart from the shared one (`transaction.rs`).
    transactions: tokio::sync::Mutex<Option<transaction::TxConnection>>,
    /// Whether the table's `id` column orders by bytes (its collation `C`), once
    /// [`check_table`](PostgresStore::check_table) passed: a prefix listing is then a
    /// range of the primary key.
    byte_ordered_ids: std::sync::OnceLock<bool>,
}

/// A handful of statements (the store's four, and purges): found by comparing their
/// text, which costs less than hashing it on every request.
type PreparedStatements = (
    std::sync::Weak<Client>,
    // The text, the address of the store's own statement it is (if it is one), the
    // prepared statement.
    Vec<(String, Option<usize>, tokio_postgres::Statement)>,
);

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        let mut d = f.debug_struct("PostgresStore");
        d.field("table", &self.inner.table.name)
            .field("hosts", &c.get_hosts())
            .field("ports", &c.get_ports())
            .field("dbname", &c.get_dbname())
            .field("user", &c.get_user());
        // Only whether there is one.
        if c.get_password().is_some() {
            d.field("password", &Redacted);
        }
        d.field("ssl_mode", &c.get_ssl_mode())
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// Stands for a secret in `Debug` output.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PostgresStore {
    /// A store on `table` (`table` or `schema.table`) of the database at `url`, a libpq
    /// URL (`postgres://user:password@host:5432/db?sslmode=require`) or key-value string
    /// (`host=… user=… dbname=…`). Only parses: the connection is made on first use (or
    /// by [`ensure_connected`](Self::ensure_connected); [`connect`](Self::connect) does
    /// both). A malformed URL is a non-retryable [`Error::Store`]; a table name that
    /// cannot work (empty, an empty part, a NUL byte, a part over 63 bytes) is
    /// [`Error::InvalidName`] (`what`: `"table name"`).
    pub fn from_url(url: &str, table: impl Into<String>) -> Result<Self, Error> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::store(BACKEND, false, e))?;
        Self::from_config(config, table)
    }

    /// A store on `table` of the database at `url`, connected now and its table checked
    /// ([`check_table`](Self::check_table)): at init, a wrong URL, password, certificate
    /// or table fails there rather than on the first message. Settings that apply to
    /// connections (TLS roots) need [`from_url`](Self::from_url), then
    /// [`check_table`](Self::check_table).
    pub async fn connect(url: &str, table: impl Into<String>) -> Result<Self, Error> {
        let store = Self::from_url(url, table)?;
        store.check_table().await?;
        Ok(store)
    }

    /// Like [`from_url`](Self::from_url), from a configuration you built.
    pub fn from_config(
        mut config: tokio_postgres::Config,
        table: impl Into<String>,
    ) -> Result<Self, Error> {
        let table = Table::new(table.into())?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let sql = Statements::new(&table.quoted);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                tls: Tls::Roots(Vec::new()),
                table,
                sql,
                client: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                statements: Mutex::default(),
                transactions: tokio::sync::Mutex::new(None),
                byte_ordered_ids: std::sync::OnceLock::new(),
            }),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            prepared: true,
        })
    }

    /// Whether each statement is prepared once per connection and then executed by name
    /// (default `true`), or sent as an unnamed statement that the server parses and plans
    /// on every request. Preparing halves the server's work per request: `bench-scale`
    /// measured twice the claims per second against the same server
    /// (`docs/benchmarks.md`). Turn it off behind a pooler that cannot carry prepared
    /// statements across its server connections: PgBouncer in transaction mode before
    /// 1.21 (or without `max_prepared_statements`), and RDS Proxy, which pins a client to
    /// one database connection once it prepares.
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.prepared = prepared;
        self
    }

    /// Bounds every request's wait for its answer ([`DEFAULT_REQUEST_TIMEOUT`] unless
    /// set). A request cut off drops its connection. Keep it above the engine's attempt
    /// timeout, which is the bound that should count.
    ///
    /// # Panics
    ///
    /// If `timeout` is zero: every request would fail. Set it at start-up.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "PostgresStore::request_timeout must be more than zero: every request would time out"
        );
        self.request_timeout = timeout;
        self
    }

    /// Trusts these root certificates (PEM, one or more) besides the system's, and turns
    /// `sslmode=prefer` into `require`: TLS is then mandatory and the certificate
    /// checked. For RDS, its CA bundle. Applies from the next connection: one already open
    /// (made without them) is closed, never used again.
    pub fn root_certificates_pem(self, pem: &[u8]) -> Result<Self, Error> {
        let mut roots = Vec::new();
        for cert in CertificateDer::pem_slice_iter(pem) {
            roots.push(cert.map_err(|e| {
                Error::store(BACKEND, false, format!("invalid PEM root certificate: {e}"))
            })?);
        }
        if roots.is_empty() {
            return Err(Error::store(
                BACKEND,
                false,
                "no certificate in the PEM root certificates",
            ));
        }
        Ok(self.with_inner(|inner| {
            require_tls(&mut inner.config);
            if let Tls::Roots(existing) = &mut inner.tls {
                existing.extend(roots);
            } else {
                inner.tls = Tls::Roots(roots);
            }
        }))
    }

    /// Uses this rustls configuration (client certificates, other roots), and turns
    /// `sslmode=prefer` into `require`. Applies from the next connection: one already open
    /// is closed, never used again.
    pub fn tls(self, config: rustls::ClientConfig) -> Self {
        self.with_inner(|inner| {
            require_tls(&mut inner.config);
            inner.tls = Tls::Config(Arc::new(config))
        })
    }

    /// A store with `change` made to its settings and no connection: a connection made
    /// under the old settings (an unverified `prefer` one) is not kept. Clones made before
    /// keep theirs.
    fn with_inner(self, change: impl FnOnce(&mut Inner)) -> Self {
        let request_timeout = self.request_timeout;
        let prepared = self.prepared;
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            config: shared.config.clone(),
            tls: shared.tls.clone(),
            table: shared.table.clone(),
            sql: Statements::new(&shared.table.quoted),
            client: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            statements: Mutex::default(),
            transactions: tokio::sync::Mutex::new(None),
            byte_ordered_ids: shared.byte_ordered_ids.clone(),
        });
        let mut inner = inner;
        change(&mut inner);
        inner.client = Mutex::new(None);
        inner.statements = Mutex::default();
        inner.transactions = tokio::sync::Mutex::new(None);
        Self {
            inner: Arc::new(inner),
            request_timeout,
            prepared,
        }
    }

    /// The table name, as given.
    pub fn table(&self) -> &str {
        &self.inner.table.name
    }

    /// The table's DDL (`CREATE TABLE IF NOT EXISTS` and its index), quoted as this store
    /// uses it.
    pub fn create_table_sql(&self) -> String {
        self.inner.table.create_table_sql()
    }

    /// Creates the table and its index if they do not exist (the schema must exist).
    /// For tests and first runs; in production, prefer your migrations.
    pub async fn create_table(&self) -> Result<(), Error> {
        self.batch_execute(&self.create_table_sql()).await
    }

    /// Connects now if no connection is open, so a wrong URL, password or certificate
    /// fails here. It does not look at the table: at init, call
    /// [`check_table`](Self::check_table), which connects and checks the table too.
    pub async fn ensure_connected(&self) -> Result<(), Error> {
        self.client().await.map(drop)
    }

    /// The server process id of the store's connection (connecting if needed), to find
    /// it in `pg_stat_activity`, or to end it with `pg_terminate_backend` when testing
    /// what a dropped connection does. A test hook.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub async fn backend_pid(&self) -> Result<i32, Error> {
        let rows = self.query("SELECT pg_backend_pid()", &[]).await?;
        rows.first()
            .and_then(|row| row.try_get(0).ok())
            .ok_or_else(|| self.malformed("pg_backend_pid() returned no pid"))
    }

    /// The store's connection (connecting if needed), TLS and all, for the benchmarks'
    /// run of the same statements without the library. A test hook.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub async fn connection(&self) -> Result<Arc<Client>, Error> {
        self.client().await
    }

    /// The claim statement. Parameters: `$1` id, `$2` expiration (epoch s), `$3` lease
    /// end (epoch ms), `$4` validation, `$5` lease token, `$6` now (epoch s), `$7` now
    /// (epoch ms). Rows: `(written, <record columns>)`, `written` for the upsert's row.
    /// Why it is exact under races: see the module docs.
    ///
    /// A test hook.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn claim_sql(&self) -> &str {
        &self.inner.sql.claim
    }

    /// The completion statement. Parameters: `$1` id, `$2` lease token, `$3` data, `$4`
    /// expiration (epoch s). A test hook (the benchmarks run it with pgbench).
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn complete_sql(&self) -> &str {
        &self.inner.sql.complete
    }
}

impl IdempotencyStore for PostgresStore {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn commits_writes(&self, writes: &'static str) -> bool {
        writes == <PostgresWrites as crate::store::StoreWrites>::STORE
    }

    fn limits(&self) -> StoreLimits {
        StoreLimits::DYNAMODB
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.send_claim(claim))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_completion(claim, data, expiration))
    }

    /// One transaction on the store's transaction connection: the record locked and its
    /// lease token checked, the [`PostgresWrites`]' statements, the completion, `COMMIT`
    /// (see [`PostgresWrites`] and the module docs).
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_completion_with(claim, data, expiration, writes))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_release(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read_record(id))
    }

    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        Box::pin(self.send_forget(record))
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        Box::pin(self.send_list(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "must be more than zero")]
    fn a_zero_request_timeout_is_refused_at_construction() {
        let _ = PostgresStore::from_url("postgres://u@h/db", "t")
            .unwrap()
            .request_timeout(Duration::ZERO);
    }

    #[test]
    fn debug_never_shows_the_password() {
        for url in [
            "postgres://worker:hunter2-pg@db.example:5433/app?sslmode=require",
            "host=db.example port=5433 user=worker password=hunter2-pg dbname=app",
        ] {
            let store = PostgresStore::from_url(url, "idempotency").unwrap();
            let text = format!("{store:?}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(
                text.contains("<redacted>") && text.contains("db.example"),
                "{text}"
            );
        }
        let err = PostgresStore::from_url("postgres://worker:hunter2-pg@db.example:x/app", "t")
            .unwrap_err();
        for text in [format!("{err}"), format!("{err:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
}

//! The PostgreSQL store.
//!
//! # Table
//! One row per record, typed columns, the status checked by the table:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS idempotency (
//!     id                     text   PRIMARY KEY,
//!     status                 text   NOT NULL CHECK (status IN ('INPROGRESS', 'COMPLETED')),
//!     expiration             bigint NOT NULL, -- epoch seconds
//!     in_progress_expiration bigint,          -- epoch milliseconds, the lease end
//!     data                   text,            -- the result as JSON, byte for byte
//!     validation             text,
//!     lease_token            text
//! );
//! CREATE INDEX IF NOT EXISTS idempotency_expiration_idx ON idempotency (expiration);
//! ```
//!
//! [`PostgresStore::create_table`] runs this DDL (for tests and first runs). `data` is
//! `text`, not `jsonb`: `jsonb` rewrites the JSON (key order, spaces). The table name may
//! be schema-qualified (`schema.table`, split at the first dot); each part is quoted as
//! given, so it is case-sensitive.
//!
//! # Protocol
//! Each call is one statement in one round trip (an unnamed statement with its parameter
//! types given: no separate prepare, nothing that pins an RDS Proxy connection).
//! 1. **Claim**: one `INSERT … ON CONFLICT (id) DO UPDATE … WHERE` the stored row is
//!    claimable ([`Record::is_claimable_by`]), beside a `SELECT … FOR UPDATE` of the
//!    current row in the same statement, so a duplicate learns the live record from the
//!    same round trip (see [`PostgresStore::claim_sql`] for why it is exact under races).
//! 2. **Complete**: `UPDATE … WHERE id = $1 AND lease_token = $2`.
//! 3. **Release**: `DELETE … WHERE id = $1 AND lease_token = $2`.
//!
//! A first delivery costs two round trips; a duplicate costs one.
//!
//! # Expired rows
//! PostgreSQL has no TTL. Expired rows stay claimable, so correctness never depends on
//! deleting them; to keep the table small, call [`PostgresStore::purge_expired`] on a
//! schedule (an EventBridge-scheduled Lambda), or run the same `DELETE` with `pg_cron`.
//!
//! # Connection
//! One connection per store (per Lambda execution environment), made on first use,
//! reused across invocations and rebuilt on the next call after it broke (closed,
//! an I/O error, a server shutdown) or after a call was cut off by the engine's attempt
//! timeout. Behind RDS Proxy or PgBouncer (transaction mode) this is fine: no session
//! state and no named prepared statements are used.
//!
//! A connect (TCP, TLS negotiation and start-up together) is bounded by the URL's
//! `connect_timeout` (5 s when it sets none; once per host when it names several), and
//! every request by the store's request timeout ([`DEFAULT_REQUEST_TIMEOUT`], 5 s,
//! [`with_request_timeout`](PostgresStore::with_request_timeout)), so a call made outside
//! the engine (`get` in a health check, `purge_expired`, `create_table`, the worker's
//! `ensure_connected` at start-up) never waits forever on a server that stopped
//! answering; inside the engine, its attempt timeout (2 s by default) is the bound that
//! counts. A request cut off by either bound drops its connection; the next call
//! reconnects.
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
//! [`with_root_certificates_pem`](PostgresStore::with_root_certificates_pem) (RDS's CA
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

use super::{BoxFuture, ClaimOutcome, IdempotencyStore, StoreLimits};
use crate::error::{BoxError, Error};
use crate::record::{Claim, Record, Status, epoch_millis, epoch_secs, from_epoch_millis};
use crate::record::{UnknownStatus, from_epoch_secs};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

const BACKEND: &str = "postgres";

/// The columns of a record, in the order every statement returns them.
const COLUMNS: &str =
    "id, status, expiration, in_progress_expiration, data, validation, lease_token";

/// How far [`PostgresStore::purge_expired`] stays behind its own clock.
pub const PURGE_GRACE: Duration = Duration::from_secs(60);

/// Connect timeout when the URL sets none: a stalled connect must not take the whole
/// store attempt.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a request may wait for its answer by default, so a call made outside the
/// engine (a health check's `get`, `purge_expired`, `create_table`) never waits forever on
/// a server that stopped answering. Above the engine's attempt timeout (2 s by default),
/// which is the bound that normally counts.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// PostgreSQL's longest identifier (`NAMEDATALEN - 1`); it cuts longer ones.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// An [`IdempotencyStore`] on a PostgreSQL table. Cloning shares the connection.
///
/// ```no_run
/// # async fn f() -> Result<(), lambda_idempotency::Error> {
/// use lambda_idempotency::{Idempotency, PostgresStore};
/// let url = std::env::var("DATABASE_URL").unwrap(); // postgres://user:pw@host/db?sslmode=require
/// // RDS: its CA bundle, from https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem
/// let rds_ca = std::fs::read("global-bundle.pem").unwrap();
/// let store = PostgresStore::connect(&url, "idempotency")?.with_root_certificates_pem(&rds_ca)?;
/// store.ensure_connected().await?; // fail at init, not on the first message
/// let idempotency = Idempotency::new(store);
/// # let _ = idempotency;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    request_timeout: Duration,
}

struct Inner {
    config: tokio_postgres::Config,
    tls: Tls,
    table: String,
    quoted: String,
    index: String,
    sql: Statements,
    /// The live connection, if any. A plain mutex: held only to copy or swap the `Arc`.
    client: Mutex<Option<Arc<Client>>>,
    /// Serialises connects, so concurrent calls share one new connection.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
enum Tls {
    /// System roots plus these, verified for `require`; unverified for `prefer`.
    Roots(Vec<CertificateDer<'static>>),
    /// A configuration you built, used for `prefer` and `require`.
    Config(Arc<rustls::ClientConfig>),
}

struct Statements {
    claim: String,
    complete: String,
    release: String,
    get: String,
    purge: String,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        let mut d = f.debug_struct("PostgresStore");
        d.field("table", &self.inner.table)
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

/// Starts an id stored escaped. PostgreSQL's `text` cannot hold NUL, which a key taken
/// from a JSON string may: such an id (and any id starting with this marker or
/// [`HASHED_ID`]) is stored as the marker and the id with `\` doubled and NUL written
/// `\0`. The mapping is one to one, so no two ids share a row, and every other id is
/// stored as it is.
const ESCAPED_ID: char = '\u{1}';

/// Starts an id stored as the SHA-256 of the id: an escaped id longer than
/// [`MAX_STORED_ID_BYTES`] (escaping can double an id, and a primary key entry must fit
/// PostgreSQL's 2704-byte index limit). Read back, a record's id is the id it was asked
/// for, never this form.
const HASHED_ID: char = '\u{2}';

/// The longest id stored escaped; longer ones are stored hashed.
const MAX_STORED_ID_BYTES: usize = 2048;

fn stored_id(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains('\0') && !id.starts_with([ESCAPED_ID, HASHED_ID]) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut stored = String::with_capacity(id.len() + 8);
    stored.push(ESCAPED_ID);
    for c in id.chars() {
        match c {
            '\\' => stored.push_str("\\\\"),
            '\0' => stored.push_str("\\0"),
            c => stored.push(c),
        }
    }
    if stored.len() > MAX_STORED_ID_BYTES {
        let hash = crate::key::sha256_hex(id.as_bytes());
        return std::borrow::Cow::Owned(format!("{HASHED_ID}{hash}"));
    }
    std::borrow::Cow::Owned(stored)
}

/// The inverse of [`stored_id`] for ids stored escaped (a record read back takes the id it
/// was asked for; this checks that the mapping is one to one).
#[cfg(test)]
fn read_id(stored: String) -> String {
    let Some(escaped) = stored.strip_prefix(ESCAPED_ID) else {
        return stored;
    };
    let mut id = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('0') => id.push('\0'),
                Some(other) => id.push(other),
                None => id.push('\\'),
            },
            (c, false) => id.push(c),
        }
    }
    id
}

/// Given roots or a TLS configuration, `sslmode=prefer` (the default) becomes `require`:
/// a server, or a man in the middle, that declines TLS must not get a plaintext session.
/// `disable` stays as asked.
fn require_tls(config: &mut tokio_postgres::Config) {
    if config.get_ssl_mode() == SslMode::Prefer {
        config.ssl_mode(SslMode::Require);
    }
}

/// The expiration index's name: `{table}_expiration_idx`, or, when that passes
/// PostgreSQL's 63-byte limit (it would be cut, and two long table names could share it),
/// the table name's start and a hash of the whole.
fn index_name(table: &str) -> String {
    let name = format!("{table}_expiration_idx");
    if name.len() <= 63 {
        return name;
    }
    let hash = crate::key::sha256_hex(table.as_bytes());
    let mut cut = 36;
    while !table.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{}_expiration_idx", &table[..cut], &hash[..8])
}

/// Quotes one identifier: double quotes, inner ones doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl PostgresStore {
    /// A store on `table` (`table` or `schema.table`) of the database at `url`, a libpq
    /// URL (`postgres://user:password@host:5432/db?sslmode=require`) or key-value string
    /// (`host=… user=… dbname=…`). Only parses: the connection is made on first use (or
    /// by [`ensure_connected`](Self::ensure_connected)). A malformed URL or a table name
    /// with a NUL byte is a non-retryable [`Error::Store`].
    pub fn connect(url: &str, table: impl Into<String>) -> Result<Self, Error> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::store(BACKEND, false, e))?;
        Self::from_config(config, table)
    }

    /// Like [`connect`](Self::connect), from a configuration you built.
    pub fn from_config(
        mut config: tokio_postgres::Config,
        table: impl Into<String>,
    ) -> Result<Self, Error> {
        let table = table.into();
        let empty_part = table
            .split_once('.')
            .is_some_and(|(a, b)| a.is_empty() || b.is_empty());
        if table.is_empty() || table.contains('\0') || empty_part {
            return Err(Error::store(
                BACKEND,
                false,
                format!("invalid table name {table:?}"),
            ));
        }
        let parts = match table.split_once('.') {
            Some((schema, name)) => [("schema", schema), ("table", name)].to_vec(),
            None => [("table", table.as_str())].to_vec(),
        };
        for (what, part) in parts {
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(Error::store(
                    BACKEND,
                    false,
                    format!(
                        "the {what} name {part:?} is {} bytes; PostgreSQL identifiers are at most {MAX_IDENTIFIER_BYTES} bytes (it cuts longer ones, so two long names could share one table)",
                        part.len()
                    ),
                ));
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let (quoted, index) = match table.split_once('.') {
            Some((schema, name)) => (
                format!("{}.{}", quote_ident(schema), quote_ident(name)),
                quote_ident(&index_name(name)),
            ),
            None => (quote_ident(&table), quote_ident(&index_name(&table))),
        };
        let sql = Statements::new(&quoted);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                tls: Tls::Roots(Vec::new()),
                table,
                quoted,
                index,
                sql,
                client: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Bounds every request's wait for its answer ([`DEFAULT_REQUEST_TIMEOUT`] unless
    /// set). A request cut off drops its connection. Keep it above the engine's attempt
    /// timeout, which is the bound that should count.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Trusts these root certificates (PEM, one or more) besides the system's, and turns
    /// `sslmode=prefer` into `require`: TLS is then mandatory and the certificate
    /// checked. For RDS, its CA bundle. Applies from the next connection: one already open
    /// (made without them) is closed, never used again.
    pub fn with_root_certificates_pem(self, pem: &[u8]) -> Result<Self, Error> {
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
    pub fn with_tls(self, config: rustls::ClientConfig) -> Self {
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
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            config: shared.config.clone(),
            tls: shared.tls.clone(),
            table: shared.table.clone(),
            quoted: shared.quoted.clone(),
            index: shared.index.clone(),
            sql: Statements::new(&shared.quoted),
            client: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        });
        let mut inner = inner;
        change(&mut inner);
        inner.client = Mutex::new(None);
        Self {
            inner: Arc::new(inner),
            request_timeout,
        }
    }

    /// The table name, as given.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The table's DDL (`CREATE TABLE IF NOT EXISTS` and its index), quoted as this store
    /// uses it.
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n    \
                id text PRIMARY KEY,\n    \
                status text NOT NULL CHECK (status IN ('INPROGRESS', 'COMPLETED')),\n    \
                expiration bigint NOT NULL,\n    \
                in_progress_expiration bigint,\n    \
                data text,\n    \
                validation text,\n    \
                lease_token text\n\
            );\n\
            CREATE INDEX IF NOT EXISTS {i} ON {t} (expiration);\n",
            t = self.inner.quoted,
            i = self.inner.index,
        )
    }

    /// Creates the table and its index if they do not exist (the schema must exist).
    /// For tests and first runs; in production, prefer your migrations.
    pub async fn create_table(&self) -> Result<(), Error> {
        let client = self.client().await?;
        let sql = self.create_table_sql();
        let call = Call::new(self, &client);
        match tokio::time::timeout(self.request_timeout, client.batch_execute(&sql)).await {
            Ok(result) => call.done(result.map_err(|e| self.pg_error(e))),
            // Dropping the unfinished call drops the connection.
            Err(_) => Err(self.timed_out("answer", self.request_timeout)),
        }
    }

    /// Connects now if no connection is open: call it at init so a wrong URL, password or
    /// certificate fails there rather than on the first message.
    pub async fn ensure_connected(&self) -> Result<(), Error> {
        self.client().await.map(drop)
    }

    /// The server process id of the store's connection (connecting if needed), to find
    /// it in `pg_stat_activity`, or to end it with `pg_terminate_backend` when testing
    /// what a dropped connection does.
    pub async fn backend_pid(&self) -> Result<i32, Error> {
        let rows = self.query("SELECT pg_backend_pid()", &[]).await?;
        rows.first()
            .and_then(|row| row.try_get(0).ok())
            .ok_or_else(|| self.malformed("pg_backend_pid() returned no pid"))
    }

    /// The claim statement. Parameters: `$1` id, `$2` expiration (epoch s), `$3` lease
    /// end (epoch ms), `$4` validation, `$5` lease token, `$6` now (epoch s), `$7` now
    /// (epoch ms). Rows: `(written, <record columns>)`, `written` for the upsert's row.
    ///
    /// Why it is exact under races (READ COMMITTED, each call its own transaction):
    /// - `old` reads the row with `FOR UPDATE`: if the row is in the statement's snapshot,
    ///   the lock waits for any writer and returns its latest version, locked, so the
    ///   upsert (sequenced after `old` by `FROM (SELECT count(*) FROM old)`) evaluates the
    ///   claim's condition against exactly that version. `old` is then the claimed-over
    ///   record (`previous`) or the live one (`Exists`); a duplicate changes no row (its
    ///   row lock is all it writes).
    /// - A row committed after the snapshot is invisible to `old` but not to
    ///   `ON CONFLICT`, which always sees and locks the latest row. Then (`old` empty) the
    ///   update always applies, writing the claim if the row is claimable and the row
    ///   unchanged otherwise (each column `CASE`d on the same condition), so `RETURNING`
    ///   shows the live record: never a made-up one, never a retry.
    /// - The upsert's row is this claim's exactly when it is in progress with the claim's
    ///   token: tokens are unique per claim.
    pub fn claim_sql(&self) -> &str {
        &self.inner.sql.claim
    }

    /// Deletes at most `limit` expired rows (expired by whole seconds, and not in progress
    /// with a live lease: exactly the rows a claim could take over and no live record),
    /// skipping rows another transaction holds, and returns how many it deleted. Call it
    /// until it returns less than `limit`, on a schedule: expired rows never change an
    /// answer, they only take space.
    ///
    /// Records are judged by the clock of the machine that calls it, minus
    /// [`PURGE_GRACE`], so a purger whose clock runs somewhat ahead of the workers' never
    /// deletes a record that still counts for them.
    ///
    /// With `pg_cron`, the same `DELETE` (seconds and milliseconds truncated, as the
    /// library reads them, and the same grace):
    /// ```sql
    /// SELECT cron.schedule('purge-idempotency', '*/15 * * * *', $$
    ///   DELETE FROM idempotency
    ///   WHERE expiration < floor(extract(epoch FROM now()))::bigint - 60
    ///     AND (status <> 'INPROGRESS' OR in_progress_expiration IS NULL
    ///          OR in_progress_expiration < floor(extract(epoch FROM now()) * 1000)::bigint - 60000) $$);
    /// ```
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, Error> {
        let now = SystemTime::now()
            .checked_sub(PURGE_GRACE)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.purge_expired_at(now, limit).await
    }

    /// [`purge_expired`](Self::purge_expired) as of `now` exactly (no grace): the rows a
    /// claim at `now` could take over.
    pub async fn purge_expired_at(&self, now: SystemTime, limit: u32) -> Result<u64, Error> {
        let (now_s, now_ms, limit) = (secs(now), millis(now), i64::from(limit));
        let rows = self
            .query(
                &self.inner.sql.purge,
                &[
                    (&now_s, Type::INT8),
                    (&now_ms, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        let deleted: i64 = rows
            .first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(|e| self.pg_error(e))?
            .unwrap_or(0);
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    /// The open connection, or a new one.
    async fn client(&self) -> Result<Arc<Client>, Error> {
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let _connecting = self.inner.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let client = Arc::new(self.open().await?);
        *self.slot() = Some(client.clone());
        Ok(client)
    }

    fn current(&self) -> Option<Arc<Client>> {
        let mut slot = self.slot();
        match &*slot {
            Some(client) if client.is_closed() => {
                *slot = None;
                None
            }
            other => other.clone(),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Client>>> {
        // Every update is one assignment: a poisoned lock holds a whole value.
        self.inner.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops `client` from the slot (if it is still the current one): the next call
    /// reconnects.
    fn forget(&self, client: &Arc<Client>) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    /// A new connection, TCP, TLS negotiation and start-up bounded together by the connect
    /// timeout (once per host: tokio-postgres tries them in turn).
    async fn open(&self) -> Result<Client, Error> {
        let config = &self.inner.config;
        let per_host = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        let bound = per_host.saturating_mul(hosts);
        match tokio::time::timeout(bound, self.open_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out("connection", bound)),
        }
    }

    async fn open_unbounded(&self) -> Result<Client, Error> {
        let config = &self.inner.config;
        let connect_error = |e: tokio_postgres::Error| self.pg_error(e);
        let log_end = |result: Result<(), tokio_postgres::Error>| {
            if let Err(err) = result {
                tracing::debug!(error = %err, "postgres idempotency store connection ended");
            }
        };
        if config.get_ssl_mode() == SslMode::Disable {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(connect_error)?;
            tokio::spawn(async move { log_end(connection.await) });
            return Ok(client);
        }
        let tls = self.tls_config()?;
        let (client, connection) = config
            .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
            .await
            .map_err(connect_error)?;
        tokio::spawn(async move { log_end(connection.await) });
        Ok(client)
    }

    fn tls_config(&self) -> Result<rustls::ClientConfig, Error> {
        let roots = match &self.inner.tls {
            Tls::Config(config) => return Ok((**config).clone()),
            Tls::Roots(roots) => roots,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::store(BACKEND, false, e))?;
        let verify = self.inner.config.get_ssl_mode() == SslMode::Require || !roots.is_empty();
        if !verify {
            // libpq's `prefer`: encrypted, the certificate not checked.
            return Ok(builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                .with_no_client_auth());
        }
        let mut store = rustls::RootCertStore::empty();
        store.add_parsable_certificates(system_roots());
        store.add_parsable_certificates(roots.iter().cloned());
        if store.is_empty() {
            return Err(Error::store(
                BACKEND,
                false,
                "sslmode=require but no root certificate was found: set SSL_CERT_FILE or use with_root_certificates_pem",
            ));
        }
        Ok(builder.with_root_certificates(store).with_no_client_auth())
    }

    /// One statement, one round trip: an unnamed statement with its parameter types.
    async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let client = self.client().await?;
        let call = Call::new(self, &client);
        match tokio::time::timeout(self.request_timeout, client.query_typed(sql, params)).await {
            Ok(result) => call.done(result.map_err(|e| self.pg_error(e))),
            // Dropping the unfinished call drops the connection.
            Err(_) => Err(self.timed_out("answer", self.request_timeout)),
        }
    }

    fn pg_error(&self, err: tokio_postgres::Error) -> Error {
        if err.code() == Some(&SqlState::UNDEFINED_TABLE) {
            return Error::store(
                BACKEND,
                false,
                MissingTable {
                    table: self.inner.table.clone(),
                    source: err,
                },
            );
        }
        Error::store(BACKEND, is_retryable(&err), err)
    }

    /// The servers of the configuration, `host:port` each.
    fn servers(&self) -> String {
        let c = &self.inner.config;
        c.get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let host = match host {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                };
                let port = c.get_ports().get(i).or(c.get_ports().first());
                format!("{host}:{}", port.copied().unwrap_or(5432))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A connect or request cut off by its bound: retryable (the connection is dropped).
    fn timed_out(&self, what: &'static str, after: Duration) -> Error {
        Error::store(
            BACKEND,
            true,
            TimedOut {
                what,
                servers: self.servers(),
                after,
            },
        )
    }

    fn malformed(&self, what: impl fmt::Display) -> Error {
        Error::store(
            BACKEND,
            false,
            format!("malformed idempotency row in {}: {what}", self.inner.table),
        )
    }

    /// The record `id` in a row of [`COLUMNS`] starting at column `at`. Its id is the one
    /// asked for (a hashed id is not invertible; the row was found by `id`'s stored form).
    fn parse(&self, row: &Row, at: usize, id: &str) -> Result<Record, Error> {
        let get_err = |e: tokio_postgres::Error| self.malformed(e);
        let id = id.to_owned();
        let status: String = row.try_get(at + 1).map_err(get_err)?;
        let status: Status = status
            .parse()
            .map_err(|e: UnknownStatus| self.malformed(format_args!("{id:?}: {e}")))?;
        let expiration: i64 = row.try_get(at + 2).map_err(get_err)?;
        let lease: Option<i64> = row.try_get(at + 3).map_err(get_err)?;
        let non_negative = |name: &str, n: i64| {
            u64::try_from(n).map_err(|_| self.malformed(format_args!("{id:?}: {name} is {n}")))
        };
        Ok(Record {
            status,
            expiration: from_epoch_secs(non_negative("expiration", expiration)?),
            in_progress_expiration: lease
                .map(|ms| non_negative("in_progress_expiration", ms).map(from_epoch_millis))
                .transpose()?,
            data: row.try_get(at + 4).map_err(get_err)?,
            validation: row.try_get(at + 5).map_err(get_err)?,
            lease_token: row.try_get(at + 6).map_err(get_err)?,
            id,
        })
    }

    async fn claim_once(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let (expiration, lease_until) = (secs(claim.expiration), millis(claim.lease_until));
        let (now_s, now_ms) = (secs(claim.now), millis(claim.now));
        let rows = self
            .query(
                &self.inner.sql.claim,
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&expiration, Type::INT8),
                    (&lease_until, Type::INT8),
                    (&claim.validation, Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                    (&now_s, Type::INT8),
                    (&now_ms, Type::INT8),
                ],
            )
            .await?;
        let (mut written, mut old) = (None, None);
        for row in &rows {
            let is_written: bool = row.try_get(0).map_err(|e| self.pg_error(e))?;
            if is_written {
                // Our own claim, parsed from what we wrote: never malformed.
                written = Some(row);
            } else {
                old = Some(row);
            }
        }
        let ours = |row: &Row| -> Result<bool, Error> {
            let status: String = row.try_get(2).map_err(|e| self.pg_error(e))?;
            let token: Option<String> = row.try_get(7).map_err(|e| self.pg_error(e))?;
            Ok(status == Status::InProgress.as_str()
                && token.as_deref() == Some(claim.lease_token.as_str()))
        };
        match (written, old) {
            (Some(row), old) if ours(row)? => {
                // The claim is written: an old row we cannot read must not turn it into
                // an error that holds the key until the lease ends.
                let previous = old.and_then(|old| match self.parse(old, 1, &claim.id) {
                    Ok(previous) => Some(previous),
                    Err(err) => {
                        tracing::warn!(error = %crate::error::report(&err), "claimed over a row that is not a valid idempotency record");
                        None
                    }
                });
                Ok(ClaimOutcome::Claimed { previous })
            }
            // A row committed after the statement's snapshot, unchanged: the live record.
            (Some(row), _) => Ok(ClaimOutcome::Exists(self.parse(row, 1, &claim.id)?)),
            (None, Some(old)) => Ok(ClaimOutcome::Exists(self.parse(old, 1, &claim.id)?)),
            // Not reachable (the upsert always writes or finds a row); retry if it is.
            (None, None) => Ok(ClaimOutcome::Vanished),
        }
    }

    async fn complete_once(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let expiration = secs(expiration);
        let rows = self
            .query(
                &self.inner.sql.complete,
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                    (&data, Type::TEXT),
                    (&expiration, Type::INT8),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::LeaseLost {
                key: claim.id.clone(),
            });
        }
        Ok(())
    }

    async fn release_once(&self, claim: &Claim) -> Result<(), Error> {
        let rows = self
            .query(
                &self.inner.sql.release,
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::LeaseLost {
                key: claim.id.clone(),
            });
        }
        Ok(())
    }

    async fn get_once(&self, id: &str) -> Result<Option<Record>, Error> {
        let rows = self
            .query(&self.inner.sql.get, &[(&stored_id(id), Type::TEXT)])
            .await?;
        rows.first().map(|row| self.parse(row, 0, id)).transpose()
    }
}

impl Statements {
    fn new(t: &str) -> Self {
        // Record::is_claimable_by over the stored row `r`; NULL (no lease) is false.
        let claimable = "COALESCE(\
            (r.status = 'INPROGRESS' AND r.in_progress_expiration < $7) \
            OR (r.status = 'INPROGRESS' AND r.lease_token = $5) \
            OR (r.expiration < $6 AND NOT (r.status = 'INPROGRESS' AND r.in_progress_expiration IS NOT NULL)), \
            false)";
        let set = |column: &str| {
            format!("{column} = CASE WHEN {claimable} THEN excluded.{column} ELSE r.{column} END")
        };
        let sets = [
            "status",
            "expiration",
            "in_progress_expiration",
            "data",
            "validation",
            "lease_token",
        ]
        .map(set)
        .join(",\n        ");
        let returning = COLUMNS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let claim = format!(
            "WITH old AS (\n    \
                SELECT {COLUMNS} FROM {t} WHERE id = $1 FOR UPDATE\n\
            ), claimed AS (\n    \
                INSERT INTO {t} AS r ({COLUMNS})\n    \
                SELECT $1, 'INPROGRESS', $2, $3, NULL, $4, $5 FROM (SELECT count(*) FROM old) AS after_old\n    \
                ON CONFLICT (id) DO UPDATE SET\n        {sets}\n    \
                WHERE {claimable} OR NOT EXISTS (SELECT 1 FROM old)\n    \
                RETURNING {returning}\n\
            )\n\
            SELECT true AS written, {COLUMNS} FROM claimed\n\
            UNION ALL\n\
            SELECT false, {COLUMNS} FROM old"
        );
        // Expired, and claimable: not in progress with a live lease.
        let purgeable = "expiration < $1 \
            AND (status <> 'INPROGRESS' OR in_progress_expiration IS NULL OR in_progress_expiration < $2)";
        Self {
            claim,
            complete: format!(
                "UPDATE {t} SET status = 'COMPLETED', data = $3, expiration = $4 \
                 WHERE id = $1 AND lease_token = $2 RETURNING 1"
            ),
            release: format!("DELETE FROM {t} WHERE id = $1 AND lease_token = $2 RETURNING 1"),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1"),
            purge: format!(
                "WITH purged AS (\n    \
                    DELETE FROM {t} WHERE {purgeable} AND id IN (\n        \
                        SELECT id FROM {t} WHERE {purgeable} LIMIT $3 FOR UPDATE SKIP LOCKED)\n    \
                    RETURNING 1\n\
                )\n\
                SELECT count(*) FROM purged"
            ),
        }
    }
}

/// A call in flight on `client`: if it is dropped unfinished (the engine's attempt
/// timeout cut it off), the connection may be stalled, so the next call reconnects
/// rather than queue behind it.
struct Call<'a> {
    store: &'a PostgresStore,
    client: &'a Arc<Client>,
    finished: bool,
}

impl<'a> Call<'a> {
    fn new(store: &'a PostgresStore, client: &'a Arc<Client>) -> Self {
        Self {
            store,
            client,
            finished: false,
        }
    }

    /// Ends the call; an error that broke the connection drops it.
    fn done<T>(mut self, result: Result<T, Error>) -> Result<T, Error> {
        self.finished = true;
        if let Err(Error::Store { source, .. }) = &result
            && breaks_connection(source)
        {
            self.store.forget(self.client);
        }
        result
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.store.forget(self.client);
        }
    }
}

/// Whether the error means the connection is no longer usable.
fn breaks_connection(source: &BoxError) -> bool {
    let Some(err) = source.downcast_ref::<tokio_postgres::Error>() else {
        return false;
    };
    if err.is_closed() || io_error(err).is_some() {
        return true;
    }
    err.code().is_some_and(|code| {
        let code = code.code();
        code.starts_with("08") || code.starts_with("57P") || code == "25006"
    })
}

fn io_error(err: &tokio_postgres::Error) -> Option<&std::io::Error> {
    std::error::Error::source(err).and_then(|s| s.downcast_ref::<std::io::Error>())
}

/// Whether a later attempt of the same call may succeed.
fn is_retryable(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    if let Some(code) = err.code() {
        let code = code.code();
        return code.starts_with("08")
            || matches!(
                code,
                "40001"
                    | "40P01"
                    | "55P03"
                    | "57014"
                    | "57P01"
                    | "57P02"
                    | "57P03"
                    | "57P05"
                    | "53300"
                    | "25006"
            );
    }
    match io_error(err) {
        // A certificate rejected, an invalid address: the same again next time.
        Some(io) => !matches!(
            io.kind(),
            std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::InvalidInput
                | std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::Unsupported
        ),
        None => err.to_string().starts_with("timeout"),
    }
}

/// A connect or a request that got no answer within its bound.
#[derive(Debug)]
struct TimedOut {
    what: &'static str,
    servers: String,
    after: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (servers, after) = (&self.servers, self.after);
        match self.what {
            "connection" => write!(
                f,
                "cannot connect to PostgreSQL at {servers}: no connection within {after:?} (TCP, TLS negotiation and start-up together)"
            ),
            _ => write!(f, "no answer from PostgreSQL at {servers} within {after:?}"),
        }
    }
}

impl std::error::Error for TimedOut {}

/// A missing table: names it and says how to create it.
#[derive(Debug)]
struct MissingTable {
    table: String,
    source: tokio_postgres::Error,
}

impl fmt::Display for MissingTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the idempotency table {:?} does not exist: create it with PostgresStore::create_table or the DDL in the store's documentation",
            self.table
        )
    }
}

impl std::error::Error for MissingTable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Root certificates of the system: `SSL_CERT_FILE`, else the first CA bundle found at
/// the usual places (Amazon Linux, Debian, Alpine, Fedora, macOS).
fn system_roots() -> Vec<CertificateDer<'static>> {
    const BUNDLES: [&str; 5] = [
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/ssl/cert.pem",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/ca-bundle.pem",
    ];
    let from_env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
    let candidates = from_env
        .into_iter()
        .chain(BUNDLES.iter().map(std::path::PathBuf::from));
    for path in candidates {
        if let Ok(pem) = std::fs::read(&path) {
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect();
            if !certs.is_empty() {
                return certs;
            }
        }
    }
    Vec::new()
}

/// `sslmode=prefer` without roots: encrypted, the certificate unchecked (libpq's
/// behaviour); handshake signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn secs(t: SystemTime) -> i64 {
    i64::try_from(epoch_secs(t)).unwrap_or(i64::MAX)
}

fn millis(t: SystemTime) -> i64 {
    i64::try_from(epoch_millis(t)).unwrap_or(i64::MAX)
}

impl IdempotencyStore for PostgresStore {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn limits(&self) -> StoreLimits {
        StoreLimits::DYNAMODB
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.claim_once(claim))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.complete_once(claim, data, expiration))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release_once(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.get_once(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_postgres_cannot_hold_are_escaped_one_to_one() {
        let ids = [
            "f.op#plain",
            "f.op#back\\slash",
            "f.op#nul\0here",
            "f.op#nul\\0lookalike",
            "\u{1}f.op#marker",
            "\u{1}",
            "\u{2}f.op#hashed-marker",
            "\0",
            "\\",
            "",
        ];
        let mut stored = std::collections::HashSet::new();
        for id in ids {
            let s = stored_id(id);
            assert!(!s.contains('\0'), "{id:?} is stored without NUL: {s:?}");
            assert_eq!(read_id(s.to_string()), id, "{id:?} reads back");
            assert!(
                stored.insert(s.to_string()),
                "{id:?} shares its stored form"
            );
        }
        assert!(matches!(
            stored_id("f.op#plain"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(
            stored_id("f.op#back\\slash"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn long_table_names_get_distinct_index_names() {
        assert_eq!(index_name("idempotency"), "idempotency_expiration_idx");
        let a = index_name(&format!("{}a", "t".repeat(60)));
        let b = index_name(&format!("{}b", "t".repeat(60)));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert!(index_name(&"é".repeat(40)).len() <= 63);
    }

    #[test]
    fn a_table_name_needs_both_parts() {
        for bad in ["", "schema.", ".table", "t\0"] {
            assert!(
                PostgresStore::connect("postgres://u@h/db", bad).is_err(),
                "{bad:?} is refused"
            );
        }
        assert!(PostgresStore::connect("postgres://u@h/db", "s.t").is_ok());
    }

    #[test]
    fn given_roots_prefer_becomes_require() {
        let store = PostgresStore::connect("postgres://u@h/db", "t").unwrap();
        assert_eq!(store.inner.config.get_ssl_mode(), SslMode::Prefer);
        // Roots given: tests/store_connection_faults.rs, against a server that declines TLS.
        let store = PostgresStore::connect("postgres://u@h/db?sslmode=disable", "t").unwrap();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let disabled = store.with_tls(tls.clone());
        assert_eq!(
            disabled.inner.config.get_ssl_mode(),
            SslMode::Disable,
            "disable stays as asked"
        );
        let preferred = PostgresStore::connect("postgres://u@h/db", "t")
            .unwrap()
            .with_tls(tls);
        assert_eq!(preferred.inner.config.get_ssl_mode(), SslMode::Require);
    }

    #[test]
    fn debug_never_shows_the_password() {
        for url in [
            "postgres://worker:hunter2-pg@db.example:5433/app?sslmode=require",
            "host=db.example port=5433 user=worker password=hunter2-pg dbname=app",
        ] {
            let store = PostgresStore::connect(url, "idempotency").unwrap();
            let text = format!("{store:?}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(
                text.contains("<redacted>") && text.contains("db.example"),
                "{text}"
            );
        }
        let err = PostgresStore::connect("postgres://worker:hunter2-pg@db.example:x/app", "t")
            .unwrap_err();
        for text in [format!("{err}"), format!("{err:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        let store = PostgresStore::connect("postgres://u@h/db", "s\".x.t\"; DROP").unwrap();
        assert_eq!(store.inner.quoted, "\"s\"\"\".\"x.t\"\"; DROP\"");
        assert!(PostgresStore::connect("postgres://u@h/db", "").is_err());
        assert!(matches!(
            PostgresStore::connect("postgres://u@h:notaport/db", "t"),
            Err(Error::Store {
                retryable: false,
                ..
            })
        ));
    }
}

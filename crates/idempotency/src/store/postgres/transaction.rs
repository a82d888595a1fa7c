//! The completion with the function's writes ([`PostgresWrites`]): one transaction, on a
//! connection of its own.
//!
//! The store's main connection is one multiplexed [`Client`] shared by every concurrent
//! request, so a transaction cannot run on it: another request's statements would land
//! inside it. Transactions run on a second connection, opened on first use with the same
//! configuration and TLS as the main one, held behind an async mutex: one transaction at
//! a time per store (clones share it), each bounded, waiting for the mutex included, by
//! the store's request timeout. A transaction cut off by that bound (or by the engine's
//! attempt timeout) drops its connection, after asking the server to cancel the statement
//! in flight, so the server rolls it back and frees the record's row lock at once rather
//! than when a long statement ends.

use super::error::{breaks, integrity_violation, is_retryable, lost_prepared_statement};
use super::id::stored_id;
use super::requests::secs;
use super::writes::{PostgresWrites, WriteStatement};
use super::{BACKEND, PostgresStore};
use crate::error::Error;
use crate::record::{Claim, Status};
use crate::store::Writes;
use std::fmt;
use std::time::SystemTime;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{CancelToken, Client, Row, Statement};

/// The most statements a transaction connection keeps prepared (the store's two and the
/// function's): statements built from varying text are prepared for one use beyond it.
const MAX_PREPARED: usize = 64;

/// The connection transactions run on, and the statements prepared on it.
pub(super) struct TxConnection {
    client: Client,
    statements: Vec<(String, Statement)>,
}

/// Why a transaction stops before its `COMMIT`.
enum Stop {
    /// The answer, once rolled back: the lease lost, the record already completed by an
    /// earlier attempt, the writes refused.
    Answer(Result<(), Error>),
    /// A request failed; `broken` if the connection went with it.
    Failed { error: Error, broken: bool },
}

impl PostgresStore {
    /// [`complete_with`](crate::store::IdempotencyStore::complete_with): see the module docs.
    pub(super) async fn send_completion_with(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &Writes,
    ) -> Result<(), Error> {
        let writes = writes.of::<PostgresWrites>()?;
        let bound = self.request_timeout;
        let transaction = self.completion_transaction(claim, data, expiration, writes);
        match tokio::time::timeout(bound, transaction).await {
            Ok(result) => result,
            // Dropping the unfinished transaction cancels its statement and drops its
            // connection: the server rolls it back.
            Err(_) => Err(self.timed_out("answer", bound)),
        }
    }

    async fn completion_transaction(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &PostgresWrites,
    ) -> Result<(), Error> {
        if let Some((index, keyword)) = writes
            .statements
            .iter()
            .enumerate()
            .find_map(|(i, st)| transaction_control(&st.sql).map(|k| (i, k)))
        {
            return Err(Error::WritesInvalid {
                key: claim.id.clone(),
                reason: format!(
                    "statement {index} is {keyword}, which would end or change the completion's transaction or the session: only statements that read or write rows commit with the record"
                ),
            });
        }
        let mut slot = self.inner.transactions.lock().await;
        let connection = match slot.take() {
            Some(connection) if !connection.client.is_closed() => connection,
            _ => TxConnection {
                client: self.open().await?,
                statements: Vec::new(),
            },
        };
        let mut open = Open {
            store: self,
            connection: Some(connection),
        };
        let (result, reusable) = open.run(claim, data, expiration, writes).await;
        let connection = open.connection.take();
        if reusable {
            *slot = connection;
        }
        result
    }

    /// `BEGIN` and the transaction's protections, in one round trip: a Lambda frozen while
    /// the transaction was open must not keep the record's row locked (the server ends such
    /// a session), and no lock is waited for longer than a request may take. Set with
    /// `SET LOCAL` in every transaction, so that nothing an earlier one ran on the
    /// connection (a function's `set_config(…, false)`) weakens them.
    fn begin_sql(&self) -> String {
        let ms = self.request_timeout.as_millis().clamp(1, i32::MAX as u128);
        format!(
            "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
        )
    }

    /// Asks the server, on a connection of its own, to cancel what the connection of
    /// `token` is running: best effort, in the background, bounded by the connect timeout.
    fn cancel_later(&self, token: CancelToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let tls = match self.inner.config.get_ssl_mode() {
            SslMode::Disable => None,
            _ => match self.tls_config() {
                Ok(tls) => Some(tls),
                Err(_) => return,
            },
        };
        let bound = self
            .inner
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(super::DEFAULT_CONNECT_TIMEOUT);
        runtime.spawn(async move {
            let cancel = async {
                match tls {
                    None => token.cancel_query(tokio_postgres::NoTls).await,
                    Some(tls) => {
                        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls);
                        token.cancel_query(tls).await
                    }
                }
            };
            match tokio::time::timeout(bound, cancel).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "cannot cancel a cut-off idempotency transaction")
                }
                Err(_) => tracing::debug!("cancelling a cut-off idempotency transaction timed out"),
            }
        });
    }
}

/// A transaction's connection while it runs: dropped unfinished (cut off by a timeout),
/// its statement is cancelled and the connection closed, so the server rolls back.
struct Open<'a> {
    store: &'a PostgresStore,
    connection: Option<TxConnection>,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.store.cancel_later(connection.client.cancel_token());
        }
    }
}

impl Open<'_> {
    /// `BEGIN`, the record locked and checked, the writes, the completion, `COMMIT`; or
    /// `ROLLBACK`. The answer, and whether the connection can be used again.
    async fn run(
        &mut self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &PostgresWrites,
    ) -> (Result<(), Error>, bool) {
        let store = self.store;
        let connection = self.connection.as_mut().expect("held until the end");
        if let Err(e) = connection.client.batch_execute(&store.begin_sql()).await {
            // Not reused: a transaction may have begun without its protections.
            return (Err(store.pg_error(e)), false);
        }
        match connection
            .body(store, claim, data, expiration, writes)
            .await
        {
            Ok(()) => match connection.client.batch_execute("COMMIT").await {
                Ok(()) => (Ok(()), true),
                // The transaction is over either way (a deferred constraint refused at
                // `COMMIT`, a serialization failure); an answer lost leaves its outcome
                // unknown, and the retry finds out under the record's lock.
                Err(e) => {
                    let broken = breaks(&e);
                    let error = match integrity_violation(&e) {
                        Some(code) => {
                            refused(claim, Some(code), format!("at COMMIT: SQLSTATE {code}"))
                        }
                        None => store.pg_error(e),
                    };
                    (Err(error), !broken)
                }
            },
            Err(stop) => {
                let (answer, broken) = match stop {
                    Stop::Answer(answer) => (answer, false),
                    Stop::Failed { error, broken } => (Err(error), broken),
                };
                if broken {
                    return (answer, false);
                }
                let rolled_back = connection.client.batch_execute("ROLLBACK").await.is_ok();
                (answer, rolled_back)
            }
        }
    }
}

impl TxConnection {
    /// Between `BEGIN` and `COMMIT`: `Ok` to commit.
    async fn body(
        &mut self,
        store: &PostgresStore,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &PostgresWrites,
    ) -> Result<(), Stop> {
        let sql = &store.inner.sql;
        let id = stored_id(&claim.id);
        let lease_lost = || {
            Stop::Answer(Err(Error::LeaseLost {
                key: claim.id.clone(),
            }))
        };
        let rows = self.ours(store, &sql.lock, &[(&id, Type::TEXT)]).await?;
        let Some(row) = rows.first() else {
            return Err(lease_lost());
        };
        let read = |e: tokio_postgres::Error| Stop::Failed {
            error: store.malformed(e),
            broken: false,
        };
        let status: String = row.try_get(0).map_err(read)?;
        let token: Option<String> = row.try_get(1).map_err(read)?;
        if token.as_deref() != Some(claim.lease_token.as_str()) {
            return Err(lease_lost());
        }
        if status == Status::Completed.as_str() {
            // An earlier attempt committed and its answer was lost: written already.
            return Err(Stop::Answer(Ok(())));
        }
        for (index, statement) in writes.statements.iter().enumerate() {
            self.write(store, claim, index, statement).await?;
        }
        let expiration = secs(expiration);
        let rows = self
            .ours(
                store,
                &sql.complete,
                &[
                    (&id, Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                    (&data, Type::TEXT),
                    (&expiration, Type::INT8),
                ],
            )
            .await?;
        if rows.is_empty() {
            // Not reachable: the row is locked with our token.
            return Err(lease_lost());
        }
        Ok(())
    }

    /// One of the function's statements: refused if it breaks an integrity constraint or
    /// changes other than the rows it expects.
    async fn write(
        &mut self,
        store: &PostgresStore,
        claim: &Claim,
        index: usize,
        statement: &WriteStatement,
    ) -> Result<(), Stop> {
        let prepared = match self.prepare(&statement.sql, &[], store.prepared).await {
            Ok(prepared) => prepared,
            Err(e) => return Err(self.write_failed(index, e)),
        };
        let changed = match self.client.execute(&prepared, &statement.params()).await {
            Ok(changed) => changed,
            Err(e) => {
                if let Some(code) = integrity_violation(&e) {
                    let constraint = e
                        .as_db_error()
                        .and_then(|db| db.constraint())
                        .map(|c| format!(" (constraint {c:?})"))
                        .unwrap_or_default();
                    let reason = format!("statement {index}: SQLSTATE {code}{constraint}");
                    return Err(Stop::Answer(Err(refused(claim, Some(code), reason))));
                }
                return Err(self.write_failed(index, e));
            }
        };
        match statement.rows {
            Some(expected) if expected != changed => {
                let reason =
                    format!("statement {index} changed {changed} rows, expected {expected}");
                Err(Stop::Answer(Err(refused(claim, None, reason))))
            }
            _ => Ok(()),
        }
    }

    /// A statement of the function's that failed otherwise: a store error, retryable as the
    /// store's own are, naming the statement. The statements prepared on the connection are
    /// forgotten (the session may have lost them, or a migration changed what one returns),
    /// so the next transaction prepares them again.
    fn write_failed(&mut self, index: usize, e: tokio_postgres::Error) -> Stop {
        self.statements.clear();
        Stop::Failed {
            broken: breaks(&e),
            error: Error::store(BACKEND, is_retryable(&e), WriteFailed { index, source: e }),
        }
    }

    /// One of the store's statements on the record.
    async fn ours(
        &mut self,
        store: &PostgresStore,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Stop> {
        let rows = if store.prepared {
            let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            match self.prepare(sql, &types, true).await {
                Ok(statement) => self.client.query(&statement, &values).await,
                Err(e) => Err(e),
            }
        } else {
            self.client.query_typed(sql, params).await
        };
        rows.map_err(|e| {
            if lost_prepared_statement(&e) {
                self.statements.clear();
            }
            Stop::Failed {
                broken: breaks(&e),
                error: store.pg_error(e),
            }
        })
    }

    /// `sql` prepared on this connection: from its cache, or now (cached if `keep`).
    async fn prepare(
        &mut self,
        sql: &str,
        types: &[Type],
        keep: bool,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some((_, statement)) = self.statements.iter().find(|(text, _)| text == sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare_typed(sql, types).await?;
        if keep && self.statements.len() < MAX_PREPARED {
            self.statements.push((sql.to_owned(), statement.clone()));
        }
        Ok(statement)
    }
}

/// A refusal by the writes' own condition. A foreign key's parent row may arrive later (a
/// standard queue delivers out of order): that one is retryable.
fn refused(claim: &Claim, code: Option<&str>, reason: String) -> Error {
    Error::WritesRefused {
        key: claim.id.clone(),
        reason,
        retryable: code.is_some_and(super::error::may_hold_later),
    }
}

/// A statement of the function's writes that failed (not a refusal): names its index; the
/// driver's error is the source.
#[derive(Debug)]
struct WriteFailed {
    index: usize,
    source: tokio_postgres::Error,
}

impl fmt::Display for WriteFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "statement {} of the function's writes failed: {}",
            self.index, self.source
        )
    }
}

impl std::error::Error for WriteFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The first keyword of `sql`, if it is one that would end or change the completion's
/// transaction or the connection's session (`COMMIT`, `ROLLBACK`, `SET`, ...).
fn transaction_control(sql: &str) -> Option<&'static str> {
    const REFUSED: [&str; 15] = [
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "PREPARE",
        "SET",
        "RESET",
        "DISCARD",
        "LISTEN",
        "UNLISTEN",
        "DO",
    ];
    let mut rest = sql.trim_start();
    loop {
        if let Some(line) = rest.strip_prefix("--") {
            rest = line.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(block) = rest.strip_prefix("/*") {
            rest = block.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase();
    REFUSED.iter().find(|k| **k == word).copied()
}

#[cfg(test)]
mod tests {
    use super::transaction_control;

    #[test]
    fn transaction_and_session_control_is_found_behind_comments_and_case() {
        for sql in [
            "COMMIT",
            " commit;",
            "-- c\nROLLBACK",
            "/* x */ set search_path = x",
            "Begin",
            "DO $$ BEGIN END $$",
        ] {
            assert!(transaction_control(sql).is_some(), "{sql}");
        }
        for sql in [
            "INSERT INTO a VALUES ($1)",
            "UPDATE t SET x = 1",
            "  delete from t",
            "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x",
            "SELECT pg_sleep(1)",
            "settings",
        ] {
            assert_eq!(transaction_control(sql), None, "{sql}");
        }
    }
}

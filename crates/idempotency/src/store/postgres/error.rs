//! Which driver errors a later attempt may get past, and which break the connection
//! (each list written once, from the SQLSTATE codes in [`sqlstate`]), and the store's own
//! error messages.

use super::{BACKEND, PostgresStore};
use crate::error::{BoxError, Error};
use std::fmt;
use std::time::Duration;

/// The server's SQLSTATE codes the store acts on, by PostgreSQL's condition names
/// (Appendix A of its manual); a class is a code's first characters, matched as a prefix.
mod sqlstate {
    /// Class `08`: connection exception.
    pub(super) const CONNECTION_EXCEPTION: &str = "08";
    /// Class `57P`: the server ends the session (shutdowns, `database_dropped`,
    /// `idle_session_timeout`).
    pub(super) const SESSION_ENDED: &str = "57P";
    /// A writer that became a reader after a failover.
    pub(super) const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    pub(super) const SERIALIZATION_FAILURE: &str = "40001";
    pub(super) const DEADLOCK_DETECTED: &str = "40P01";
    pub(super) const LOCK_NOT_AVAILABLE: &str = "55P03";
    /// A statement cut off by `statement_timeout` or a cancel.
    pub(super) const QUERY_CANCELED: &str = "57014";
    pub(super) const ADMIN_SHUTDOWN: &str = "57P01";
    pub(super) const CRASH_SHUTDOWN: &str = "57P02";
    pub(super) const CANNOT_CONNECT_NOW: &str = "57P03";
    /// The server ended an idle session (`idle_session_timeout`).
    pub(super) const IDLE_SESSION_TIMEOUT: &str = "57P05";
    pub(super) const TOO_MANY_CONNECTIONS: &str = "53300";
    pub(super) const UNDEFINED_TABLE: &str = "42P01";
    /// A prepared statement the session no longer has (a pooler's `DISCARD ALL`, a
    /// transaction-mode pooler that moved the client to another server connection).
    pub(super) const INVALID_SQL_STATEMENT_NAME: &str = "26000";
    /// Class `23`: integrity constraint violation (unique, foreign key, check, not null,
    /// exclusion).
    pub(super) const INTEGRITY_CONSTRAINT_VIOLATION: &str = "23";
    /// A foreign key's parent row is missing: it may be written later.
    pub(super) const FOREIGN_KEY_VIOLATION: &str = "23503";
}

/// The SQLSTATE of an integrity constraint violation (class `23`), if `err` is one: the
/// function's writes are then refused, not retried.
pub(super) fn integrity_violation(err: &tokio_postgres::Error) -> Option<&str> {
    err.code()
        .map(|code| code.code())
        .filter(|code| code.starts_with(sqlstate::INTEGRITY_CONSTRAINT_VIOLATION))
}

/// Whether an integrity violation's condition can come to hold on a later delivery: a
/// foreign key whose parent row is written later (a standard queue delivers out of order).
pub(super) fn may_hold_later(code: &str) -> bool {
    code == sqlstate::FOREIGN_KEY_VIOLATION
}

/// Whether the error says the session lost a statement prepared on it: the cache is
/// cleared, and the retry prepares again.
pub(super) fn lost_prepared_statement(err: &tokio_postgres::Error) -> bool {
    err.code()
        .is_some_and(|code| code.code() == sqlstate::INVALID_SQL_STATEMENT_NAME)
}

/// Answers (codes or classes) after which the connection is no longer usable.
const BREAKS_CONNECTION: &[&str] = &[
    sqlstate::CONNECTION_EXCEPTION,
    sqlstate::SESSION_ENDED,
    sqlstate::READ_ONLY_SQL_TRANSACTION,
];

/// Answers (codes or classes) a later attempt may get past, on this connection or a new
/// one.
const RETRYABLE: &[&str] = &[
    sqlstate::CONNECTION_EXCEPTION,
    sqlstate::SERIALIZATION_FAILURE,
    sqlstate::DEADLOCK_DETECTED,
    sqlstate::LOCK_NOT_AVAILABLE,
    sqlstate::QUERY_CANCELED,
    sqlstate::ADMIN_SHUTDOWN,
    sqlstate::CRASH_SHUTDOWN,
    sqlstate::CANNOT_CONNECT_NOW,
    sqlstate::IDLE_SESSION_TIMEOUT,
    sqlstate::TOO_MANY_CONNECTIONS,
    sqlstate::READ_ONLY_SQL_TRANSACTION,
    sqlstate::INVALID_SQL_STATEMENT_NAME,
];

/// Whether the SQLSTATE `code` is one of `list` or in one of its classes.
fn listed(code: &str, list: &[&str]) -> bool {
    list.iter().any(|entry| code.starts_with(entry))
}

/// Whether the error means the connection is no longer usable.
pub(super) fn breaks_connection(source: &BoxError) -> bool {
    source
        .downcast_ref::<tokio_postgres::Error>()
        .is_some_and(breaks)
}

/// Whether the driver's error means the connection is no longer usable.
pub(super) fn breaks(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() || io_error(err).is_some() {
        return true;
    }
    err.code()
        .is_some_and(|code| listed(code.code(), BREAKS_CONNECTION))
}

fn io_error(err: &tokio_postgres::Error) -> Option<&std::io::Error> {
    std::error::Error::source(err).and_then(|s| s.downcast_ref::<std::io::Error>())
}

/// Whether a later attempt of the same call may succeed.
pub(super) fn is_retryable(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    if let Some(code) = err.code() {
        return listed(code.code(), RETRYABLE);
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

impl PostgresStore {
    /// A driver error as [`Error::Store`]: a missing table named, the rest as they are.
    pub(super) fn pg_error(&self, err: tokio_postgres::Error) -> Error {
        if err.code().map(|code| code.code()) == Some(sqlstate::UNDEFINED_TABLE) {
            return Error::store(
                BACKEND,
                false,
                MissingTable {
                    table: self.inner.table.name.clone(),
                    source: err,
                },
            );
        }
        Error::store(BACKEND, is_retryable(&err), err)
    }

    /// A failed connect: retryable as the driver's error is, naming the servers
    /// (`host:port`, never the user or password); the driver's error is the source.
    pub(super) fn connect_error(&self, err: tokio_postgres::Error) -> Error {
        Error::store(
            BACKEND,
            is_retryable(&err),
            ConnectError {
                servers: self.servers(),
                source: err,
            },
        )
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
    pub(super) fn timed_out(&self, what: &'static str, after: Duration) -> Error {
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

    /// A row that is not a valid record: not retryable.
    pub(super) fn malformed(&self, what: impl fmt::Display) -> Error {
        Error::store(
            BACKEND,
            false,
            format!(
                "malformed idempotency row in {}: {what}",
                self.inner.table.name
            ),
        )
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

/// A connect that failed: names the servers, as the Redis store's does; the driver's
/// error is the source.
#[derive(Debug)]
struct ConnectError {
    servers: String,
    source: tokio_postgres::Error,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to PostgreSQL at {}: {}",
            self.servers, self.source
        )
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::error::SqlState;

    #[test]
    fn the_codes_are_the_drivers() {
        for (ours, theirs) in [
            (
                sqlstate::READ_ONLY_SQL_TRANSACTION,
                SqlState::READ_ONLY_SQL_TRANSACTION,
            ),
            (
                sqlstate::SERIALIZATION_FAILURE,
                SqlState::T_R_SERIALIZATION_FAILURE,
            ),
            (sqlstate::DEADLOCK_DETECTED, SqlState::T_R_DEADLOCK_DETECTED),
            (sqlstate::LOCK_NOT_AVAILABLE, SqlState::LOCK_NOT_AVAILABLE),
            (sqlstate::QUERY_CANCELED, SqlState::QUERY_CANCELED),
            (sqlstate::ADMIN_SHUTDOWN, SqlState::ADMIN_SHUTDOWN),
            (sqlstate::CRASH_SHUTDOWN, SqlState::CRASH_SHUTDOWN),
            (sqlstate::CANNOT_CONNECT_NOW, SqlState::CANNOT_CONNECT_NOW),
            (
                sqlstate::IDLE_SESSION_TIMEOUT,
                SqlState::IDLE_SESSION_TIMEOUT,
            ),
            (
                sqlstate::TOO_MANY_CONNECTIONS,
                SqlState::TOO_MANY_CONNECTIONS,
            ),
            (sqlstate::UNDEFINED_TABLE, SqlState::UNDEFINED_TABLE),
            (
                sqlstate::INVALID_SQL_STATEMENT_NAME,
                SqlState::INVALID_SQL_STATEMENT_NAME,
            ),
        ] {
            assert_eq!(ours, theirs.code());
        }
        assert!(
            SqlState::CONNECTION_FAILURE
                .code()
                .starts_with(sqlstate::CONNECTION_EXCEPTION)
        );
        assert!(
            SqlState::DATABASE_DROPPED
                .code()
                .starts_with(sqlstate::SESSION_ENDED)
        );
    }

    #[test]
    fn the_lists_hold_what_the_docs_say() {
        for code in ["08000", "08006", "57P01", "57P04", "25006"] {
            assert!(
                listed(code, BREAKS_CONNECTION),
                "{code} breaks the connection"
            );
        }
        for code in [
            "08000", "08006", "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03",
            "57P05", "53300", "25006",
        ] {
            assert!(listed(code, RETRYABLE), "{code} is retryable");
        }
        for code in ["57P04", "42P01", "23505", "42501", "28P01"] {
            assert!(!listed(code, RETRYABLE), "{code} is not retryable");
        }
        for code in ["40001", "55P03", "57014", "53300", "42P01"] {
            assert!(
                !listed(code, BREAKS_CONNECTION),
                "{code} keeps the connection"
            );
        }
    }
}

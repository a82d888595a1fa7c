//! Which driver errors a later attempt may get past, and which break the connection:
//! each list written once.

use super::BACKEND;
use crate::error::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use std::sync::Arc;

/// Answers after which the connection may be unusable besides an I/O error (a dropped,
/// refused or timed-out connection): its node is no longer the primary (after a
/// failover, reconnecting to the same endpoint reaches the new one), or the cluster
/// client lost the node. Retryable, on a new connection.
const BREAKS_CONNECTION: &[ErrorKind] = &[
    ErrorKind::Server(ServerErrorKind::ReadOnly),
    ErrorKind::Server(ServerErrorKind::MasterDown),
    ErrorKind::ClusterConnectionNotFound,
];

/// Transient server answers that leave the connection usable: retried on it.
/// `MOVED`/`ASK` reach us only when the cluster client gave up following them.
const TRANSIENT: &[ErrorKind] = &[
    ErrorKind::Server(ServerErrorKind::TryAgain),
    ErrorKind::Server(ServerErrorKind::BusyLoading),
    ErrorKind::Server(ServerErrorKind::ClusterDown),
    ErrorKind::Server(ServerErrorKind::Moved),
    ErrorKind::Server(ServerErrorKind::Ask),
];

/// Transient server answers the driver has no kind for, by code: `BUSY` while another
/// client's script runs, `OOM` from a full server under `noeviction` (memory frees as
/// records expire).
const TRANSIENT_CODES: &[&str] = &["BUSY", "OOM"];

/// Whether the connection that answered `err` may be unusable ([`BREAKS_CONNECTION`], or
/// an I/O error).
pub(super) fn breaks_connection(err: &RedisError) -> bool {
    // A dropped, refused or timed-out connection is an I/O error.
    err.is_io_error() || BREAKS_CONNECTION.contains(&err.kind())
}

/// Maps a driver error to [`Error::Store`], keeping it as the source (downcast it to
/// [`redis::RedisError`]; a failed connect's source is a message naming the server, whose
/// `source()` is the `RedisError`). Retryable: the connection dropped, refused or timed
/// out, and the server's transient answers (`TRYAGAIN`, `LOADING`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `READONLY` after a failover, redirects the cluster client gave up on,
/// `BUSY` while another client's script runs, `OOM` from a full server under
/// `noeviction`: memory frees as records expire).
pub(super) fn store_error(err: RedisError) -> Error {
    Error::store(BACKEND, is_retryable(&err), err)
}

/// Whether a later attempt of the same request may succeed: what breaks the connection
/// (a new one may work) and the transient answers, unless the client itself refused.
pub(super) fn is_retryable(err: &RedisError) -> bool {
    // A certificate or protocol the client refuses fails the same way every time.
    let refused = err.is_io_error()
        && (matches!(err.retry_method(), redis::RetryMethod::NoRetry) || invalid_data(err));
    !refused
        && (breaks_connection(err)
            || TRANSIENT.contains(&err.kind())
            || err
                .code()
                .is_some_and(|code| TRANSIENT_CODES.contains(&code)))
}

/// Whether `err` holds a TLS refusal (an untrusted or mismatched certificate, a protocol
/// the other side will not speak): rustls's own error, or the `InvalidData` I/O error it
/// travels in.
fn invalid_data(err: &RedisError) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let refusal = |e: &(dyn std::error::Error + 'static)| {
        e.downcast_ref::<rustls::Error>().is_some()
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                io.kind() == std::io::ErrorKind::InvalidData
                    && io
                        .get_ref()
                        .is_some_and(|inner| inner.is::<rustls::Error>())
            })
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(c) = cause {
        // redis-rs keeps the I/O error in an `Arc`, which is the source it reports.
        if refusal(c)
            || c.downcast_ref::<Shared>()
                .is_some_and(|shared| refusal(&**shared))
        {
            return true;
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_drop_the_connection_and_which_are_retried() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "socket"));
        let server = |kind| RedisError::from((ErrorKind::Server(kind), "server"));
        for err in [
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::TimedOut),
            io(std::io::ErrorKind::BrokenPipe),
            server(ServerErrorKind::ReadOnly),
            server(ServerErrorKind::MasterDown),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "gone")),
        ] {
            assert!(breaks_connection(&err), "{err} drops the connection");
            assert!(store_error(err).is_retryable());
        }
        for err in [
            server(ServerErrorKind::NoScript),
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::ClusterDown),
            RedisError::from((ErrorKind::AuthenticationFailed, "auth")),
            RedisError::from((ErrorKind::UnexpectedReturnType, "type")),
        ] {
            assert!(!breaks_connection(&err), "{err} keeps the connection");
        }
        for (err, retryable) in [
            (server(ServerErrorKind::TryAgain), true),
            (server(ServerErrorKind::BusyLoading), true),
            (server(ServerErrorKind::ClusterDown), true),
            (server(ServerErrorKind::ResponseError), false),
            (
                RedisError::from((ErrorKind::AuthenticationFailed, "auth")),
                false,
            ),
            (io(std::io::ErrorKind::PermissionDenied), false),
        ] {
            let text = err.to_string();
            assert_eq!(store_error(err).is_retryable(), retryable, "{text}");
        }
    }
}

//! Store requests under a deadline: attempts cut off by a timeout, retried with backoff
//! on retryable errors, never past the lease's cutoff.

use super::Engine;
use crate::clock;
use crate::config;
use crate::error::Error;
use crate::store::BoxFuture;
use std::time::{Duration, SystemTime};
use tracing::warn;

/// The shortest time given to one store attempt, even when the cutoff has passed: a
/// result already paid for gets one real try, and the batch's own deadline still bounds
/// the invocation.
pub(crate) const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(100);

impl Engine {
    /// Runs one store request up to `max_attempts` times on retryable errors, with
    /// backoff. Every attempt is cut off after the attempt timeout or at `cutoff`,
    /// whichever comes first (a timed-out attempt is a retryable error: it may have been
    /// applied, which the store's own-token conditions make safe to repeat), and no
    /// retry starts past `cutoff`. The engine is the only retrier: it knows the deadline.
    ///
    /// `operation` names the request in the metrics (each attempt counted, with its
    /// latency) and on the current span (`{operation}_ms`: the whole request, retries
    /// included).
    pub(crate) async fn retry<'a, R>(
        &self,
        cutoff: SystemTime,
        max_attempts: u32,
        operation: &'static str,
        op: impl FnMut() -> BoxFuture<'a, Result<R, Error>>,
    ) -> Result<R, Error> {
        let field = match operation {
            "claim" => Some("claim_ms"),
            "complete" => Some("complete_ms"),
            "release" => Some("release_ms"),
            // An operator's request: no call's span.
            _ => None,
        };
        // On the call's own span only: when it is filtered out, the current span is the
        // caller's, whose fields are not ours to write. Timed only when it is there.
        let timed = field
            .map(|field| (field, tracing::Span::current()))
            .filter(|(_, span)| span.metadata().is_some_and(|m| m.name() == "idempotency"))
            .map(|timed| (timed, std::time::Instant::now()));
        let result = self.attempts(cutoff, max_attempts, operation, op).await;
        if let Some(((field, span), started)) = timed {
            span.record(field, started.elapsed().as_secs_f64() * 1000.0);
        }
        result
    }

    async fn attempts<'a, R>(
        &self,
        cutoff: SystemTime,
        max_attempts: u32,
        operation: &'static str,
        mut op: impl FnMut() -> BoxFuture<'a, Result<R, Error>>,
    ) -> Result<R, Error> {
        let mut backoff = config::BASE_BACKOFF;
        let mut attempt = 1;
        loop {
            let left = clock::until(self.now(), cutoff);
            let timeout = self
                .config
                .store_attempt_timeout
                .min(left)
                .max(MIN_ATTEMPT_TIMEOUT);
            let attempt_started = std::time::Instant::now();
            let request = crate::store::attempt_bound::within(timeout, op());
            let (result, label) = match tokio::time::timeout(timeout, request).await {
                Ok(Ok(answer)) => (Ok(answer), "ok"),
                // A refusal the protocol expects (a lost lease) is an answer, not an error.
                Ok(Err(e @ Error::LeaseLost { .. })) => (Err(e), "ok"),
                Ok(Err(e)) => (Err(e), "error"),
                Err(_) => (
                    Err(Error::store(
                        self.store.name(),
                        true,
                        format!("no answer within {timeout:?}; the request may have been applied"),
                    )),
                    "timeout",
                ),
            };
            self.store_keys
                .request(operation, label, attempt_started.elapsed());
            match result {
                Err(err) if err.is_retryable_store_error() && attempt < max_attempts => {
                    let sleep = jitter(backoff);
                    // A retry starts only if its shortest attempt also ends by the cutoff.
                    if clock::add(self.now(), sleep + MIN_ATTEMPT_TIMEOUT) > cutoff {
                        return Err(err);
                    }
                    warn!(error = %crate::error::report(&err), attempt, "store request failed; retrying");
                    tokio::time::sleep(sleep).await;
                    backoff = (backoff * 2).min(config::MAX_BACKOFF);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + fastrand::f64() * 0.5)
}

//! Settings of an [`Idempotency`](crate::Idempotency) handle, and their defaults.

use std::time::Duration;

/// How long a record counts, by default: SQS's longest message lifetime (14 days of
/// retention) plus a day of margin for receives and visibility timeouts. Powertools'
/// one hour suits HTTP retries, not queues. Too short re-runs the work for a late
/// redelivery; too long only costs storage, so this errs long.
pub(crate) const DEFAULT_EXPIRES_AFTER: Duration = Duration::from_secs(15 * 24 * 60 * 60);

/// Claim attempts when the record changes between the write and the read that follows.
pub(crate) const DEFAULT_MAX_CLAIM_ATTEMPTS: u32 = 3;

/// Attempts of one store request on a retryable store error (throttling, 5xx, a timeout),
/// never past the lease's cutoff. The engine, which knows the deadline, owns retries: the
/// DynamoDB and PostgreSQL clients are built with none of their own, and the Redis
/// Cluster client only follows a redirect or reconnects (at most twice, within one
/// attempt's timeout).
pub(crate) const DEFAULT_MAX_STORE_ATTEMPTS: u32 = 3;

/// The longest one store request may take before it is abandoned (and retried, within
/// the lease). DynamoDB answers in milliseconds; a request without an answer after this
/// long has stalled, and waiting on it would let Lambda kill the invocation and lose the
/// whole batch's response. Every attempt is also cut at the lease's cutoff.
pub(crate) const DEFAULT_STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// First backoff between store retries; it doubles up to [`MAX_BACKOFF`].
pub(crate) const BASE_BACKOFF: Duration = Duration::from_millis(25);

/// Longest backoff between store retries.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Set to `true` (or `1`) to run functions without idempotency, for tests. Powertools' name.
pub(crate) const DISABLED_ENV: &str = "POWERTOOLS_IDEMPOTENCY_DISABLED";

/// Settings of an [`Idempotency`](crate::Idempotency) handle, set through
/// [`Idempotency::builder`](crate::Idempotency::builder).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// How long a record counts. See [`DEFAULT_EXPIRES_AFTER`] and [`expiry_for_queue`].
    pub(crate) expires_after: Duration,
    /// A fixed lease instead of the Lambda invocation's deadline.
    pub(crate) lease: Option<Duration>,
    /// The first part of every stored id: the Lambda function's name by default.
    pub(crate) function_name: String,
    /// See [`DEFAULT_MAX_CLAIM_ATTEMPTS`].
    pub(crate) max_claim_attempts: u32,
    /// See [`DEFAULT_MAX_STORE_ATTEMPTS`].
    pub(crate) max_store_attempts: u32,
    /// See [`DEFAULT_STORE_ATTEMPT_TIMEOUT`].
    pub(crate) store_attempt_timeout: Duration,
    /// Completed records kept in memory to answer duplicates without a store request.
    /// 0 turns the cache off.
    pub(crate) local_cache_capacity: usize,
    /// Functions run without idempotency. See [`DISABLED_ENV`].
    pub(crate) disabled: bool,
    /// Every operation of the handle is at-most-once, as if built with
    /// [`Operation::at_most_once`](crate::Operation::at_most_once).
    pub(crate) at_most_once: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            expires_after: DEFAULT_EXPIRES_AFTER,
            lease: None,
            function_name: std::env::var("AWS_LAMBDA_FUNCTION_NAME")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "local".into()),
            max_claim_attempts: DEFAULT_MAX_CLAIM_ATTEMPTS,
            max_store_attempts: DEFAULT_MAX_STORE_ATTEMPTS,
            store_attempt_timeout: DEFAULT_STORE_ATTEMPT_TIMEOUT,
            local_cache_capacity: 0,
            disabled: disabled_by_env(),
            at_most_once: false,
        }
    }
}

fn disabled_by_env() -> bool {
    disabled_by(std::env::var(DISABLED_ENV).ok().as_deref())
}

/// Whether the kill switch's value turns idempotency off: `1`, `true` or `yes`, in any case.
fn disabled_by(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// The record expiry that covers a message's whole life in an SQS queue: retention plus
/// every receive's visibility timeout. A record that expires earlier lets a late
/// redelivery run the work again.
///
/// ```
/// use lambda_idempotency::expiry_for_queue;
/// use std::time::Duration;
/// // 4 days retention, 5 receives of 6 minutes each.
/// let expiry = expiry_for_queue(Duration::from_secs(4 * 86400), 5, Duration::from_secs(360));
/// assert_eq!(expiry, Duration::from_secs(4 * 86400 + 5 * 360));
/// ```
pub fn expiry_for_queue(
    retention: Duration,
    max_receive_count: u32,
    visibility_timeout: Duration,
) -> Duration {
    visibility_timeout
        .checked_mul(max_receive_count)
        .and_then(|receives| retention.checked_add(receives))
        .unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_expiry_is_sqs_longest_retention_plus_a_day() {
        let day = Duration::from_secs(86_400);
        assert_eq!(DEFAULT_EXPIRES_AFTER, 14 * day + day);
    }

    #[test]
    fn the_kill_switch_reads_true_one_or_yes() {
        for on in ["1", "true", "TRUE", " yes "] {
            assert!(disabled_by(Some(on)), "{on:?}");
        }
        for off in ["0", "false", "", "disabled"] {
            assert!(!disabled_by(Some(off)), "{off:?}");
        }
        assert!(!disabled_by(None));
    }
}

//! What the library counts, through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`): the application installs one recorder (Prometheus, CloudWatch EMF,
//! StatsD), once, and every count lands there; with none installed a count costs about an
//! atomic load. Labels come from fixed sets (outcomes, failure kinds, store operations) or
//! from settings (the function and operation names): never a key, an id or an error's text.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | [`OUTCOMES`] | counter | `function`, `operation`, `outcome` ([`Outcome::as_str`](crate::Outcome::as_str), or `in_progress`, `claim_abandoned`, `rejected`, `failed`, `lease_lost`, `store_error`, `panicked`, `cancelled`) |
//! | [`BATCH_FAILURES`] | counter | `kind` ([`FailureKind::as_str`](crate::FailureKind::as_str)) |
//! | [`BATCH_SKIPPED`] | counter | `reason` (`remove`: a DynamoDB Streams `REMOVE`) |
//! | [`STORE_REQUESTS`] | counter | `store`, `operation` (`claim`, `complete`, `release`, `get`; an operator's `forget`, `list`), `result` (`ok`, `error`, `timeout`) |
//! | [`STORE_REQUEST_SECONDS`] | histogram | `store`, `operation` |
//!
//! Without the feature every function here is a no-op and the crate does not depend on
//! `metrics`.

#[cfg(feature = "metrics")]
use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

/// Calls by how they were answered.
pub const OUTCOMES: &str = "idempotency_outcomes_total";
/// Batch records that failed, by [`FailureKind`](crate::FailureKind).
pub const BATCH_FAILURES: &str = "idempotency_batch_failures_total";
/// Batch records acknowledged without running, by reason.
pub const BATCH_SKIPPED: &str = "idempotency_batch_skipped_total";
/// Store request attempts, by store, operation and result.
pub const STORE_REQUESTS: &str = "idempotency_store_requests_total";
/// Store request attempts' latency, in seconds.
pub const STORE_REQUEST_SECONDS: &str = "idempotency_store_request_seconds";

/// Gives every metric its unit and help text. Call it once after installing a recorder.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        describe_counter!(
            OUTCOMES,
            Unit::Count,
            "Idempotent calls by outcome: executed, took_over, executed_unstored, replayed, replayed_from_cache, joined, in_progress_answered, disabled, in_progress, claim_abandoned, rejected, failed, lease_lost, store_error, panicked, cancelled"
        );
        describe_counter!(
            BATCH_FAILURES,
            Unit::Count,
            "Batch records that failed, by failure kind"
        );
        describe_counter!(
            BATCH_SKIPPED,
            Unit::Count,
            "Batch records acknowledged without running, by reason (remove)"
        );
        describe_counter!(
            STORE_REQUESTS,
            Unit::Count,
            "Store request attempts, by store, operation and result (ok, error, timeout)"
        );
        describe_histogram!(
            STORE_REQUEST_SECONDS,
            Unit::Seconds,
            "Store request attempts' latency"
        );
    }
}

/// Counts one call's outcome.
pub(crate) fn outcome(function: &str, operation: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    counter!(
        OUTCOMES,
        "function" => function.to_owned(),
        "operation" => operation.to_owned(),
        "outcome" => outcome
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (function, operation, outcome);
}

/// Counts one failed batch record.
#[cfg_attr(not(feature = "dynamodb-streams"), allow(dead_code))]
pub(crate) fn batch_skipped(reason: &'static str) {
    #[cfg(feature = "metrics")]
    counter!(BATCH_SKIPPED, "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

pub(crate) fn batch_failure(kind: &'static str) {
    #[cfg(feature = "metrics")]
    counter!(BATCH_FAILURES, "kind" => kind).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// Counts one store request attempt and its latency.
pub(crate) fn store_request(
    store: &'static str,
    operation: &'static str,
    result: &'static str,
    took: Duration,
) {
    #[cfg(feature = "metrics")]
    {
        counter!(STORE_REQUESTS, "store" => store, "operation" => operation, "result" => result)
            .increment(1);
        histogram!(STORE_REQUEST_SECONDS, "store" => store, "operation" => operation)
            .record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (store, operation, result, took);
}

/// Counts a call that never returned: dropped (`cancelled`) or unwound by a panic.
pub(crate) struct Unfinished<'a> {
    pub(crate) function: &'a str,
    pub(crate) operation: &'a str,
    /// Whether it is still to be counted.
    pub(crate) counted: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.counted {
            let outcome = if std::thread::panicking() {
                "panicked"
            } else {
                "cancelled"
            };
            self::outcome(self.function, self.operation, outcome);
        }
    }
}

/// The `outcome` label of a call's result.
pub(crate) fn outcome_label<T, E>(
    result: &Result<(T, crate::Outcome), crate::ExecuteError<E>>,
) -> &'static str {
    match result {
        Ok((_, outcome)) => outcome.as_str(),
        Err(crate::ExecuteError::Idempotency(e)) => error_label(e),
        Err(crate::ExecuteError::Function(_)) => "failed",
    }
}

/// The `outcome` label of the library's own error.
pub(crate) fn error_label(e: &crate::Error) -> &'static str {
    match e {
        // An in-progress answer that failed still leaves the call unanswered, in progress.
        crate::Error::AlreadyInProgress { .. }
        | crate::Error::InProgressAnswerIncompatible { .. } => "in_progress",
        crate::Error::ClaimAbandoned { .. } => "claim_abandoned",
        // A hook's answer that does not fit: refused, as a permanent failure is.
        crate::Error::ReplayAnswerIncompatible { .. } => "rejected",
        e if e.is_permanent() => "rejected",
        crate::Error::LeaseLost { .. } => "lease_lost",
        crate::Error::TwinFailed { .. } => "failed",
        _ => "store_error",
    }
}

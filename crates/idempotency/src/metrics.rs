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

/// The metadata every metric of the library is registered with (what `counter!` gives).
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Every `outcome` label, the most frequent first.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const OUTCOME_LABELS: [&str; 16] = [
    "replayed",
    "executed",
    "in_progress",
    "replayed_from_cache",
    "took_over",
    "joined",
    "executed_unstored",
    "in_progress_answered",
    "disabled",
    "claim_abandoned",
    "rejected",
    "failed",
    "lease_lost",
    "store_error",
    "panicked",
    "cancelled",
];

/// One function's and operation's [`OUTCOMES`] counters, their keys built once (cached by
/// the [`Operation`](crate::Operation)): a call counts its outcome without building,
/// hashing and dropping a label set. Without the `metrics` feature it holds nothing.
pub(crate) struct OutcomeKeys {
    #[cfg(feature = "metrics")]
    function: String,
    #[cfg(feature = "metrics")]
    operation: String,
    /// One key per [`OUTCOME_LABELS`] entry, in its order; none when not cached (each
    /// count builds its one key).
    #[cfg(feature = "metrics")]
    keys: Vec<metrics::Key>,
}

/// The names only: no metric keys.
impl std::fmt::Debug for OutcomeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OutcomeKeys");
        #[cfg(feature = "metrics")]
        d.field("function", &self.function)
            .field("operation", &self.operation);
        d.finish_non_exhaustive()
    }
}

impl OutcomeKeys {
    /// The keys of every outcome, built now.
    pub(crate) fn new(function: &str, operation: &str) -> Self {
        Self::of(function, operation, true)
    }

    /// No key built ahead: for a call under another function's name than the one its
    /// operation cached, each count builds the one key it needs.
    pub(crate) fn uncached(function: &str, operation: &str) -> Self {
        Self::of(function, operation, false)
    }

    fn of(function: &str, operation: &str, cached: bool) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (function, operation, cached);
        Self {
            #[cfg(feature = "metrics")]
            function: function.to_owned(),
            #[cfg(feature = "metrics")]
            operation: operation.to_owned(),
            #[cfg(feature = "metrics")]
            keys: OUTCOME_LABELS
                .iter()
                .filter(|_| cached)
                .map(|outcome| {
                    metrics::Key::from_parts(
                        OUTCOMES,
                        vec![
                            metrics::Label::new("function", function.to_owned()),
                            metrics::Label::new("operation", operation.to_owned()),
                            metrics::Label::from_static_parts("outcome", outcome),
                        ],
                    )
                })
                .collect(),
        }
    }

    /// Whether these are the counters of `function` and `operation`.
    pub(crate) fn is_for(&self, function: &str, operation: &str) -> bool {
        #[cfg(feature = "metrics")]
        return self.function == function && self.operation == operation;
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (function, operation);
            true
        }
    }

    /// Counts one call's outcome.
    pub(crate) fn count(&self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        match OUTCOME_LABELS
            .iter()
            .position(|label| *label == outcome)
            .and_then(|i| self.keys.get(i))
        {
            Some(key) => {
                metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1)
            }
            None => counter!(
                OUTCOMES,
                "function" => self.function.clone(),
                "operation" => self.operation.clone(),
                "outcome" => outcome
            )
            .increment(1),
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
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

/// The store requests a handle counts (its `operation` label).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const STORE_OPERATIONS: [&str; 6] = ["claim", "complete", "release", "get", "forget", "list"];
/// A store request's `result` label.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const STORE_RESULTS: [&str; 3] = ["ok", "error", "timeout"];

/// A store's [`STORE_REQUESTS`] and [`STORE_REQUEST_SECONDS`] keys, built once per handle.
#[derive(Debug)]
pub(crate) struct StoreKeys {
    #[cfg(feature = "metrics")]
    store: &'static str,
    /// Per operation, its three results' counters, then its histogram.
    #[cfg(feature = "metrics")]
    keys: Vec<[metrics::Key; 4]>,
}

impl StoreKeys {
    pub(crate) fn new(store: &'static str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = store;
        Self {
            #[cfg(feature = "metrics")]
            store,
            #[cfg(feature = "metrics")]
            keys: STORE_OPERATIONS
                .iter()
                .map(|operation| {
                    let labels = |result: Option<&'static str>| {
                        let mut labels = vec![
                            metrics::Label::from_static_parts("store", store),
                            metrics::Label::from_static_parts("operation", operation),
                        ];
                        labels
                            .extend(result.map(|r| metrics::Label::from_static_parts("result", r)));
                        labels
                    };
                    let [ok, error, timeout] = STORE_RESULTS;
                    [
                        metrics::Key::from_parts(STORE_REQUESTS, labels(Some(ok))),
                        metrics::Key::from_parts(STORE_REQUESTS, labels(Some(error))),
                        metrics::Key::from_parts(STORE_REQUESTS, labels(Some(timeout))),
                        metrics::Key::from_parts(STORE_REQUEST_SECONDS, labels(None)),
                    ]
                })
                .collect(),
        }
    }

    /// Counts one store request attempt and its latency.
    pub(crate) fn request(&self, operation: &'static str, result: &'static str, took: Duration) {
        #[cfg(feature = "metrics")]
        {
            let op = STORE_OPERATIONS.iter().position(|o| *o == operation);
            let res = STORE_RESULTS.iter().position(|r| *r == result);
            match (op, res) {
                (Some(op), Some(res)) => metrics::with_recorder(|r| {
                    let keys = &self.keys[op];
                    r.register_counter(&keys[res], &METADATA).increment(1);
                    r.register_histogram(&keys[3], &METADATA)
                        .record(took.as_secs_f64());
                }),
                _ => {
                    let store = self.store;
                    counter!(STORE_REQUESTS, "store" => store, "operation" => operation, "result" => result)
                        .increment(1);
                    histogram!(STORE_REQUEST_SECONDS, "store" => store, "operation" => operation)
                        .record(took.as_secs_f64());
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (operation, result, took);
    }
}

/// Counts a call that never returned: dropped (`cancelled`) or unwound by a panic.
pub(crate) struct Unfinished<'a> {
    pub(crate) keys: &'a OutcomeKeys,
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
            self.keys.count(outcome);
        }
    }
}

/// The `outcome` label of a call's result.
pub(crate) fn outcome_label<T, E>(
    result: &Result<(T, crate::operation::outcome::Outcome), crate::error::ExecuteError<E>>,
) -> &'static str {
    match result {
        Ok((_, outcome)) => outcome.as_str(),
        Err(crate::error::ExecuteError::Idempotency(e)) => error_label(e),
        Err(crate::error::ExecuteError::Function(_)) => "failed",
    }
}

/// The `outcome` label of the library's own error.
pub(crate) fn error_label(e: &crate::error::Error) -> &'static str {
    match e {
        // An in-progress answer that failed still leaves the call unanswered, in progress.
        crate::error::Error::AlreadyInProgress { .. }
        | crate::error::Error::InProgressAnswerIncompatible { .. } => "in_progress",
        crate::error::Error::ClaimAbandoned { .. } => "claim_abandoned",
        // A hook's answer that does not fit: refused, as a permanent failure is.
        crate::error::Error::ReplayAnswerIncompatible { .. } => "rejected",
        e if e.is_permanent() => "rejected",
        crate::error::Error::LeaseLost { .. } => "lease_lost",
        crate::error::Error::TwinFailed { .. } => "failed",
        _ => "store_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    /// Every outcome a call can have takes the keys built once, none the slow path.
    #[test]
    fn every_outcome_label_has_a_key_built_once() {
        let outcomes = [
            Outcome::Executed,
            Outcome::TookOver,
            Outcome::ExecutedUnstored,
            Outcome::Replayed,
            Outcome::ReplayedFromCache,
            Outcome::Joined,
            Outcome::InProgressAnswered,
            Outcome::Disabled,
        ];
        let errors = [
            "in_progress",
            "claim_abandoned",
            "rejected",
            "failed",
            "lease_lost",
            "store_error",
            "panicked",
            "cancelled",
        ];
        let labels: Vec<&str> = outcomes.iter().map(|o| o.as_str()).chain(errors).collect();
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        let mut known = OUTCOME_LABELS.to_vec();
        known.sort_unstable();
        assert_eq!(sorted, known);
    }

    /// An operation's `Debug` (which holds these) shows the names, never the keys.
    #[cfg(feature = "metrics")]
    #[test]
    fn outcome_keys_show_their_names_only() {
        let keys = OutcomeKeys::new("f", "op");
        assert_eq!(
            format!("{keys:?}"),
            r#"OutcomeKeys { function: "f", operation: "op", .. }"#
        );
        assert!(keys.is_for("f", "op"));
        assert!(!keys.is_for("g", "op") && !keys.is_for("f", "other"));
    }
}

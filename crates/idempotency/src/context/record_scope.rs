//! What one batch record's handler leaves for its batch to finish once the batch knows the
//! record's answer: the twins of a call whose function failed wait for the failure's class
//! (a `PermanentError` makes the twin permanent too, and only the batch reads the handler's
//! error), and the outcomes counted by the record's calls are emitted once, by the final
//! attempt (a stream record that waited out another worker's lease and then ran counts as
//! what it finally was, never also as `in_progress`).

use super::twins::{Running, Settled};
use crate::error::FailureKind;
use crate::metrics::OutcomeKeys;
use std::sync::{Arc, Mutex};

/// One attempt at one batch record.
#[derive(Default)]
pub(crate) struct RecordScope {
    /// Calls whose function failed, with the failure's text, until the record's class is
    /// known.
    failed_calls: Mutex<Vec<(Running, Arc<str>)>>,
    /// Outcomes counted by the record's calls: function, operation, outcome.
    #[cfg(feature = "metrics")]
    outcomes: Mutex<Vec<(Arc<OutcomeKeys>, &'static str)>>,
}

/// Counts an outcome: at once outside a batch record, at the end of `record` inside one.
pub(crate) fn count_outcome(
    record: Option<&RecordScope>,
    keys: &Arc<OutcomeKeys>,
    outcome: &'static str,
) {
    #[cfg(feature = "metrics")]
    if let Some(scope) = record {
        lock(&scope.outcomes).push((Arc::clone(keys), outcome));
        return;
    }
    #[cfg(not(feature = "metrics"))]
    let _ = record;
    keys.count(outcome);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RecordScope {
    pub(crate) fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Keeps `running`, whose function failed with `reason`, until [`Self::settle_failures`].
    pub(crate) fn defer_failure(&self, running: Running, reason: Arc<str>) {
        lock(&self.failed_calls).push((running, reason));
    }

    /// Settles the twins of every call whose function failed, with the record's class:
    /// `None` when the handler answered anyway (a function's failure a later delivery may
    /// fix).
    pub(crate) fn settle_failures(&self, kind: Option<FailureKind>) {
        let kind = kind.unwrap_or(FailureKind::Error);
        for (running, reason) in lock(&self.failed_calls).drain(..) {
            running.settle(Settled::function_failed(reason, kind));
        }
    }

    /// Emits the outcomes this attempt counted: it is the record's final one, or the
    /// deadline cut it.
    pub(crate) fn flush_outcomes(&self) {
        #[cfg(feature = "metrics")]
        for (keys, outcome) in lock(&self.outcomes).drain(..) {
            keys.count(outcome);
        }
    }

    /// Hands this attempt's outcomes to `next`, the batch's next attempt at the record,
    /// but for its `in_progress` ones: the record waited instead of being handed back.
    pub(crate) fn carry_outcomes_into(&self, next: &RecordScope) {
        #[cfg(feature = "metrics")]
        {
            let carried: Vec<_> = lock(&self.outcomes)
                .drain(..)
                .filter(|(_, outcome)| *outcome != "in_progress")
                .collect();
            lock(&next.outcomes).splice(0..0, carried);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = next;
    }
}

impl Drop for RecordScope {
    /// A record cut off before its batch classified it (the deadline): its failed calls'
    /// twins fail as after any function failure, and what its calls counted is emitted.
    fn drop(&mut self) {
        self.settle_failures(None);
        self.flush_outcomes();
    }
}

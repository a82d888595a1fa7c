//! How a call was answered.

/// How a call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The key was free: the function ran and its result was stored.
    Executed,
    /// An expired record or a crashed worker's lease was taken over: the function ran.
    TookOver,
    /// The function ran but its result could not be stored before the lease ended. The
    /// record stays in progress and can be taken over after the lease.
    ExecutedUnstored,
    /// The stored result of an earlier call was returned; the function did not run.
    Replayed,
    /// Like `Replayed`, from the local cache, with no store request.
    ReplayedFromCache,
    /// A twin of this call (the same stored id) was running in the same batch invocation,
    /// such as a producer's re-send in one SQS batch with the original: this call waited
    /// for it and returned its result, with no store request; the function did not run
    /// again.
    Joined,
    /// The key was in progress in another call and the operation's
    /// [`when_in_progress`](crate::Operation::when_in_progress) answered instead of
    /// [`Error::AlreadyInProgress`](crate::Error::AlreadyInProgress); the function did not run. Never in a batch.
    InProgressAnswered,
    /// Idempotency is disabled: the function ran unprotected.
    Disabled,
}

impl Outcome {
    /// The outcome's name, as the `outcome` label of [`metrics::OUTCOMES`](crate::metrics::OUTCOMES)
    /// carries it: to tell a replay from a fresh execution in your own metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::TookOver => "took_over",
            Outcome::ExecutedUnstored => "executed_unstored",
            Outcome::Replayed => "replayed",
            Outcome::ReplayedFromCache => "replayed_from_cache",
            Outcome::Joined => "joined",
            Outcome::InProgressAnswered => "in_progress_answered",
            Outcome::Disabled => "disabled",
        }
    }

    /// Whether the function ran in this call.
    pub fn ran(self) -> bool {
        matches!(
            self,
            Outcome::Executed | Outcome::TookOver | Outcome::ExecutedUnstored | Outcome::Disabled
        )
    }
}

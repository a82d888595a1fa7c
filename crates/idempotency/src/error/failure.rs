//! A failure's class: what a batch reports for a record, and what its twins answer.

/// Why one record was reported as a batch item failure.
///
/// Every kind is a `batchItemFailures` entry: SQS delivers the message again until the
/// queue's `maxReceiveCount`, then to the dead-letter queue; a stream resends from the
/// lowest reported record until `MaximumRetryAttempts`, then gives the batch to its
/// on-failure destination. [`is_permanent`](Self::is_permanent) says which kinds no
/// redelivery can fix, and it alone decides whether an ordered batch (a FIFO message group,
/// a stream shard) stops at the failure:
///
/// | kind | a later delivery | an ordered batch |
/// |---|---|---|
/// | `InProgress` | succeeds, once the other worker finishes or its lease ends | stops |
/// | `Error` | may succeed (a provider or store error that heals) | stops |
/// | `Panicked` | may succeed (depends on the panic) | stops |
/// | `SkippedAfterGroupFailure` | runs once the group's earlier record succeeds | (already stopped) |
/// | `Unfinished` | takes the record over after its lease | (the batch answered) |
/// | `MalformedBody` | never: the body will not parse next time either (permanent) | goes on |
/// | `Rejected` | never: the idempotency layer refused this record for good (permanent) | goes on |
/// | `Permanent` | never: the handler said so with [`PermanentError`](crate::PermanentError) (permanent) | goes on |
///
/// A permanent failure does not stop its group or shard: order is not at stake for a
/// record that can never succeed, and stopping would hold back every valid record behind
/// it until the retries run out and they are given up with it. `stop_at_permanent_failures`
/// on each batch type opts into stopping anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Another worker holds the key: redelivered later, not an error.
    InProgress,
    /// The body is not what the handler expects; it will reach the dead-letter queue.
    MalformedBody,
    /// The idempotency layer refused the message for good: no key in the payload, a
    /// payload that differs from the one stored under its key, a stored result that the
    /// function's return type no longer reads, a result too large to store
    /// ([`Error::is_permanent`](crate::Error::is_permanent)). It will reach the dead-letter
    /// queue.
    Rejected,
    /// The handler returned an error.
    Error,
    /// The handler panicked.
    Panicked,
    /// An earlier record of the same FIFO message group or stream shard failed with a
    /// failure a retry can fix, so this one was not run: it comes again after it, in order.
    SkippedAfterGroupFailure,
    /// The record had not finished shortly before the invocation's deadline. Its claim
    /// stays until its lease ends, as after a crash; a later delivery takes it over.
    Unfinished,
    /// The handler returned a [`PermanentError`](crate::PermanentError): it says no retry can fix this record (a
    /// provider's 400 for this request, say). It will reach the dead-letter queue or the
    /// stream's on-failure destination.
    Permanent,
}

impl FailureKind {
    /// The kind's name, as the `kind` label of
    /// [`metrics::BATCH_FAILURES`](crate::metrics::BATCH_FAILURES) carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::InProgress => "in_progress",
            FailureKind::MalformedBody => "malformed_body",
            FailureKind::Rejected => "rejected",
            FailureKind::Error => "error",
            FailureKind::Panicked => "panicked",
            FailureKind::SkippedAfterGroupFailure => "skipped_after_group_failure",
            FailureKind::Unfinished => "unfinished",
            FailureKind::Permanent => "permanent",
        }
    }

    /// Whether no later delivery can succeed: [`MalformedBody`](Self::MalformedBody),
    /// [`Rejected`](Self::Rejected) and [`Permanent`](Self::Permanent). The one place that
    /// decides it for every batch source.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            FailureKind::MalformedBody | FailureKind::Rejected | FailureKind::Permanent
        )
    }
}

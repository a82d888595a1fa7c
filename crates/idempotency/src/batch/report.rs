//! What happened to each record of a batch, and the partial batch response built from it.

use crate::error::BoxError;
use aws_lambda_events::event::sqs::SqsBatchResponse;
use std::fmt;

/// Why one record was reported as a batch item failure.
///
/// Every kind is a `batchItemFailures` entry, so SQS delivers the message again until the
/// queue's `maxReceiveCount`, then to the dead-letter queue. [`is_permanent`](Self::is_permanent)
/// says which kinds no redelivery can fix:
///
/// | kind | a later delivery |
/// |---|---|
/// | `InProgress` | succeeds, once the other worker finishes or its lease ends |
/// | `Error` | may succeed (a provider or store error that heals) |
/// | `Panicked` | may succeed (depends on the panic) |
/// | `SkippedAfterGroupFailure` | runs once the group's earlier record succeeds |
/// | `Unfinished` | takes the record over after its lease |
/// | `MalformedBody` | never: the body will not parse next time either (permanent) |
/// | `Rejected` | never: the idempotency layer refused this message for good (permanent) |
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
    /// FIFO: an earlier record of the same message group failed, so this one was not run.
    SkippedAfterGroupFailure,
    /// The record had not finished shortly before the invocation's deadline. Its claim
    /// stays until its lease ends, as after a crash; a later delivery takes it over.
    Unfinished,
}

impl FailureKind {
    /// Whether no later delivery can succeed: [`MalformedBody`](Self::MalformedBody) and
    /// [`Rejected`](Self::Rejected).
    pub fn is_permanent(self) -> bool {
        matches!(self, FailureKind::MalformedBody | FailureKind::Rejected)
    }
}

/// One record's failure.
#[derive(Debug)]
#[non_exhaustive]
pub struct RecordFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// The error and its causes on one line ([`report`](crate::report)), as the batch's
    /// log line shows it.
    pub reason: String,
    /// The error itself, when there was one. The idempotency layer's own errors can be
    /// told apart by downcasting: `failure.error.as_deref().and_then(|e|
    /// e.downcast_ref::<lambda_idempotency::Error>())` (the handler's error type, when it
    /// wraps one, is the box's type instead: walk `source()`).
    pub error: Option<BoxError>,
}

impl fmt::Display for RecordFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.reason)
    }
}

/// What happened to one record.
#[derive(Debug)]
pub struct RecordReport<T> {
    /// The SQS message id, the batch item failure's identifier.
    pub message_id: Option<String>,
    /// The handler's value, or why the record failed.
    pub result: Result<T, RecordFailure>,
}

/// What happened to every record of a batch, in the event's order.
#[derive(Debug)]
pub struct BatchReport<T> {
    /// One report per record.
    pub records: Vec<RecordReport<T>>,
    /// The batch's [`fail_invocation_when_all_fail`](super::SqsBatch::fail_invocation_when_all_fail).
    pub(super) fail_invocation_when_all_fail: bool,
}

impl<T> BatchReport<T> {
    /// The records that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RecordReport<T>> {
        self.records.iter().filter(|r| r.result.is_err())
    }

    /// The partial batch response for Lambda, as the batch was configured: with
    /// [`fail_invocation_when_all_fail`](super::SqsBatch::fail_invocation_when_all_fail),
    /// an error when every record failed. Fails too when a failed record has no message id
    /// (it could not be reported, so the whole batch must be retried).
    pub fn into_response(self) -> Result<SqsBatchResponse, BatchError> {
        let fail = self.fail_invocation_when_all_fail;
        self.response(fail)
    }

    /// Like [`into_response`](Self::into_response), failing the invocation when every
    /// record failed whatever the batch's setting, so Lambda backs off before it retries.
    pub fn into_response_failing_when_all_fail(self) -> Result<SqsBatchResponse, BatchError> {
        self.response(true)
    }

    pub(super) fn response(
        self,
        fail_invocation_when_all_fail: bool,
    ) -> Result<SqsBatchResponse, BatchError> {
        let mut response = SqsBatchResponse::default();
        let total = self.records.len();
        let mut first_reason = None;
        for (index, record) in self.records.into_iter().enumerate() {
            if let Err(failure) = record.result {
                match record.message_id {
                    Some(id) => response.add_failure(id),
                    None => return Err(BatchError::MissingMessageId { index }),
                }
                first_reason.get_or_insert(failure.reason);
            }
        }
        let failed = response.batch_item_failures.len();
        if fail_invocation_when_all_fail && total > 0 && failed == total {
            return Err(BatchError::AllFailed {
                count: total,
                first_reason: first_reason.unwrap_or_default(),
            });
        }
        Ok(response)
    }
}

/// Why a whole invocation failed instead of returning a partial batch response.
#[derive(Debug)]
#[non_exhaustive]
pub enum BatchError {
    /// Every record failed and the processor was told to fail the invocation then.
    AllFailed {
        /// Records in the batch.
        count: usize,
        /// The first failure's reason.
        first_reason: String,
    },
    /// A failed record has no message id to report it by.
    MissingMessageId {
        /// Its position in the batch.
        index: usize,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::AllFailed {
                count,
                first_reason,
            } => write!(
                f,
                "all {count} records of the batch failed (first: {first_reason}); failing the invocation so Lambda backs off"
            ),
            BatchError::MissingMessageId { index } => write!(
                f,
                "record {index} failed and has no messageId to report it by; failing the whole batch so it is retried"
            ),
        }
    }
}

impl std::error::Error for BatchError {}

/// An SQS message body that is missing or does not parse as the handler's input. It will
/// not parse on redelivery either: the message is left to reach the dead-letter queue.
#[derive(Debug)]
pub struct InvalidBody {
    /// The SQS message id.
    pub message_id: String,
    /// The parser's error.
    pub reason: String,
}

impl fmt::Display for InvalidBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} has an invalid body: {}",
            self.message_id, self.reason
        )
    }
}

impl std::error::Error for InvalidBody {}

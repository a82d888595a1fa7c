//! What happened to each record of a batch, and the partial batch response built from it.

use crate::error::BoxError;
use aws_lambda_events::event::sqs::SqsBatchResponse;
use std::fmt;

/// Why one record was reported as a batch item failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Another worker holds the key: redelivered later, not an error.
    InProgress,
    /// The body is not what the handler expects; it will reach the dead-letter queue.
    MalformedBody,
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

/// One record's failure.
#[derive(Debug)]
#[non_exhaustive]
pub struct RecordFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// The error, for logs.
    pub reason: String,
    /// The error itself, when there was one.
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
}

impl<T> BatchReport<T> {
    /// The records that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RecordReport<T>> {
        self.records.iter().filter(|r| r.result.is_err())
    }

    /// The partial batch response for Lambda. Fails when a failed record has no message id
    /// (it could not be reported, so the whole batch must be retried).
    pub fn into_response(self) -> Result<SqsBatchResponse, BatchError> {
        self.response(false)
    }

    /// Like [`into_response`](Self::into_response), but fails the invocation when every
    /// record failed, so Lambda backs off before it retries the batch.
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

//! What happened to each record of a batch, and the partial batch response built from it.

use crate::error::BoxError;
use aws_lambda_events::event::sqs::SqsBatchResponse;
use std::fmt;
use std::marker::PhantomData;

pub use crate::error::FailureKind;

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
    /// The batch item failure's identifier: the SQS message id, or the stream record's
    /// sequence number.
    pub item_id: Option<String>,
    /// The handler's value, or why the record failed.
    pub result: Result<T, RecordFailure>,
}

/// What happened to every record of a batch, in the event's order. `R` is the partial batch
/// response it becomes: [`SqsBatchResponse`],
/// [`KinesisEventResponse`](aws_lambda_events::event::streams::KinesisEventResponse) or
/// [`DynamoDbEventResponse`](aws_lambda_events::event::streams::DynamoDbEventResponse).
#[must_use = "turn it into the partial batch response (`into_response`) and return that to Lambda"]
#[derive(Debug)]
pub struct BatchReport<T, R = SqsBatchResponse> {
    /// One report per record run, in the event's order.
    pub records: Vec<RecordReport<T>>,
    /// The records acknowledged without running (a DynamoDB Streams `REMOVE`, by
    /// default): neither run nor failed.
    pub skipped: Vec<SkippedRecord>,
    /// The batch's `fail_invocation_when_all_fail`.
    pub(super) fail_invocation_when_all_fail: bool,
    pub(super) response: PhantomData<fn() -> R>,
}

/// A partial batch response: `{"batchItemFailures": [{"itemIdentifier": ...}]}`, the same
/// shape for every source. Implemented for the three types `aws_lambda_events` defines;
/// sealed.
pub trait BatchResponse: Default + sealed::Sealed {
    /// Reports one failed item.
    fn add_failure(&mut self, item_id: String);
}

pub(super) mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for SqsBatchResponse {}
impl BatchResponse for SqsBatchResponse {
    fn add_failure(&mut self, item_id: String) {
        SqsBatchResponse::add_failure(self, item_id)
    }
}

#[cfg(feature = "kinesis")]
impl sealed::Sealed for aws_lambda_events::event::streams::KinesisEventResponse {}
#[cfg(feature = "kinesis")]
impl BatchResponse for aws_lambda_events::event::streams::KinesisEventResponse {
    fn add_failure(&mut self, item_id: String) {
        let mut failure = aws_lambda_events::event::streams::KinesisBatchItemFailure::default();
        failure.item_identifier = Some(item_id);
        self.batch_item_failures.push(failure);
    }
}

#[cfg(feature = "dynamodb-streams")]
impl sealed::Sealed for aws_lambda_events::event::streams::DynamoDbEventResponse {}
#[cfg(feature = "dynamodb-streams")]
impl BatchResponse for aws_lambda_events::event::streams::DynamoDbEventResponse {
    fn add_failure(&mut self, item_id: String) {
        let mut failure = aws_lambda_events::event::streams::DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(item_id);
        self.batch_item_failures.push(failure);
    }
}

/// The partial batch response for Lambda: return it from the handler. `R` is the source's
/// response type ([`SqsBatchResponse`],
/// [`KinesisEventResponse`](aws_lambda_events::event::streams::KinesisEventResponse),
/// [`DynamoDbEventResponse`](aws_lambda_events::event::streams::DynamoDbEventResponse));
/// this serializes exactly as `R` does.
///
/// It is `#[must_use]`: a handler that drops it (`batch.run_json(event, f).await?;
/// Ok(())`) answers `null`, which Lambda reads as "every record succeeded", and the failed
/// records are deleted with the batch. Under `#![deny(unused_must_use)]` (or
/// `-D warnings`) such a handler does not compile.
///
/// ```
/// use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
/// use lambda_idempotency::{PartialBatchResponse, SqsBatch};
/// use lambda_runtime::{Error, LambdaEvent};
///
/// async fn handler(
///     event: LambdaEvent<SqsEvent>,
/// ) -> Result<PartialBatchResponse<SqsBatchResponse>, Error> {
///     let batch = SqsBatch::new();
///     Ok(batch
///         .run(event, |_message| async { Ok::<_, Error>(()) })
///         .await?)
/// }
/// ```
#[must_use = "return the partial batch response to Lambda: dropped, Lambda reads `null` as every record succeeded and deletes the failed ones"]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialBatchResponse<R = SqsBatchResponse>(R);

impl<R> PartialBatchResponse<R> {
    /// The source's own response type (no longer `#[must_use]`: return it).
    #[must_use = "return the partial batch response to Lambda: dropped, Lambda reads `null` as every record succeeded and deletes the failed ones"]
    pub fn into_inner(self) -> R {
        self.0
    }
}

impl<R> std::ops::Deref for PartialBatchResponse<R> {
    type Target = R;

    fn deref(&self) -> &R {
        &self.0
    }
}

impl<R: serde::Serialize> serde::Serialize for PartialBatchResponse<R> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<T, R: BatchResponse> BatchReport<T, R> {
    /// The records that failed.
    pub fn failures(&self) -> impl Iterator<Item = &RecordReport<T>> {
        self.records.iter().filter(|r| r.result.is_err())
    }

    /// The partial batch response for Lambda, as the batch was configured: with
    /// `fail_invocation_when_all_fail`, an error when every record failed. Fails too when a
    /// failed record has no item id (it could not be reported, and Lambda reads an empty
    /// `itemIdentifier` as the whole batch failing, so the invocation fails instead). No
    /// failure is an empty `batchItemFailures`: the whole batch succeeded.
    pub fn into_response(self) -> Result<PartialBatchResponse<R>, BatchError> {
        let fail = self.fail_invocation_when_all_fail;
        self.response(fail)
    }

    /// Like [`into_response`](Self::into_response), failing the invocation when every
    /// record failed whatever the batch's setting, so Lambda backs off before it retries.
    pub fn into_response_failing_when_all_fail(
        self,
    ) -> Result<PartialBatchResponse<R>, BatchError> {
        self.response(true)
    }

    fn response(
        self,
        fail_invocation_when_all_fail: bool,
    ) -> Result<PartialBatchResponse<R>, BatchError> {
        let mut response = R::default();
        // A skipped record did not fail: a batch with one never failed whole.
        let total = self.records.len() + self.skipped.len();
        let mut failed = 0;
        let mut first_reason = None;
        // The records that ran, by their place in the event (skipped ones run no report).
        let mut skipped: Vec<usize> = self.skipped.iter().map(|s| s.index).collect();
        skipped.sort_unstable();
        let places = (0..).filter(|i| skipped.binary_search(i).is_err());
        for (index, record) in places.zip(self.records) {
            if let Err(failure) = record.result {
                match record.item_id {
                    Some(id) if !id.is_empty() => response.add_failure(id),
                    _ => return Err(BatchError::MissingItemId { index }),
                }
                failed += 1;
                first_reason.get_or_insert(failure.reason);
            }
        }
        if fail_invocation_when_all_fail && total > 0 && failed == total {
            return Err(BatchError::AllFailed {
                count: total,
                first_reason: first_reason.unwrap_or_default(),
            });
        }
        Ok(PartialBatchResponse(response))
    }
}

/// A record acknowledged without running its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SkippedRecord {
    /// Its position in the event.
    pub index: usize,
    /// Its item id (the stream record's sequence number).
    pub item_id: Option<String>,
    /// Why it was not run.
    pub reason: String,
}

/// Why a whole invocation failed instead of returning a partial batch response.
///
/// `{:?}` is its sentence, as for every error of this crate ([`report`](crate::report));
/// `{:#?}` is structured.
#[non_exhaustive]
pub enum BatchError {
    /// Every record failed and the processor was told to fail the invocation then.
    AllFailed {
        /// Records in the batch.
        count: usize,
        /// The first failure's reason.
        first_reason: String,
    },
    /// A failed record has no item id (message id, sequence number) to report it by.
    MissingItemId {
        /// Its position in the event.
        index: usize,
    },
    /// A source without partial batch responses (CloudWatch Logs): some records failed,
    /// so the invocation fails and Lambda retries it, then gives it to the on-failure
    /// destination; the records that succeeded replay from the store.
    SomeFailed {
        /// Records that failed.
        failed: usize,
        /// Records in the batch.
        count: usize,
        /// The first failure's reason.
        first_reason: String,
    },
    /// The event itself does not decode (CloudWatch Logs data that is not base64, gzip or
    /// JSON): nothing could be run, and it will not decode next time either.
    Malformed {
        /// Why.
        reason: String,
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
            BatchError::MissingItemId { index } => write!(
                f,
                "record {index} failed and has no item id (messageId, sequence number) to report it by; failing the whole batch so it is retried"
            ),
            BatchError::SomeFailed {
                failed,
                count,
                first_reason,
            } => write!(
                f,
                "{failed} of {count} records failed (first: {first_reason}); failing the invocation so Lambda retries it"
            ),
            BatchError::Malformed { reason } => {
                write!(f, "the event does not decode: {reason}")
            }
        }
    }
}

impl fmt::Debug for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        match self {
            BatchError::AllFailed {
                count,
                first_reason,
            } => f
                .debug_struct("AllFailed")
                .field("count", count)
                .field("first_reason", first_reason)
                .finish(),
            BatchError::MissingItemId { index } => f
                .debug_struct("MissingItemId")
                .field("index", index)
                .finish(),
            BatchError::SomeFailed {
                failed,
                count,
                first_reason,
            } => f
                .debug_struct("SomeFailed")
                .field("failed", failed)
                .field("count", count)
                .field("first_reason", first_reason)
                .finish(),
            BatchError::Malformed { reason } => {
                f.debug_struct("Malformed").field("reason", reason).finish()
            }
        }
    }
}

impl std::error::Error for BatchError {}

/// A record's body that is missing or does not parse as the handler's input (an SQS body, a
/// Kinesis record's data, a DynamoDB stream record's new image). It will not parse on
/// redelivery either: [`FailureKind::MalformedBody`], permanent. `{:?}` is its sentence,
/// `{:#?}` its fields.
pub struct InvalidBody {
    /// The record's item id: the SQS message id or the stream record's sequence number.
    pub item_id: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for InvalidBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "record {} has an invalid body: {}",
            self.item_id, self.reason
        )
    }
}

impl fmt::Debug for InvalidBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        f.debug_struct("InvalidBody")
            .field("item_id", &self.item_id)
            .field("reason", &self.reason)
            .finish()
    }
}

impl std::error::Error for InvalidBody {}

/// A handler's error that no retry can fix: a provider's `400` for this very request, a
/// business rule that refuses it. Return it (or wrap it anywhere in your error's `source()`
/// chain) and the record is [`FailureKind::Permanent`]: reported, left for the dead-letter
/// queue or the stream's on-failure destination, and it does not hold back the records
/// after it in a FIFO group or a stream shard.
///
/// The idempotency claim is released as after any error, so a redelivery runs the function
/// again. To answer a redelivery without running again, return the refusal as the
/// function's *result* (it is stored) and turn it into a `PermanentError` outside the
/// idempotent call, as the example worker does with a provider's 4xx.
///
/// ```
/// use lambda_idempotency::PermanentError;
/// let err = PermanentError::new("the provider refused this request: HTTP 400");
/// assert_eq!(err.to_string(), "the provider refused this request: HTTP 400");
/// ```
///
/// `{:?}` is its [`report`](crate::report): the error and every cause; `{:#?}` is
/// `PermanentError(..)` around the error's own `{:#?}`.
pub struct PermanentError(BoxError);

impl PermanentError {
    /// Marks `error` as one no retry can fix.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }

    /// The error it marks.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl fmt::Display for PermanentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for PermanentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f.debug_tuple("PermanentError").field(&self.0).finish();
        }
        f.write_str(&crate::report(self))
    }
}

impl std::error::Error for PermanentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permanent_error_shows_its_error_and_gives_its_causes() {
        let cause = std::io::Error::other("the provider said 400");
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidInput, cause);
        let err = PermanentError::new(crate::BatchError::MissingItemId { index: 3 });
        assert!(err.to_string().starts_with("record 3 failed"), "{err}");
        let err = PermanentError::new(Wrapper(inner));
        assert_eq!(crate::report(&err), "refused: the provider said 400");
    }

    #[derive(Debug)]
    struct Wrapper(std::io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("refused")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}

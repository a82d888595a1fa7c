//! A function's way to say "my outcome is unknown: keep my claim" ([`OutcomeUnknown`]).
//!
//! The engine cannot read a function's error (its type is only `Display`), so the mark
//! is made where the error is made: each call runs its function within a call context of
//! its own, and [`OutcomeUnknown::new`] marks the call whose context it is made in.

use crate::context::mark_outcome_unknown;
use std::fmt;

/// A function's error whose effect may have happened: a request that was sent and whose
/// answer never came (a timeout, a connection reset after sending), a `5xx` from a
/// service that may have acted before failing. Made inside an idempotent call's
/// function, it keeps that call's claim: when the function then returns an error, the
/// claim is **neither released nor completed**, and the error comes back as the
/// function's ([`ExecuteError::Function`](crate::ExecuteError::Function); in a batch, a
/// [`FailureKind::Error`](crate::FailureKind::Error) failure, redelivered):
///
/// - within the claim's lease, a duplicate is in progress (handed back);
/// - after it, a plain operation's next delivery takes the claim over and runs again, as
///   after a crash;
/// - an [at-most-once](crate::Operation::at_most_once) operation's is refused for good
///   with [`Error::ClaimAbandoned`](crate::Error::ClaimAbandoned) (its dead-letter queue,
///   an operator who finds out whether the effect happened and forgets the record), so
///   the effect is never done twice.
///
/// Any other error releases the claim, and the next delivery runs again at once: return
/// one only when the effect did not happen (refused before it was sent, a `429`, a `4xx`
/// that refuses the request).
///
/// The mark is made when the value is made, in the call whose function is running (the
/// same task: a task spawned by the function is outside it), and counts only if the
/// function then fails: a function that makes one and still returns `Ok` stores its
/// result as usual. An idempotent call nested in the function that keeps its claim this
/// way marks the enclosing call too: if the enclosing function then fails, with this error
/// or any other, its claim is kept as well (its effect includes the nested one's). A function that panics after
/// making one keeps its claim as well. Outside any call it marks nothing.
///
/// Its `Display` is `outcome unknown: ` and the error's; its `source()` is the error's;
/// its `Debug` is `outcome unknown: ` and the error's `Debug` (`{:#?}`: `OutcomeUnknown(..)`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, OutcomeUnknown};
/// use serde_json::json;
///
/// let store = MemoryStore::new();
/// let idempotency = Idempotency::builder(store.clone()).function_name("fn").build();
/// let pay = Operation::new("pay", KeyStrategy::field("id")).at_most_once();
/// let charged = idempotency
///     .execute(&pay, &json!({"id": "order-7"}), || async {
///         // The charge was sent; its answer timed out: it may have gone through.
///         Err::<String, _>(OutcomeUnknown::new(std::io::Error::from(
///             std::io::ErrorKind::TimedOut,
///         )))
///     })
///     .await;
/// assert!(charged.is_err());
/// // The claim is kept: never run again until an operator forgets the record.
/// let record = store.record("fn.pay#order-7").unwrap();
/// assert_eq!(record.status, lambda_idempotency::store::Status::InProgress);
/// # }
/// ```
pub struct OutcomeUnknown<E>(E);

impl<E: fmt::Debug> fmt::Debug for OutcomeUnknown<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f.debug_tuple("OutcomeUnknown").field(&self.0).finish();
        }
        write!(f, "outcome unknown: {:?}", self.0)
    }
}

impl<E> OutcomeUnknown<E> {
    /// Marks `error` (and the enclosing call) as leaving the function's outcome unknown.
    pub fn new(error: E) -> Self {
        mark_outcome_unknown();
        Self(error)
    }

    /// The error it marks.
    pub fn into_inner(self) -> E {
        self.0
    }

    /// The error it marks, borrowed.
    pub fn get_ref(&self) -> &E {
        &self.0
    }
}

impl<E: fmt::Display> fmt::Display for OutcomeUnknown<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outcome unknown: {}", self.0)
    }
}

impl<E: std::error::Error> std::error::Error for OutcomeUnknown<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

//! The in-progress answer: what a direct invocation returns instead of
//! [`Error::AlreadyInProgress`] when its operation says so (Powertools' #10). Never in a
//! batch, whose record in progress must come again rather than be acknowledged unrun.

use crate::error::Error;
use crate::operation::outcome::Outcome;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The record a direct invocation found in progress, as the answer set by
/// [`Operation::when_in_progress`](crate::Operation::when_in_progress) sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InProgress {
    /// The stored id.
    pub id: String,
    /// When the other call's lease ends and the record can be taken over.
    pub lease_expires: SystemTime,
    /// How long until then, by the handle's clock: a caller's `Retry-After`.
    pub retry_after: Duration,
}

/// The record in progress in, the answer out; `None` keeps the error.
type AnswerFn = dyn Fn(&InProgress) -> Option<Value> + Send + Sync;

/// The answer, shared by the operation's clones.
#[derive(Clone)]
pub(crate) struct InProgressAnswer(pub(crate) Arc<AnswerFn>);

impl fmt::Debug for InProgressAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InProgressAnswer(set)")
    }
}

/// `error` itself, or, when it is a key in progress, `answer` is set and the call is no
/// batch record's (`in_batch_record` false), the answer as `T`.
pub(crate) fn answer<T: DeserializeOwned>(
    answer: Option<&InProgressAnswer>,
    error: Error,
    in_batch_record: bool,
) -> Result<(T, Outcome), Error> {
    let (
        Some(answer),
        Error::AlreadyInProgress {
            key,
            lease_expires,
            retry_after,
        },
    ) = (answer, &error)
    else {
        return Err(error);
    };
    if in_batch_record {
        return Err(error);
    }
    let in_progress = InProgress {
        id: key.clone(),
        lease_expires: *lease_expires,
        retry_after: *retry_after,
    };
    let Some(value) = (answer.0)(&in_progress) else {
        return Err(error);
    };
    serde_json::from_value(value)
        .map(|value| (value, Outcome::InProgressAnswered))
        .map_err(|source| Error::InProgressAnswerIncompatible {
            key: in_progress.id,
            source,
        })
}

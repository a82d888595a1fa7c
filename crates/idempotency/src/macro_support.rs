//! What `#[idempotent]` expands to calls. Not a stable API: use the macro, not these.

use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::Operation;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Display;
use std::future::Future;
use std::time::SystemTime;

pub use crate::invocation::context_deadline;
pub use lambda_runtime::Context;

/// The operation described by the macro's arguments.
pub fn operation(
    name: &str,
    key: Option<&str>,
    hash: Option<&[&str]>,
    validate: Option<&[&str]>,
    key_prefix: Option<&str>,
) -> Operation {
    let by_key = key.map(|k| {
        if k.starts_with('/') {
            KeyStrategy::pointer(k)
        } else {
            KeyStrategy::field(k)
        }
    });
    let by_hash = hash.map(|fields| KeyStrategy::hash(fields.iter().copied()));
    let strategy = match (by_key, by_hash) {
        (Some(k), Some(h)) => k.or(h),
        (Some(k), None) => k,
        (None, Some(h)) => h,
        (None, None) => KeyStrategy::hash_payload(),
    };
    let mut op = Operation::new(name, strategy);
    if let Some(fields) = validate {
        op = op.validate(fields.iter().copied());
    }
    if let Some(prefix) = key_prefix {
        op = op.key_prefix(prefix);
    }
    op
}

/// The payload as JSON, taken before the body moves it.
pub fn payload<P: Serialize + ?Sized>(payload: &P) -> Result<Value, serde_json::Error> {
    serde_json::to_value(payload)
}

/// Runs the body through the engine.
pub async fn run<R, F, Fut>(
    handle: &Idempotency,
    operation: &Operation,
    payload: Result<Value, serde_json::Error>,
    deadline: Option<SystemTime>,
    body: F,
) -> R
where
    R: IdempotentResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
{
    let payload = match payload {
        Ok(payload) => payload,
        Err(e) => {
            return R::from_result(Err(R::Err::from(Error::InvalidKey {
                reason: "the payload does not serialize to JSON".into(),
                source: Some(Box::new(e)),
            })));
        }
    };
    let result = handle
        .execute_inner(operation, &payload, deadline, || async move {
            body().await.into_result()
        })
        .await;
    R::from_result(
        result
            .map(|(value, _)| value)
            .map_err(ExecuteError::into_inner),
    )
}

/// The return types `#[idempotent]` accepts.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` cannot store and replay `{Self}`",
    label = "needs `Result<T, E>` with `T: Serialize + DeserializeOwned` (stored and replayed) and `E: From<lambda_idempotency::Error> + Display`",
    note = "a duplicate returns the stored `T` without running the body, so `T` must round-trip through JSON"
)]
pub trait IdempotentResult: Sized {
    /// The stored value.
    type Ok: Serialize + DeserializeOwned;
    /// The function's error.
    type Err: From<Error> + Display;
    /// Splits the result.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// Rebuilds the result.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E> IdempotentResult for Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error> + Display,
{
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Self {
        self
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

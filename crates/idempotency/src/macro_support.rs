//! What `#[idempotent]` expands to calls. Not a stable API: use the macro, not these.

use crate::context::{CallContext, WithCallContext};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::{Operation, Outcome};
use crate::store::writes::{StoreWrites, WithWrites, Writes};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Display;
use std::future::Future;
use std::time::SystemTime;

pub use lambda_runtime::Context;

/// What a call takes from the function's Lambda context: its deadline and its tenant.
#[derive(Debug, Default)]
pub struct ContextCall {
    deadline: Option<SystemTime>,
    from_lambda: crate::context::invocation::FromLambda,
}

/// The deadline and the tenant of `context`.
pub fn context_call(context: &Context) -> ContextCall {
    ContextCall {
        deadline: crate::context::invocation::context_deadline(context),
        from_lambda: crate::context::invocation::from_lambda(context),
    }
}

/// The operation described by the macro's arguments, checked. The macro checks its
/// literals at compile time; this also catches what only the first call sees (the
/// contents of `hash = CONST` and `validate = CONST`).
pub fn operation(
    name: &str,
    key: Option<&str>,
    hash: Option<&[&str]>,
    validate: Option<&[&str]>,
    key_prefix: Option<&str>,
    refused_writes_retryable: bool,
) -> Result<Operation, Error> {
    let owned = |fields: &[&str]| fields.iter().map(|f| (*f).to_owned()).collect::<Vec<_>>();
    let by_key = key.map(|k| {
        if k.starts_with('/') {
            KeyStrategy::pointer_unchecked(k.to_owned())
        } else {
            KeyStrategy::field(k)
        }
    });
    let by_hash = hash.map(|fields| KeyStrategy::hash_unchecked(owned(fields)));
    let strategy = match (by_key, by_hash) {
        (Some(k), Some(h)) => k.or(h),
        (Some(k), None) => k,
        (None, Some(h)) => h,
        (None, None) => KeyStrategy::hash_payload(),
    };
    let mut op = Operation::unchecked(name.to_owned(), strategy);
    if let Some(fields) = validate {
        op = op.validate_unchecked(owned(fields));
    }
    if let Some(prefix) = key_prefix {
        op = op.key_prefix_unchecked(prefix.to_owned());
    }
    op = op.refused_writes_retryable(refused_writes_retryable);
    op.check()?;
    Ok(op)
}

/// The operation's error again, for every call after the first.
fn operation_error(error: &Error) -> Error {
    match error {
        Error::InvalidName { what, name, reason } => Error::InvalidName {
            what,
            name: name.clone(),
            reason: reason.clone(),
        },
        other => Error::InvalidKey {
            reason: other.to_string(),
            source: None,
        },
    }
}

/// The payload as JSON, taken before the body moves it.
pub fn payload<P: Serialize + ?Sized>(payload: &P) -> Result<Value, serde_json::Error> {
    serde_json::to_value(payload)
}

/// Runs the body through the engine.
pub async fn run<R, F, Fut>(
    handle: &Idempotency,
    operation: &Result<Operation, Error>,
    payload: Result<Value, serde_json::Error>,
    context: ContextCall,
    body: F,
) -> R
where
    R: IdempotentResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
{
    let result = run_with_outcome::<R, F, Fut>(handle, operation, payload, context, body).await;
    R::from_result(result.map(|(value, _)| value))
}

/// Runs the body through the engine, and says how the call was answered.
pub async fn run_with_outcome<R, F, Fut>(
    handle: &Idempotency,
    operation: &Result<Operation, Error>,
    payload: Result<Value, serde_json::Error>,
    context: ContextCall,
    body: F,
) -> Result<(R::Returned, Outcome), R::Err>
where
    R: IdempotentResult,
    F: FnOnce() -> Fut,
    Fut: Future<Output = R>,
{
    let operation = operation
        .as_ref()
        .map_err(|e| R::Err::from(operation_error(e)))?;
    let payload = match payload {
        Ok(payload) => payload,
        Err(e) => {
            return Err(R::Err::from(Error::InvalidKey {
                reason: "the payload does not serialize to JSON".into(),
                source: Some(Box::new(e)),
            }));
        }
    };
    if let Some(writes) = R::WRITES {
        // Before the claim, as `execute_committing` does.
        handle
            .refuse_writes_for_another_store(writes)
            .map_err(R::Err::from)?;
    }
    let call =
        handle.execute_observed(operation, &payload, context.deadline, true, || async move {
            body().await.into_answer()
        });
    let cx = CallContext::current().with_lambda(context.from_lambda);
    call.with_call_context(cx)
        .await
        .map(|(value, outcome)| (R::returned(value), outcome))
        .map_err(ExecuteError::into_inner)
}

/// The field names of `hash = CONST` and `validate = CONST`.
#[diagnostic::on_unimplemented(
    message = "`hash` and `validate` take field names, not `{Self}`",
    label = "expected a constant of type `[&str; N]`, `&[&str]` or `Vec<&str>`",
    note = "each name is a field of the payload or a JSON pointer (`/a/b`)"
)]
pub trait FieldList {
    /// The names.
    fn field_names(&self) -> &[&str];
}

impl<const N: usize> FieldList for [&str; N] {
    fn field_names(&self) -> &[&str] {
        self
    }
}

impl FieldList for [&str] {
    fn field_names(&self) -> &[&str] {
        self
    }
}

impl FieldList for Vec<&str> {
    fn field_names(&self) -> &[&str] {
        self
    }
}

impl<L: FieldList + ?Sized> FieldList for &L {
    fn field_names(&self) -> &[&str] {
        (**self).field_names()
    }
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
    /// What the function returns when it succeeds (the stored value, or it with writes).
    type Returned;
    /// Splits the result into the stored value and the writes committed with it.
    fn into_answer(self) -> Result<(Self::Ok, Option<Writes>), Self::Err>;
    /// The stored value as the function returns it.
    fn returned(value: Self::Ok) -> Self::Returned;
    /// Rebuilds the result.
    fn from_result(result: Result<Self::Returned, Self::Err>) -> Self;
    /// The store its writes are for ([`StoreWrites::STORE`]), if it has writes.
    const WRITES: Option<&'static str> = None;
}

impl<T, E> IdempotentResult for Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error> + Display,
{
    type Ok = T;
    type Err = E;
    type Returned = T;
    fn into_answer(self) -> Result<(T, Option<Writes>), E> {
        self.map(|value| (value, None))
    }
    fn returned(value: T) -> T {
        value
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

/// A function that returns its result [`WithWrites`]: the writes commit with its record
/// ([`Idempotency::execute_committing`]). The caller receives the result with empty
/// writes: they were committed (by this call, or by the first one on a replay).
impl<T, W, E> IdempotentResult for Result<WithWrites<T, W>, E>
where
    T: Serialize + DeserializeOwned,
    W: StoreWrites + Default,
    E: From<Error> + Display,
{
    type Ok = T;
    type Err = E;
    type Returned = WithWrites<T, W>;
    const WRITES: Option<&'static str> = Some(W::STORE);
    fn into_answer(self) -> Result<(T, Option<Writes>), E> {
        self.map(|answer| {
            let writes = (!answer.writes.is_empty()).then(|| Writes::new(answer.writes));
            (answer.value, writes)
        })
    }
    fn returned(value: T) -> WithWrites<T, W> {
        WithWrites::new(value, W::default())
    }
    fn from_result(result: Self) -> Self {
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_field_constant_fails_every_call_with_the_same_error() {
        let op = operation("op", None, Some(&["/a~x"]), None, None, false);
        let err = op.as_ref().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidName {
                    what: "key field",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(operation_error(err).to_string(), err.to_string());
        let op = operation("op", Some("id"), None, Some(&["/b~"]), None, false);
        assert!(matches!(
            op,
            Err(Error::InvalidName {
                what: "validation field",
                ..
            })
        ));
        let op = operation("op", Some("/order/id"), None, None, Some("v1"), false).unwrap();
        assert_eq!(
            format!("{:?}", op.key),
            r#"KeyStrategy::pointer("/order/id")"#
        );
    }

    #[test]
    fn field_lists_come_from_arrays_slices_and_vectors() {
        const ARRAY: [&str; 2] = ["a", "b"];
        const SLICE: &[&str] = &["a", "/b/c"];
        assert_eq!(FieldList::field_names(&ARRAY), ["a", "b"]);
        assert_eq!(FieldList::field_names(&SLICE), ["a", "/b/c"]);
        assert_eq!(FieldList::field_names(&vec!["x"]), ["x"]);
    }
}

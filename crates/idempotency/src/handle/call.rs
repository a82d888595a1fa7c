//! One call: the twins it may join, the claim, the function with its marks, the
//! completion or release, its span and its counted outcome.

use super::Idempotency;
use crate::context::twins::Entered;
use crate::context::{CallContext, WithCallContext, mark_outcome_unknown};
use crate::engine::Claimed;
use crate::error::{Error, ExecuteError};
use crate::key::validation_hash;
use crate::operation::{Operation, Outcome};
use crate::store::writes::Writes;
use futures_util::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;
use tracing::{Instrument, info_span, warn};

impl Idempotency {
    /// The call itself, on a payload already in JSON form. `None` takes the enclosing
    /// invocation's deadline, if any. The call's span carries its key, its outcome and the
    /// time of each store request (`claim_ms`, `complete_ms`, `release_ms`); the outcome
    /// is counted ([`metrics::OUTCOMES`](crate::metrics::OUTCOMES)).
    pub(crate) async fn execute_inner<T, E, F, Fut>(
        &self,
        op: &Operation,
        payload: &Value,
        deadline: Option<SystemTime>,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let f = move || async move { f().await.map(|value| (value, None)) };
        self.execute_observed(op, payload, deadline, true, f).await
    }

    /// [`execute_inner`](Self::execute_inner), counting its outcome only if `counted`: a
    /// caller that makes several calls for one request of its own (the HTTP layer's waits)
    /// counts that request once itself. A call that panics or is dropped unfinished is
    /// counted `panicked` or `cancelled`.
    pub(crate) async fn execute_observed<T, E, F, Fut>(
        &self,
        op: &Operation,
        payload: &Value,
        deadline: Option<SystemTime>,
        counted: bool,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Option<Writes>), E>>,
    {
        let empty = tracing::field::Empty;
        let span = info_span!(
            "idempotency",
            operation = %op.name,
            key = empty,
            outcome = empty,
            claim_ms = empty,
            complete_ms = empty,
            release_ms = empty,
        );
        let keys = op.outcome_keys(&self.engine.config.function_name);
        let mut unfinished = crate::metrics::Unfinished {
            keys: &keys,
            counted,
        };
        // No subscriber wants the span: entering it on every poll would cost more than
        // the call's own work on a replay.
        let unobserved = unobserved(&span);
        // What the call inherits, read once.
        let cx = CallContext::current();
        let result = if unobserved {
            self.execute_uncounted(&cx, op, payload, deadline, &span, f)
                .await
        } else {
            self.execute_uncounted(&cx, op, payload, deadline, &span, f)
                .instrument(span.clone())
                .await
        };
        unfinished.counted = false;
        let outcome = crate::metrics::outcome_label(&result);
        if !unobserved {
            span.record("outcome", outcome);
        }
        if counted {
            crate::context::record_scope::count_outcome(cx.record.as_deref(), &keys, outcome);
        }
        result
    }

    async fn execute_uncounted<T, E, F, Fut>(
        &self,
        cx: &CallContext,
        op: &Operation,
        payload: &Value,
        deadline: Option<SystemTime>,
        span: &tracing::Span,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Option<Writes>), E>>,
    {
        if self.engine.config.disabled {
            warn!(
                operation = op.name,
                "idempotency disabled: running unprotected"
            );
            // Unprotected, writes included: applied by nobody. Refused rather than dropped.
            // An owner stays with this call, as when its function runs claimed.
            let run = match cx.owner {
                Some(_) => f().with_call_context(cx.for_function(0, "", false).0).await,
                None => f().await,
            };
            return match run {
                Ok((value, None)) => Ok((value, Outcome::Disabled)),
                Ok((_, Some(writes))) => Err(ExecuteError::Idempotency(Error::WritesUnsupported {
                    store: "disabled idempotency",
                    writes: writes.store(),
                })),
                Err(e) => Err(ExecuteError::Function(e)),
            };
        }
        let id = self
            .stored_id(op, cx.tenant.as_deref(), payload)
            .map_err(ExecuteError::Idempotency)?;
        // The enclosing invocation, with `deadline` (if given) in place of its deadline.
        let invocation = deadline
            .map(|deadline| cx.invocation_until(deadline))
            .or(cx.invocation);
        if !unobserved(span) {
            span.record("key", id.as_str());
        }
        async move {
            let validation = op
                .validation
                .as_deref()
                .map(|fields| validation_hash(payload, fields));
            // Within a batch invocation, a twin of a running call waits for it.
            let in_flight = cx.twins.as_ref();
            let record = cx.record.as_deref();
            let handle = Arc::as_ptr(&self.engine) as usize;
            let running = loop {
                let Some(in_flight) = in_flight else {
                    break None;
                };
                if cx.encloses(handle, &id) {
                    // Nested in the call with its own id: the store answers (in progress).
                    break None;
                }
                match in_flight.enter(handle, &id, validation.as_deref(), record) {
                    Entered::First(running) => break Some(running),
                    // Another payload under the key: the store judges it against the
                    // record, never against a sibling that may itself be the stray one.
                    Entered::Twin(twin) if twin.validation != validation => break None,
                    Entered::Twin(twin) => {
                        let clock = self.engine.clock.as_ref();
                        let joined = twin.join(&id, invocation, cx.wait_until, clock);
                        if let Some(answer) = joined.await {
                            return answer;
                        }
                    }
                }
            };
            let result = match self
                .engine
                .claim(&id, validation, invocation, cx.owner.as_ref(), op)
                .await
                .map_err(ExecuteError::Idempotency)
            {
                // A key in progress: the operation's answer, outside a batch, if it has one.
                Err(ExecuteError::Idempotency(e)) => {
                    // A batch record is told apart by its record scope, which only the batch
                    // sets around each record's handler; twins' registry is no sign (the
                    // HTTP layer sets one too).
                    let in_batch_record = record.is_some();
                    crate::operation::in_progress::answer(
                        op.when_in_progress.as_ref(),
                        e,
                        in_batch_record,
                    )
                    .map_err(ExecuteError::Idempotency)
                }
                Err(e) => Err(e),
                Ok(Claimed::Stored(value)) => Ok((value, Outcome::Replayed)),
                Ok(Claimed::Cached(value)) => Ok((value, Outcome::ReplayedFromCache)),
                Ok(Claimed::Run {
                    claim,
                    cutoff,
                    took_over,
                }) => {
                    // The function's own context: enclosed by this call (when twins may
                    // meet it), and marked when it says its outcome is unknown
                    // (`OutcomeUnknown`).
                    let (function_cx, unknown) = cx.for_function(handle, &id, running.is_some());
                    let call = async { f().await }.with_call_context(function_cx);
                    // A function that panics releases its claim, as one that fails does,
                    // and the panic goes on: the next delivery runs again at once instead
                    // of waiting for the lease.
                    let result = match AssertUnwindSafe(call).catch_unwind().await {
                        Ok(result) => result,
                        Err(panic) => {
                            if cx.owner.is_some() {
                                // A panic ends one invocation of its owner (a durable
                                // execution), which Lambda invokes again: it re-enters.
                                self.engine.keep(
                                    &claim,
                                    "the function panicked in one invocation of its owner",
                                );
                            } else if unknown.load(Ordering::SeqCst) {
                                self.engine.keep(&claim, "the function panicked");
                                // As on an error: an enclosing call's effect includes
                                // this one's.
                                mark_outcome_unknown();
                            } else {
                                self.engine.release_after_panic(&claim, cutoff).await;
                            }
                            std::panic::resume_unwind(panic)
                        }
                    };
                    match result {
                        // Neither released nor completed: the claim holds until its lease
                        // ends. An enclosing call's function failing with this is marked
                        // too: its effect includes this one's.
                        Err(err) if unknown.load(Ordering::SeqCst) => {
                            self.engine.keep(&claim, &err.to_string());
                            mark_outcome_unknown();
                            Err(ExecuteError::Function(err))
                        }
                        result => {
                            let retryable = op.refused_writes_retryable;
                            self.engine
                                .finish(&claim, cutoff, result, took_over, retryable)
                                .await
                        }
                    }
                }
            };
            if let Some(running) = running {
                running.end(&result, record);
            }
            result
        }
        .await
    }
}

/// Whether `span` can be left out: it is disabled and a subscriber is set. With none
/// set, `tracing`'s `log` feature still sends a disabled span's fields and its enter and
/// exit to `log`, as it did before this check existed.
fn unobserved(span: &tracing::Span) -> bool {
    span.is_disabled() && tracing::dispatcher::has_been_set()
}

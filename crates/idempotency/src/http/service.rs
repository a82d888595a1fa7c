//! The service: one request from its key to its answer.

use super::header::{self, IDEMPOTENT_REPLAYED, KeyProblem};
use super::layer::Settings;
use super::problem::Problem;
use super::scope::Resolved;
use super::stored::{StoredResponse, fingerprint};
use super::wait::{self, Polled};
use crate::context::invocation::context_deadline;
use crate::context::{CallContext, WithCallContext};
use crate::error::{BoxError, Error, ExecuteError, report};
use crate::metrics::error_label;
use crate::operation::Outcome;
use crate::record::LEASE_TOKEN_LEN;
use bytes::Bytes;
use futures_util::FutureExt;
use http::header::HeaderValue;
use http::{Request, Response};
use http_body_util::BodyExt;
use lambda_runtime::tower::{Service, ServiceExt};
use serde_json::json;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tracing::{Instrument, Span, error, info, warn};

/// The service [`IdempotencyKeyLayer`](super::IdempotencyKeyLayer) wraps around `S`.
#[derive(Clone)]
pub struct IdempotencyKeyService<S> {
    pub(crate) inner: S,
    pub(crate) settings: Arc<Settings>,
}

impl<S> fmt::Debug for IdempotencyKeyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyService")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The service's future.
pub type ResponseFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyKeyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    /// Always ready: each request calls a clone of the inner service, made ready then.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// The request runs on a task of its own: a caller that disconnects (hyper drops the
    /// future) does not cancel a handler whose work is paid for; it finishes and its
    /// response is stored, for the retry to replay. A panic in the handler releases the
    /// key (in the task) and resumes here. The task is spawned when the future is first
    /// polled, and inherits what the polling task does (its tenant and deadline, set by
    /// [`with_context`](crate::with_context) around this future).
    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let settings = self.settings.clone();
        let span = Span::current();
        Box::pin(async move {
            let respond = async move { respond(&settings, inner, request).await };
            let task = crate::context::spawn(respond.instrument(span));
            match task.await {
                Ok(answer) => answer,
                Err(e) => match e.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(e) => panic!("the idempotency task ended without an answer: {e}"),
                },
            }
        })
    }
}

/// Why the handler's response is not stored: the claim is released (at most once, a failed
/// body keeps it) and the response (or the error) goes to the caller as it is.
enum Unstored<B, E> {
    /// Its status is not one the rule stores.
    Status(Response<B>),
    /// It is larger than the store's record (not at most once: then the record is
    /// completed without it).
    TooLarge(Response<B>),
    /// Its body failed while it was read.
    Body(BoxError),
    /// The handler failed.
    Inner(E),
    /// The handler panicked: resumed once the key is released.
    Panicked(Box<dyn std::any::Any + Send>),
}

impl<B, E> fmt::Display for Unstored<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unstored::Status(r) => write!(
                f,
                "the handler answered {}, which is not stored",
                r.status()
            ),
            Unstored::TooLarge(_) => f.write_str("the handler's response is too large to store"),
            Unstored::Body(e) => write!(f, "the handler's response body failed: {e}"),
            Unstored::Inner(_) => f.write_str("the handler failed"),
            Unstored::Panicked(_) => f.write_str("the handler panicked"),
        }
    }
}

/// Counts a request's outcome once, however many calls it made (a wait, a claim after a
/// twin failed), when the request is done or unwinds; a request refused before any store
/// request (no key, no caller) is not a call and is not counted.
struct CountOnce<'a> {
    settings: &'a Settings,
    outcome: Option<&'static str>,
}

impl Drop for CountOnce<'_> {
    fn drop(&mut self) {
        if let Some(outcome) = self.outcome {
            let s = self.settings;
            let function = &s.idempotency.engine.config.function_name;
            s.operation.outcome_keys(function).count(outcome);
        }
    }
}

async fn respond<S, ReqBody, ResBody>(
    s: &Settings,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let mut count = CountOnce {
        settings: s,
        outcome: None,
    };
    // Lambda's tenant (tenant isolation mode) keys the request's record: two tenants'
    // callers never share one, whatever the scope.
    let from_lambda = request
        .extensions()
        .get::<lambda_runtime::Context>()
        .map(crate::context::invocation::from_lambda)
        .unwrap_or_default();
    let respond = respond_counted(s, inner, request, &mut count.outcome);
    let cx = CallContext::current().with_lambda(from_lambda);
    respond.with_call_context(cx).await
}

async fn respond_counted<S, ReqBody, ResBody>(
    s: &Settings,
    inner: S,
    request: Request<ReqBody>,
    outcome: &mut Option<&'static str>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body + From<Vec<u8>> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let key = match header::read_key(&parts.headers, &s.header, s.max_key_len) {
        Ok(Some(key)) => key,
        Ok(None) if !s.required => return inner.oneshot(Request::from_parts(parts, body)).await,
        Ok(None) => {
            return Ok(s.problem(
                Problem::KeyMissing,
                &KeyProblem::Missing.detail(&s.header),
                None,
            ));
        }
        Err(why) => return Ok(s.problem(Problem::KeyInvalid, &why.detail(&s.header), None)),
    };
    let scope = match s.scope.resolve(&parts) {
        Resolved::Caller(caller) => caller,
        Resolved::Everyone => "*".to_owned(),
        Resolved::Nobody => {
            warn!(scope = ?s.scope, "refused a request whose caller the scope does not find");
            return Ok(s.problem(
                Problem::CallerUnidentified,
                "the caller could not be identified, so its idempotency key cannot be kept apart from other callers' keys",
                None,
            ));
        }
        Resolved::Shared(why) => {
            warn!(scope = ?s.scope, why, "refused a request that names no caller of its own");
            return Ok(s.problem(
                Problem::CallerUnidentified,
                &format!(
                    "{why}, so its idempotency key cannot be kept apart from other callers' keys"
                ),
                None,
            ));
        }
    };
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let e: BoxError = e.into();
            warn!(error = %report(e.as_ref()), "could not read the request body");
            return Ok(s.problem(
                Problem::BodyUnreadable,
                "the request body could not be read",
                None,
            ));
        }
    };
    let payload = json!({
        "scope": scope,
        "key": key,
        "fingerprint": fingerprint(&parts, &s.fingerprint_headers, &body),
    });
    // The request's invocation, or the one it is called within (`with_context`).
    let deadline = parts
        .extensions
        .get::<lambda_runtime::Context>()
        .and_then(context_deadline)
        .or_else(crate::context::current_deadline);
    let idempotency = &s.idempotency;
    let id = match idempotency.idempotency_id(&s.operation, &payload) {
        Ok(id) => id,
        Err(e) => {
            *outcome = Some(error_label(&e));
            return Ok(s.error_problem(&e));
        }
    };
    let give_up_at = s.wait.map(|wait| {
        let at = crate::clock::add(idempotency.now(), wait);
        // Answers before the invocation ends, with a second to spare.
        deadline.map_or(at, |d| {
            at.min(d.checked_sub(Duration::from_secs(1)).unwrap_or(d))
        })
    });
    let at_most_once = s.at_most_once();
    loop {
        // The handler's own response, when it ran: returned as it is, headers and all,
        // whatever the store did afterwards.
        let ran: Mutex<Option<Response<ResBody>>> = Mutex::new(None);
        // The closure owns its clone of the handler, so the future needs no `S: Sync`.
        let (handler, parts, body, ran_slot, id) = (inner.clone(), &parts, &body, &ran, &id);
        let run = move || async move {
            let request = Request::from_parts(parts.clone(), ReqBody::from(body.to_vec()));
            let response = match AssertUnwindSafe(handler.oneshot(request))
                .catch_unwind()
                .await
            {
                Ok(response) => response.map_err(Unstored::Inner)?,
                Err(panic) => return Err(Unstored::Panicked(panic)),
            };
            let (response_parts, response_body) = response.into_parts();
            let bytes: Bytes = match response_body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    // The handler ran (its effect may be done): at most once, its claim
                    // is kept rather than released, and no retry runs it again.
                    if at_most_once {
                        crate::context::mark_outcome_unknown();
                    }
                    return Err(Unstored::Body(e.into()));
                }
            };
            let status = response_parts.status;
            let stored =
                StoredResponse::new(status, &response_parts.headers, &s.replay_headers, &bytes);
            let response = Response::from_parts(response_parts, ResBody::from(bytes.to_vec()));
            if !(s.store_rule)(status) {
                return Err(Unstored::Status(response));
            }
            if !s.fits(id, &stored) {
                if !at_most_once {
                    error!(%status, "the response is too large to store: it is returned, and its key is released so a retry runs the handler again");
                    return Err(Unstored::TooLarge(response));
                }
                // At most once: the engine completes the record without the response, as
                // for any result too large, and a retry is never run again.
                error!(%status, "the response is too large to store: it is returned, and its key completed without it (at most once: a retry is not run again)");
            }
            *ran_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(response);
            Ok(stored)
        };
        let run = move || async move { run().await.map(|stored| (stored, None)) };
        let execute = idempotency.execute_observed(&s.operation, &payload, deadline, false, run);
        let result = match (&s.in_flight, give_up_at) {
            // A twin in this process is joined in memory, until the wait's one bound.
            (Some(in_flight), Some(until)) => {
                let cx = CallContext::current()
                    .with_twins(in_flight.clone())
                    .waiting_until(until);
                execute.with_call_context(cx).await
            }
            _ => execute.await,
        };
        let ran = ran.into_inner().unwrap_or_else(|p| p.into_inner());
        let waiting = match result {
            Ok((stored, answered)) => {
                *outcome = Some(answered.as_str());
                return Ok(s.answer(stored, answered, ran));
            }
            Err(ExecuteError::Function(unstored)) => {
                *outcome = Some(match unstored {
                    Unstored::Panicked(_) => "panicked",
                    _ => "failed",
                });
                return match unstored {
                    Unstored::Status(response) | Unstored::TooLarge(response) => Ok(response),
                    Unstored::Inner(e) => Err(e),
                    Unstored::Panicked(panic) => std::panic::resume_unwind(panic),
                    Unstored::Body(e) => {
                        warn!(error = %report(e.as_ref()), "the handler's response body failed");
                        Ok(s.problem(
                            Problem::ResponseUnreadable,
                            "the handler's response could not be read",
                            None,
                        ))
                    }
                };
            }
            Err(ExecuteError::Idempotency(e)) => {
                *outcome = Some(error_label(&e));
                if let Some(response) = ran {
                    warn!(error = %report(&e), "the handler ran but its response was not stored; returning it");
                    return Ok(response);
                }
                match e {
                    Error::AlreadyInProgress { retry_after, .. } => retry_after,
                    // A twin in this process failed and released the key: claim it again,
                    // whether or not the wait has time left (nothing may be running it).
                    Error::TwinFailed {
                        retryable: true, ..
                    } => continue,
                    e => return Ok(s.error_problem(&e)),
                }
            }
        };
        let Some(give_up_at) = give_up_at else {
            return Ok(s.in_progress(waiting));
        };
        match wait::poll(idempotency, id, &payload, &s.operation, give_up_at, waiting).await {
            Polled::Completed(stored) => {
                *outcome = Some(Outcome::Replayed.as_str());
                return Ok(s.answer(stored, Outcome::Replayed, None));
            }
            Polled::Claimable => continue,
            Polled::InProgress(retry_after) => return Ok(s.in_progress(retry_after)),
            Polled::Failed(e) => {
                *outcome = Some(error_label(&e));
                return Ok(s.error_problem(&e));
            }
        }
    }
}

impl Settings {
    fn problem<B: From<Vec<u8>>>(
        &self,
        problem: Problem,
        detail: &str,
        retry_after: Option<Duration>,
    ) -> Response<B> {
        problem.response(&self.problem_base, detail, retry_after)
    }

    fn in_progress<B: From<Vec<u8>>>(&self, retry_after: Duration) -> Response<B> {
        self.problem(
            Problem::InProgress,
            "a request with this idempotency key is still being processed; retry after the time Retry-After gives",
            Some(retry_after.min(self.max_retry_after)),
        )
    }

    /// Whether the layer's claims are at most once (its own setting or the handle's).
    fn at_most_once(&self) -> bool {
        self.operation.at_most_once || self.idempotency.is_at_most_once()
    }

    /// Whether `stored` fits the store's record for `id`, by the sum the engine checks.
    fn fits(&self, id: &str, stored: &StoredResponse) -> bool {
        let Ok(data) = serde_json::to_string(stored) else {
            return false;
        };
        let engine = &self.idempotency.engine;
        let size = engine.record_size(id.len(), data.len(), LEASE_TOKEN_LEN, 64);
        size <= engine.store.limits().max_record_bytes
    }

    /// The answer to a call that went through: the handler's own response when it ran
    /// here, the stored one (marked as a replay) otherwise.
    fn answer<B: From<Vec<u8>>>(
        &self,
        stored: StoredResponse,
        outcome: Outcome,
        ran: Option<Response<B>>,
    ) -> Response<B> {
        if let Some(response) = ran.filter(|_| outcome.ran()) {
            info!(?outcome, "answered with the handler's response");
            return response;
        }
        match stored.to_response::<B>() {
            Ok(mut response) => {
                info!(
                    ?outcome,
                    status = stored.status,
                    "replayed the stored response"
                );
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                response
            }
            Err(why) => {
                error!(why, "the stored response cannot be replayed");
                self.problem(
                    Problem::StoreFailed,
                    "the stored response for this idempotency key cannot be read",
                    None,
                )
            }
        }
    }

    /// The answer to the idempotency layer's own error.
    fn error_problem<B: From<Vec<u8>>>(&self, e: &Error) -> Response<B> {
        match e {
            Error::AlreadyInProgress { retry_after, .. } => self.in_progress(*retry_after),
            Error::ClaimAbandoned { .. } => {
                error!(error = %report(e), "an at-most-once request's earlier run ended without a response; answering 500");
                self.problem(
                    Problem::OutcomeUnknown,
                    "an earlier request with this idempotency key was started and did not finish; whether it took effect is unknown, and it is not run again until an operator resolves it",
                    None,
                )
            }
            Error::ResultNotStored { .. } => {
                error!(error = %report(e), "an at-most-once request's earlier response was too large to store; answering 500");
                self.problem(
                    Problem::ResponseNotStored,
                    "an earlier request with this idempotency key was processed, but its response was too large to store; it is not run again",
                    None,
                )
            }
            Error::PayloadMismatch { .. } => self.problem(
                Problem::KeyReused,
                "this idempotency key was already used with another request (method, path, query, body or a fingerprinted header differ)",
                None,
            ),
            e if e.is_retryable() => {
                warn!(error = %report(e), "the idempotency store failed; answering 503");
                self.problem(
                    Problem::StoreUnavailable,
                    "the idempotency store is unavailable; retry later",
                    Some(Duration::from_secs(1)),
                )
            }
            e => {
                error!(error = %report(e), "the idempotency layer failed; answering 500");
                self.problem(Problem::StoreFailed, "the idempotency store failed", None)
            }
        }
    }
}

//! The model request as an HTTP API: `POST /generate` with the model-request JSON the
//! worker takes from its queue, answered with the provider's completion, called once per
//! `Idempotency-Key` and caller however often the client retries.
//!
//! The route is wrapped in [`IdempotencyKeyLayer`]: a missing key is `400`, a key reused
//! with another body `422`, a key whose first request still runs `409` with `Retry-After`
//! (or a wait for it, [`Settings::wait_for_in_progress`]), a replay carries
//! `Idempotent-Replayed: true`. Callers are told apart by API Gateway's authorizer, or,
//! where there is none (a local run, an ALB), by their `Authorization` header.
//!
//! Answers of the route itself: `200` with the completion; `400` for a body that is no
//! model request or that the provider refuses for good (stored: the same request meets
//! the same answer); `502` when the provider fails and `504` when it does not answer in
//! time (not stored: a retry asks again).

use lambda_http::http::header::CONTENT_TYPE;
use lambda_http::http::{Method, StatusCode};
use lambda_http::tower::{Layer, Service, ServiceExt};
use lambda_http::{Body, Error, Request, RequestExt, Response};
use lambda_idempotency::Idempotency;
use lambda_idempotency::http::{CallerScope, IdempotencyKeyLayer, IdempotencyKeyService};
use model_worker::{ChatRequest, ModelClient, ProviderError, StoreCheck};
use serde_json::{Value, json};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The route the API answers.
pub const ROUTE: &str = "/generate";

/// The environment variable that lets a request wait for its in-progress twin, in
/// milliseconds (`0` or unset: answer `409` at once).
pub const WAIT_ENV: &str = "IDEMPOTENCY_WAIT_FOR_IN_PROGRESS_MS";

/// Where the problem types of this API are explained.
pub const PROBLEMS: &str = "https://github.com/lambda-idempotency/lambda-idempotency/blob/main/crates/model-api/README.md#";

/// The API's settings beyond the worker's.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// How long a request waits for its in-progress twin; `None`: `409` at once.
    pub wait_for_in_progress: Option<Duration>,
}

impl Settings {
    /// From the environment ([`WAIT_ENV`]), or why not.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let wait = match get(WAIT_ENV) {
            None => None,
            Some(ms) => match ms.trim().parse::<u64>() {
                Ok(0) => None,
                Ok(ms) if ms <= 900_000 => Some(Duration::from_millis(ms)),
                _ => {
                    return Err(format!(
                        "{WAIT_ENV}={ms:?} is not a number of milliseconds from 0 to 900000"
                    ));
                }
            },
        };
        Ok(Settings {
            wait_for_in_progress: wait,
        })
    }
}

/// The Lambda handler: `POST /generate` behind the idempotency layer, `404`/`405` for the
/// rest. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Api {
    generate: IdempotencyKeyService<Generate>,
    check: StoreCheck,
}

impl Api {
    /// The API over `idempotency`'s store, calling `model`.
    pub fn new(idempotency: Idempotency, model: ModelClient, settings: &Settings) -> Self {
        let mut layer = IdempotencyKeyLayer::builder(idempotency, "generate")
            // API Gateway's authorizer (a JWT subject, an IAM caller of a Function URL with
            // AWS_IAM); without one, whoever holds the same bearer token.
            .scope(CallerScope::lambda_authorizer().or(CallerScope::authorization_header()))
            .problem_type_base(PROBLEMS);
        if let Some(wait) = settings.wait_for_in_progress {
            layer = layer.wait_for_in_progress(wait);
        }
        let layer = layer.build().expect("the API's own settings are valid");
        Api {
            generate: layer.layer(Generate { model }),
            check: StoreCheck::passed(),
        }
    }

    /// This API, each request to the route waiting until `check` passed (one atomic load
    /// once it has): the store's start-up check that runs beside the rest of start-up
    /// (`model_worker::idempotency_starting`). No key is claimed before it; if it fails,
    /// the request fails with its error (the binary has exited with status 2 by then).
    pub fn checked_by(mut self, check: StoreCheck) -> Self {
        self.check = check;
        self
    }
}

impl Service<Request> for Api {
    type Response = Response<Body>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let path = match request.raw_http_path() {
            "" => request.uri().path().to_owned(),
            raw => raw.to_owned(),
        };
        // `/generate`, or under a custom domain's base path (`/v1/generate`).
        if !path.ends_with(ROUTE) {
            return Box::pin(async move {
                Ok(problem(
                    StatusCode::NOT_FOUND,
                    "not-found",
                    &format!("only {ROUTE} is served"),
                ))
            });
        }
        if request.method() != Method::POST {
            return Box::pin(async move {
                let mut response = problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method-not-allowed",
                    &format!("{ROUTE} takes POST"),
                );
                response
                    .headers_mut()
                    .insert("allow", "POST".parse().unwrap());
                Ok(response)
            });
        }
        let generate = self.generate.clone();
        let check = self.check.clone();
        Box::pin(async move {
            check.wait().await?;
            generate.oneshot(request).await
        })
    }
}

/// The route itself: one provider call.
#[derive(Clone, Debug)]
pub struct Generate {
    model: ModelClient,
}

impl Service<Request> for Generate {
    type Response = Response<Body>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let model = self.model.clone();
        Box::pin(async move { Ok(generate(&model, request).await) })
    }
}

async fn generate(model: &ModelClient, request: Request) -> Response<Body> {
    let chat: ChatRequest = match serde_json::from_slice(request.body()) {
        Ok(chat) => chat,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-request",
                &format!("the body is not a model request: {e}"),
            );
        }
    };
    if let Some(why) = chat.problem() {
        return problem(StatusCode::BAD_REQUEST, "invalid-request", why);
    }
    // The invocation's deadline; none outside Lambda (or a default context).
    let deadline = request
        .lambda_context_ref()
        .map(|c| UNIX_EPOCH + Duration::from_millis(c.deadline))
        .filter(|d| *d > SystemTime::now());
    match model.complete(&chat, deadline).await {
        Ok(completion) => json_response(StatusCode::OK, &completion),
        Err(e) if e.is_permanent() => problem(
            StatusCode::BAD_REQUEST,
            "provider-refused",
            &format!("the model provider refused this request: {e}"),
        ),
        Err(e @ (ProviderError::Timeout(_) | ProviderError::NoTimeLeft)) => {
            tracing::warn!(error = %e, "the provider did not answer in time");
            problem(
                StatusCode::GATEWAY_TIMEOUT,
                "provider-timeout",
                "the model provider did not answer in time; retry with the same key",
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "the provider failed");
            problem(
                StatusCode::BAD_GATEWAY,
                "provider-failed",
                "the model provider failed; retry with the same key",
            )
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

fn problem(status: StatusCode, kind: &str, detail: &str) -> Response<Body> {
    let body = json!({"type": format!("{PROBLEMS}{kind}"), "title": kind, "status": status.as_u16(), "detail": detail});
    let mut response = json_response(status, &body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/problem+json".parse().unwrap());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_setting_is_checked_at_start_up() {
        let read = |v: Option<&str>| Settings::from_lookup(|_| v.map(str::to_owned));
        assert_eq!(read(None).unwrap().wait_for_in_progress, None);
        assert_eq!(read(Some("0")).unwrap().wait_for_in_progress, None);
        assert_eq!(
            read(Some("2500")).unwrap().wait_for_in_progress,
            Some(Duration::from_millis(2500))
        );
        for bad in ["2.5s", "-1", "900001", ""] {
            assert!(read(Some(bad)).unwrap_err().contains(WAIT_ENV), "{bad}");
        }
    }
}

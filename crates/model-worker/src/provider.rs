//! The model provider: one OpenAI-compatible chat completion request, never retried.

use crate::request::ChatRequest;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::fmt;
use std::time::{Duration, SystemTime};

/// The provider call ends this long before the invocation's deadline, leaving time to
/// release the claim and answer Lambda.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// How long making a connection (TCP and TLS) may take. A connection that never completes
/// carried no request: its failure is [`ProviderError::NotSent`], which releases the
/// claim, not a timeout that may have run, which at most once keeps (a network that drops
/// connections would otherwise leave every request to an operator).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest error body kept in a [`ProviderError`].
const ERROR_BODY_PREVIEW: usize = 512;

/// Why a completion request failed. [`may_have_run`](Self::may_have_run) says whether
/// the provider may have run (and billed) the request anyway: the worker then keeps its
/// claim under at most once; otherwise the record is released and the next delivery asks
/// again.
#[derive(Debug)]
pub enum ProviderError {
    /// The request was not sent: the connection could not be made.
    NotSent(String),
    /// The request was not sent: no time was left before the invocation's deadline (less
    /// [`DEADLINE_MARGIN`]).
    NoTimeLeft,
    /// The connection was made, then failed (a reset, a connection closed mid-answer):
    /// the request may have been received.
    Transport(String),
    /// The provider answered with an error status.
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The provider answered 2xx with a body that is not JSON.
    InvalidResponse(String),
    /// No answer before the invocation's deadline (less [`DEADLINE_MARGIN`]).
    Timeout(Duration),
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderError::NotSent(e) => write!(f, "model provider not asked (not sent): {e}"),
            ProviderError::NoTimeLeft => f.write_str(
                "model provider not asked (not sent): no time left before the invocation's deadline",
            ),
            ProviderError::Transport(e) => write!(f, "model provider connection failed: {e}"),
            ProviderError::Status { status, body } => {
                write!(f, "model provider answered HTTP {status}: {body}")
            }
            ProviderError::InvalidResponse(e) => {
                write!(f, "model provider answered with invalid JSON: {e}")
            }
            ProviderError::Timeout(after) => write!(
                f,
                "model provider did not answer within {after:?}, before the invocation's deadline"
            ),
        }
    }
}

impl std::error::Error for ProviderError {}

impl ProviderError {
    /// Whether asking again cannot change the answer: the provider refused this request
    /// itself ([`refuses_for_good`]). Transport errors, timeouts, a 2xx that is not JSON,
    /// 5xx, 408, 429, and the statuses that describe the deployment rather than the request
    /// may heal.
    pub fn is_permanent(&self) -> bool {
        matches!(self, ProviderError::Status { status, .. } if refuses_for_good(*status))
    }

    /// Whether the provider may have run (and billed) the request although the call
    /// failed: a timeout or a connection failure once the request may have been sent, a
    /// `5xx` (the provider may have failed after generating), a `2xx` whose body is no
    /// JSON. Not for a request that was never sent, nor for a `4xx` (`408` and `429`
    /// included), which says the request was not run.
    pub fn may_have_run(&self) -> bool {
        match self {
            ProviderError::NotSent(_) | ProviderError::NoTimeLeft => false,
            ProviderError::Status { status, .. } => *status >= 500,
            ProviderError::Transport(_)
            | ProviderError::InvalidResponse(_)
            | ProviderError::Timeout(_) => true,
        }
    }
}

/// Whether an HTTP status refuses the request itself, so that asking again with the same
/// request gets the same answer: a 4xx, except
/// - 408 (request timeout) and 429 (too many requests), which pass;
/// - 401, 402, 403, 404, 405, 407 and 421, which say the worker's deployment is wrong (a
///   revoked key, lapsed billing, a wrong `MODEL_BASE_URL`) for every request alike.
///   Fixing the deployment heals them, so they are not stored as refusals: the message is
///   retried, and reaches the dead-letter queue (and can be redriven) if the fix comes
///   late, as with a store that denies access.
pub fn refuses_for_good(status: u16) -> bool {
    (400..500).contains(&status) && !matches!(status, 401..=405 | 407 | 408 | 421 | 429)
}

/// A client for `POST {base}/v1/chat/completions`. `Debug` redacts the API key and a
/// password in the URL.
#[derive(Clone)]
pub struct ModelClient {
    client: Client<BoundedConnect<HttpsConnector<HttpConnector>>, Full<Bytes>>,
    url: String,
    api_key: Option<String>,
}

impl fmt::Debug for ModelClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::config::{REDACTED, redact_url};
        f.debug_struct("ModelClient")
            .field("url", &redact_url(&self.url))
            .field("api_key", &self.api_key.as_ref().map(|_| REDACTED))
            .finish_non_exhaustive()
    }
}

/// A connector whose connections fail after `timeout` instead of hanging: hyper reports
/// that as a connect error (nothing sent).
#[derive(Clone, Debug)]
struct BoundedConnect<C> {
    inner: C,
    timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> tower_service::Service<hyper::Uri> for BoundedConnect<C>
where
    C: tower_service::Service<hyper::Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let (connecting, timeout) = (self.inner.call(uri), self.timeout);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(format!("no connection within {timeout:?}").into()),
            }
        })
    }
}

impl ModelClient {
    /// A client for the provider at `base_url` (without `/v1`).
    pub fn new(base_url: &str, api_key: Option<String>) -> std::io::Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(BoundedConnect {
                inner: https,
                timeout: CONNECT_TIMEOUT,
            }),
            url: format!("{}/v1/chat/completions", base_url.trim_end_matches('/')),
            api_key,
        })
    }

    /// Asks for one completion, giving up [`DEADLINE_MARGIN`] before `deadline` (the
    /// invocation's). No retry: each retry of a request whose answer was lost can be
    /// another billed generation.
    pub async fn complete(
        &self,
        request: &ChatRequest,
        deadline: Option<SystemTime>,
    ) -> Result<Value, ProviderError> {
        let Some(deadline) = deadline else {
            return self.complete_unbounded(request).await;
        };
        let left = deadline
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .saturating_sub(DEADLINE_MARGIN);
        if left.is_zero() {
            return Err(ProviderError::NoTimeLeft);
        }
        tokio::time::timeout(left, self.complete_unbounded(request))
            .await
            .map_err(|_| ProviderError::Timeout(left))?
    }

    async fn complete_unbounded(&self, request: &ChatRequest) -> Result<Value, ProviderError> {
        let mut body = json!({"model": request.model, "messages": request.messages});
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = request.max_tokens {
            body["max_tokens"] = json!(m);
        }
        let mut builder = hyper::Request::post(&self.url).header(CONTENT_TYPE, "application/json");
        if let Some(key) = &self.api_key {
            builder = builder.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let http_request = builder
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| ProviderError::NotSent(e.to_string()))?;
        let response = self.client.request(http_request).await.map_err(|e| {
            // A connection never made sent nothing; any later failure may follow the
            // request's arrival.
            if e.is_connect() {
                ProviderError::NotSent(format!("{e:?}"))
            } else {
                ProviderError::Transport(format!("{e:?}"))
            }
        })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ProviderError::Transport(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let mut cut = text.len().min(ERROR_BODY_PREVIEW);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return Err(ProviderError::Status {
                status: status.as_u16(),
                body: text[..cut].to_owned(),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ProviderError::InvalidResponse(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_api_key_or_a_password() {
        let client = ModelClient::new(
            "https://proxy-user:basepw-hunter2@models.example",
            Some("sk-hunter2".into()),
        )
        .unwrap();
        let worker = crate::Worker::new(
            lambda_idempotency::Idempotency::new(lambda_idempotency::MemoryStore::new()),
            client.clone(),
        );
        for text in [
            format!("{client:?}"),
            format!("{worker:?}"),
            format!("{worker:#?}"),
        ] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(
                text.contains("<redacted>") && text.contains("models.example"),
                "{text}"
            );
        }
    }
}

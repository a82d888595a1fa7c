//! The layer and its settings.

use super::problem::DEFAULT_PROBLEM_BASE;
use super::scope::CallerScope;
use super::service::IdempotencyKeyService;
use super::{header, stored};
use crate::context::twins::InFlight;
use crate::error::Error;
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::Operation;
use http::StatusCode;
use http::header::HeaderName;
use lambda_runtime::tower::Layer;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A tower [`Layer`] that answers a repeated `Idempotency-Key` with the first request's
/// response; see the [module docs](super) for what it answers and stores.
#[derive(Clone)]
pub struct IdempotencyKeyLayer {
    pub(crate) settings: Arc<Settings>,
}

/// What every request of one layer shares.
pub(crate) struct Settings {
    pub(crate) idempotency: Idempotency,
    pub(crate) operation: Operation,
    pub(crate) header: HeaderName,
    pub(crate) required: bool,
    pub(crate) max_key_len: usize,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) scope: CallerScope,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_retry_after: Duration,
    pub(crate) store_rule: Arc<StoreRule>,
    pub(crate) problem_base: String,
    /// The requests running now, when waiting: a twin in this process waits for its
    /// result in memory.
    pub(crate) in_flight: Option<Arc<InFlight>>,
}

type StoreRule = dyn Fn(StatusCode) -> bool + Send + Sync;

/// The response headers replayed by default: the ones that say how to read the body, and
/// where a `201` or a redirect points.
pub const DEFAULT_REPLAY_HEADERS: [&str; 5] = [
    "content-type",
    "content-encoding",
    "content-language",
    "content-disposition",
    "location",
];

/// The default longest `Retry-After`.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Builds an [`IdempotencyKeyLayer`]; every setting is checked by
/// [`build`](Self::build), at start-up.
pub struct IdempotencyKeyLayerBuilder {
    idempotency: Idempotency,
    operation: String,
    header: String,
    required: bool,
    max_key_len: usize,
    fingerprint_headers: Vec<String>,
    replay_headers: Vec<String>,
    scope: Option<CallerScope>,
    wait: Option<Duration>,
    max_retry_after: Duration,
    store_rule: Arc<StoreRule>,
    problem_base: String,
    /// See [`at_most_once`](Self::at_most_once).
    at_most_once: bool,
    /// See [`lease`](Self::lease).
    lease: Option<Duration>,
}

impl IdempotencyKeyLayer {
    /// A layer with the default settings, for requests of the operation `operation` (the
    /// second part of stored ids; one name per route whose keys must not meet).
    ///
    /// # Panics
    ///
    /// On a setting [`IdempotencyKeyLayerBuilder::build`] refuses.
    pub fn new(idempotency: Idempotency, operation: impl Into<String>) -> Self {
        Self::builder(idempotency, operation)
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A builder, to change settings.
    pub fn builder(
        idempotency: Idempotency,
        operation: impl Into<String>,
    ) -> IdempotencyKeyLayerBuilder {
        IdempotencyKeyLayerBuilder {
            idempotency,
            operation: operation.into(),
            header: header::IDEMPOTENCY_KEY.as_str().to_owned(),
            required: true,
            max_key_len: header::DEFAULT_MAX_KEY_LEN,
            fingerprint_headers: Vec::new(),
            replay_headers: DEFAULT_REPLAY_HEADERS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            scope: None,
            wait: None,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            store_rule: Arc::new(stored::store_by_default),
            problem_base: DEFAULT_PROBLEM_BASE.to_owned(),
            at_most_once: false,
            lease: None,
        }
    }
}

impl IdempotencyKeyLayerBuilder {
    /// The header the key is read from. Default `Idempotency-Key`; matched in any case.
    pub fn header_name(mut self, name: impl Into<String>) -> Self {
        self.header = name.into();
        self
    }

    /// Requests without a key pass through unprotected, instead of `400`. Default: the key
    /// is required.
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    /// The longest key accepted, in bytes. Default 255; 0 is refused by
    /// [`build`](Self::build), `usize::MAX` accepts any key.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Request headers that count in the fingerprint, besides the method, path, query and
    /// body: a request that repeats a key with another value of one of them is `422`.
    /// Default: none.
    pub fn fingerprint_headers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.fingerprint_headers = names.into_iter().map(Into::into).collect();
        self
    }

    /// Response headers stored and replayed. Default [`DEFAULT_REPLAY_HEADERS`]: the ones
    /// that say how to read the body, and `location` (where a `201` or a redirect points).
    /// Never name one that is a credential (`set-cookie`): a replay goes to the same
    /// caller, but a stored credential outlives its use.
    pub fn replay_headers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.replay_headers = names.into_iter().map(Into::into).collect();
        self
    }

    /// Whose keys meet: see [`CallerScope`]. Default, with the `lambda-http` feature:
    /// [`CallerScope::lambda_authorizer`]; without it there is no default and
    /// [`build`](Self::build) asks for one.
    pub fn scope(mut self, scope: CallerScope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// A request whose key is in progress waits for it, at most `max`, instead of `409`:
    /// a twin in the same process is awaited in memory, one elsewhere by reading the
    /// record, with backoff from 50 ms to 1 s (one store read per poll). The wait also
    /// ends before the Lambda invocation does. Default: no wait.
    pub fn wait_for_in_progress(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// The longest `Retry-After` a `409` gives. It says when the twin's lease ends, which
    /// may be minutes away (a Function URL's invocation may run 15 minutes) while the twin
    /// finishes in seconds; a retry costs one store request. Default 5 s; `Retry-After`
    /// is whole seconds, rounded up, and at least 1.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Which responses are stored and replayed; the others release the key, so a retry
    /// runs the handler again. Default [`store_by_default`](super::store_by_default):
    /// success, redirects and client errors but `408`, `425` and `429`.
    pub fn store_when<F>(mut self, rule: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.store_rule = Arc::new(rule);
        self
    }

    /// The base of the problems' `type` URIs, to which each problem's name is appended
    /// (`key-missing`, `key-invalid`, `caller-unidentified`, `key-reused`,
    /// `request-in-progress`, `body-unreadable`, `response-unreadable`,
    /// `store-unavailable`, `store-failed`, `outcome-unknown`, `response-not-stored`).
    /// Default: this project's HTTP guide.
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.problem_base = base.into();
        self
    }

    /// Runs each key's handler at most once: a request that finds the key claimed by a
    /// run whose lease ended without a response (its invocation crashed or timed out) is
    /// answered `500` with the problem `outcome-unknown` instead of running the handler
    /// again, until an operator forgets the record. See
    /// [`Operation::at_most_once`](crate::Operation::at_most_once). Default: off.
    ///
    /// Once the handler ran, its key is not released again: a response too large to
    /// store completes the record without it (a retry is `500` `response-not-stored`),
    /// and a response body that fails keeps the claim (a retry is `409` while its lease
    /// lasts, `outcome-unknown` after it). What still releases the key, as without this:
    /// the handler's error, a panic, and a response the store rule does not store
    /// ([`store_when`](Self::store_when)), **every `5xx` by default**. A `5xx` says the
    /// effect did not happen and the retry runs the handler again: a handler that may
    /// have done its effect must answer otherwise (a status that is stored, say `202`
    /// with what it knows), or make an [`OutcomeUnknown`](crate::OutcomeUnknown), which
    /// keeps its key with a status that is not stored; otherwise it is run twice.
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The claims' lease, in place of the handle's or the invocation's deadline; see
    /// [`Operation::lease`](crate::Operation::lease). [`build`](Self::build) refuses one
    /// shorter than a second or longer than 12 hours.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The layer, or the first setting that cannot work: an operation name that is empty
    /// or holds `#` (which ends the stored id's prefix, `{function}.{operation}#{key}`; a
    /// `.` is accepted, as the function name holds none and so the first `.` ends it), a
    /// header name that is none, a zero key length, no caller scope, a lease out of range,
    /// at most once with the handle's expiry no longer than the lease.
    pub fn build(self) -> Result<IdempotencyKeyLayer, Error> {
        let header_name = |what: &'static str, name: &str| {
            HeaderName::try_from(name).map_err(|_| Error::InvalidName {
                what,
                name: name.to_owned(),
                reason: "not a valid HTTP header name".into(),
            })
        };
        let header = header_name("key header name", &self.header)?;
        let fingerprint_headers = (self.fingerprint_headers.iter())
            .map(|n| header_name("fingerprint header name", n))
            .collect::<Result<_, _>>()?;
        let replay_headers = (self.replay_headers.iter())
            .map(|n| header_name("replay header name", n))
            .collect::<Result<_, _>>()?;
        if self.max_key_len == 0 {
            return Err(Error::InvalidName {
                what: "key length",
                name: "0".into(),
                reason: "no key would be accepted".into(),
            });
        }
        let operation = Operation::try_new(
            self.operation,
            KeyStrategy::hash_unchecked(vec!["scope".into(), "key".into()]),
        )?
        .validate_unchecked(vec!["fingerprint".into()]);
        let operation = match self.lease {
            Some(lease) => operation.try_lease(lease)?,
            None => operation,
        };
        let operation = if self.at_most_once {
            operation.at_most_once()
        } else {
            operation
        };
        if (operation.at_most_once || self.idempotency.is_at_most_once())
            && let Some(lease) = operation.lease.or(self.idempotency.engine.config.lease)
        {
            crate::record::lease::check_at_most_once_expiry(
                self.idempotency.engine.config.expires_after,
                lease,
            )?;
        }
        #[cfg(feature = "lambda-http")]
        let scope = self.scope.unwrap_or_else(CallerScope::lambda_authorizer);
        #[cfg(not(feature = "lambda-http"))]
        let scope = self.scope.ok_or_else(|| Error::InvalidName {
            what: "caller scope",
            name: String::new(),
            reason: "say whose keys meet: `.scope(CallerScope::from_fn(..))`, or `CallerScope::unscoped()` to share keys between all callers (the `lambda-http` feature makes API Gateway's authorizer the default)".into(),
        })?;
        Ok(IdempotencyKeyLayer {
            settings: Arc::new(Settings {
                in_flight: self.wait.map(|_| Arc::new(InFlight::default())),
                idempotency: self.idempotency,
                operation,
                header,
                required: self.required,
                max_key_len: self.max_key_len,
                fingerprint_headers,
                replay_headers,
                scope,
                wait: self.wait,
                max_retry_after: self.max_retry_after,
                store_rule: self.store_rule,
                problem_base: self.problem_base,
            }),
        })
    }
}

impl<S> Layer<S> for IdempotencyKeyLayer {
    type Service = IdempotencyKeyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKeyService {
            inner,
            settings: self.settings.clone(),
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyLayer")
            .field("operation", &self.operation.name())
            .field("header", &self.header)
            .field("required", &self.required)
            .field("max_key_len", &self.max_key_len)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("replay_headers", &self.replay_headers)
            .field("scope", &self.scope)
            .field("wait", &self.wait)
            .field("max_retry_after", &self.max_retry_after)
            .field("problem_base", &self.problem_base)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for IdempotencyKeyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl fmt::Debug for IdempotencyKeyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyLayerBuilder")
            .field("operation", &self.operation)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

//! The handle users keep, and its builder.

use crate::clock::{Clock, SystemClock};
use crate::config::{self, Config};
use crate::engine::cache::CompletedCache;
use crate::engine::{Claimed, Engine, MIN_ATTEMPT_TIMEOUT};
use crate::error::{Error, ExecuteError};
use crate::invocation::{self, Invocation};
use crate::key::validation_hash;
use crate::operation::{Operation, Outcome, check_function_name};
use crate::outcome_unknown;
use crate::store::IdempotencyStore;
use crate::twins::{self, Entered};
use crate::writes::Writes;
use futures_util::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use tracing::{Instrument, info_span, warn};

/// The handle users keep: a store, settings and the optional local cache. Cheap to clone
/// and safe to share between concurrent invocations.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
/// use serde_json::json;
///
/// let idempotency = Idempotency::new(MemoryStore::new());
/// let op = Operation::new("greet", KeyStrategy::field("id"));
/// let payload = json!({"id": "42", "name": "Ada"});
///
/// let first: Result<String, lambda_idempotency::Error> = idempotency
///     .run(&op, &payload, || async { Ok(format!("hello {}", payload["name"])) })
///     .await;
/// let second: Result<String, lambda_idempotency::Error> = idempotency
///     .run(&op, &payload, || async { unreachable!("a duplicate never runs") })
///     .await;
/// assert_eq!(first.unwrap(), second.unwrap());
/// # }
/// ```
#[derive(Clone)]
pub struct Idempotency {
    pub(crate) engine: Arc<Engine>,
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.engine.store)
            .field("config", &self.engine.config)
            .finish()
    }
}

/// Builds an [`Idempotency`] handle.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    store: Arc<dyn IdempotencyStore>,
    config: Config,
    clock: Arc<dyn Clock>,
}

impl IdempotencyBuilder {
    /// How long records count. Default: 15 days, SQS's longest retention plus a day;
    /// see [`expiry_for_queue`](crate::expiry_for_queue). A record never expires before
    /// its lease ends, however short this is. Times past the year 2500 are capped there.
    pub fn expires_after(mut self, expiry: Duration) -> Self {
        self.config.expires_after = expiry;
        self
    }

    /// A fixed lease, instead of the invocation's deadline (never past it, when one is
    /// known). [`build`](Self::build) refuses one shorter than a second or longer than 12
    /// hours, as [`Operation::lease`] does.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// Makes every operation of this handle at-most-once (see
    /// [`Operation::at_most_once`](crate::Operation::at_most_once)): for a setting read
    /// at start-up, where the operation is built elsewhere (`#[idempotent]`). Default: off,
    /// each operation says. [`build`](Self::build) then refuses an
    /// [`expires_after`](Self::expires_after) no longer than the [`lease`](Self::lease)
    /// (without one, than 15 minutes, Lambda's longest timeout): a crashed run's claim
    /// would expire with its lease and be run again.
    pub fn at_most_once(mut self, at_most_once: bool) -> Self {
        self.config.at_most_once = at_most_once;
        self
    }

    /// The first part of stored ids. Default: `AWS_LAMBDA_FUNCTION_NAME`, or `local`.
    /// It must contain neither `.` nor `#` (Lambda's function names never do).
    pub fn function_name(mut self, name: impl Into<String>) -> Self {
        self.config.function_name = name.into();
        self
    }

    /// Keeps up to `capacity` completed records in memory to answer duplicates without a
    /// store request. Off by default.
    pub fn local_cache(mut self, capacity: usize) -> Self {
        self.config.local_cache_capacity = capacity;
        self
    }

    /// Claim attempts when the record keeps changing. Default 3.
    pub fn max_claim_attempts(mut self, attempts: u32) -> Self {
        self.config.max_claim_attempts = attempts.max(1);
        self
    }

    /// Attempts of a store request on retryable errors. Default 3.
    pub fn max_store_attempts(mut self, attempts: u32) -> Self {
        self.config.max_store_attempts = attempts.max(1);
        self
    }

    /// The longest one store request may take before it is abandoned and retried. Default
    /// 2 s (DynamoDB answers in milliseconds).
    pub fn store_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_attempt_timeout = timeout.max(MIN_ATTEMPT_TIMEOUT);
        self
    }

    /// Where the engine reads the time ([`TestClock`](crate::clock::TestClock) in tests).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs functions without idempotency (default: the `POWERTOOLS_IDEMPOTENCY_DISABLED`
    /// environment variable).
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.config.disabled = disabled;
        self
    }

    /// The handle.
    ///
    /// # Panics
    ///
    /// If the function name is empty or holds `.` or `#` (see [`try_build`](Self::try_build)
    /// for a name read at run time), on a [`lease`](Self::lease) out of range, or on an
    /// at-most-once handle's expiry no longer than its lease. Build the handle at
    /// start-up: a bad setting then fails the init phase, which Lambda reports at once and
    /// which loses no message.
    pub fn build(self) -> Idempotency {
        self.try_build().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`build`](Self::build), returning [`Error::InvalidName`] instead of panicking.
    pub fn try_build(self) -> Result<Idempotency, Error> {
        check_function_name(&self.config.function_name)?;
        if let Some(lease) = self.config.lease {
            crate::operation::check_lease(lease)?;
        }
        if self.config.at_most_once
            && let Some(lease) = self.config.lease
        {
            crate::record::lease::check_at_most_once_expiry(self.config.expires_after, lease)?;
        }
        if self.config.disabled {
            warn!(
                env = config::DISABLED_ENV,
                "IDEMPOTENCY IS DISABLED: every message runs its function, duplicates included"
            );
        }
        let cache = (self.config.local_cache_capacity > 0)
            .then(|| CompletedCache::new(self.config.local_cache_capacity));
        Ok(Idempotency {
            engine: Arc::new(Engine {
                store_keys: crate::metrics::StoreKeys::new(self.store.name()),
                store: self.store,
                config: self.config,
                clock: self.clock,
                cache,
            }),
        })
    }
}

impl Idempotency {
    /// A handle with default settings.
    ///
    /// # Panics
    ///
    /// If `AWS_LAMBDA_FUNCTION_NAME` holds `.` or `#` (Lambda's function names never do).
    pub fn new(store: impl IdempotencyStore + 'static) -> Self {
        Self::builder(store).build()
    }

    /// A builder, to change settings.
    pub fn builder(store: impl IdempotencyStore + 'static) -> IdempotencyBuilder {
        IdempotencyBuilder {
            store: Arc::new(store),
            config: Config::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Whether every operation of this handle is at-most-once
    /// ([`IdempotencyBuilder::at_most_once`]); an operation may still be at-most-once on
    /// its own ([`Operation::at_most_once`]).
    pub fn is_at_most_once(&self) -> bool {
        self.engine.config.at_most_once
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.engine.store
    }

    /// The time, as the handle's clock reads it.
    pub(crate) fn now(&self) -> SystemTime {
        self.engine.now()
    }

    /// The stored id for `payload` under `op`: `{prefix}#{key}`, or `#{tenant}#{prefix}#{key}`
    /// within an invocation with a tenant ([`with_context`](crate::with_context), a batch,
    /// a layer), the tenant percent-encoded. The tenant counts against the store's longest
    /// id like the rest.
    pub fn idempotency_id(&self, op: &Operation, payload: &Value) -> Result<String, Error> {
        let tenant = invocation::current_tenant();
        let id = op.stored_id(
            &self.engine.config.function_name,
            tenant.as_deref(),
            payload,
        )?;
        let max = self.engine.store.limits().max_id_bytes;
        if id.len() > max {
            let mut cut = 64;
            while !id.is_char_boundary(cut) {
                cut -= 1;
            }
            return Err(Error::KeyTooLong {
                key_prefix: id[..cut].to_owned(),
                len: id.len(),
                max,
            });
        }
        Ok(id)
    }

    /// Runs `f` at most once per key, folding errors into the function's error type.
    ///
    /// The lease comes from the enclosing invocation (see [`with_context`](crate::with_context)),
    /// the fixed lease setting, or 15 minutes (Lambda's longest timeout).
    pub async fn run<P, T, E, F, Fut>(&self, op: &Operation, payload: &P, f: F) -> Result<T, E>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error> + fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(op, payload, f)
            .await
            .map(|(value, _)| value)
            .map_err(ExecuteError::into_inner)
    }

    /// Runs `f` at most once per key and says how the call was answered.
    ///
    /// - a free key is claimed (one conditional write), `f` runs, its result is stored;
    /// - a completed key returns the stored result, `f` does not run;
    /// - a key in progress elsewhere is [`Error::AlreadyInProgress`]: redeliver later (or,
    ///   outside a batch, the operation's [`when_in_progress`](Operation::when_in_progress)
    ///   answer);
    /// - an expired record or a passed lease is taken over and `f` runs;
    /// - if `f` fails the claim is released and `f`'s error is returned.
    ///
    /// The lease ends with the enclosing invocation (set by [`SqsBatch`](crate::SqsBatch)
    /// or [`with_context`](crate::with_context)), unless a fixed lease is configured; see
    /// [`execute_until`](Self::execute_until) to give the deadline yourself.
    pub async fn execute<P, T, E, F, Fut>(
        &self,
        op: &Operation,
        payload: &P,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let payload = to_json(payload).map_err(ExecuteError::Idempotency)?;
        self.execute_inner(op, &payload, None, f).await
    }

    /// Like [`execute`](Self::execute), within an invocation that ends at `deadline`: the
    /// lease ends then (unless a fixed lease is configured).
    pub async fn execute_until<P, T, E, F, Fut>(
        &self,
        op: &Operation,
        payload: &P,
        deadline: SystemTime,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let payload = to_json(payload).map_err(ExecuteError::Idempotency)?;
        self.execute_inner(op, &payload, Some(deadline), f).await
    }

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
        let result = if unobserved {
            self.execute_uncounted(op, payload, deadline, &span, f)
                .await
        } else {
            self.execute_uncounted(op, payload, deadline, &span, f)
                .instrument(span.clone())
                .await
        };
        unfinished.counted = false;
        let outcome = crate::metrics::outcome_label(&result);
        if !unobserved {
            span.record("outcome", outcome);
        }
        if counted {
            crate::record_scope::count_outcome(&keys, outcome);
        }
        result
    }

    async fn execute_uncounted<T, E, F, Fut>(
        &self,
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
            return match f().await {
                Ok((value, None)) => Ok((value, Outcome::Disabled)),
                Ok((_, Some(writes))) => Err(ExecuteError::Idempotency(Error::WritesUnsupported {
                    store: "disabled idempotency",
                    writes: writes.store(),
                })),
                Err(e) => Err(ExecuteError::Function(e)),
            };
        }
        let id = self
            .idempotency_id(op, payload)
            .map_err(ExecuteError::Idempotency)?;
        let invocation = invocation_of(deadline);
        if !unobserved(span) {
            span.record("key", id.as_str());
        }
        async move {
            let validation = op
                .validation
                .as_deref()
                .map(|fields| validation_hash(payload, fields));
            // Within a batch invocation, a twin of a running call waits for it.
            let in_flight = twins::current();
            let handle = Arc::as_ptr(&self.engine) as usize;
            let running = loop {
                let Some(in_flight) = &in_flight else {
                    break None;
                };
                if twins::encloses(handle, &id) {
                    // Nested in the call with its own id: the store answers (in progress).
                    break None;
                }
                match in_flight.enter(handle, &id, validation.as_deref()) {
                    Entered::First(running) => break Some(running),
                    // Another payload under the key: the store judges it against the
                    // record, never against a sibling that may itself be the stray one.
                    Entered::Twin(twin) if twin.validation != validation => break None,
                    Entered::Twin(twin) => {
                        if let Some(answer) = self.join_twin(&id, twin, invocation).await {
                            return answer;
                        }
                    }
                }
            };
            let result = match self
                .engine
                .claim(&id, validation, invocation, op)
                .await
                .map_err(ExecuteError::Idempotency)
            {
                // A key in progress: the operation's answer, outside a batch, if it has one.
                Err(ExecuteError::Idempotency(e)) => {
                    // A batch record is told apart by its record scope, which only the batch
                    // sets around each record's handler; twins' registry is no sign (the
                    // HTTP layer sets one too).
                    let in_batch_record = crate::record_scope::current().is_some();
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
                    let call = async {
                        match &running {
                            Some(_) => twins::enclosed_by(handle, &id, f()).await,
                            None => f().await,
                        }
                    };
                    // Whether the function said its outcome is unknown (`OutcomeUnknown`).
                    let unknown = Arc::new(AtomicBool::new(false));
                    let call = outcome_unknown::within(unknown.clone(), call);
                    // A function that panics releases its claim, as one that fails does,
                    // and the panic goes on: the next delivery runs again at once instead
                    // of waiting for the lease.
                    let result = match AssertUnwindSafe(call).catch_unwind().await {
                        Ok(result) => result,
                        Err(panic) => {
                            if unknown.load(Ordering::SeqCst) {
                                self.engine.keep(&claim, "the function panicked");
                                // As on an error: an enclosing call's effect includes
                                // this one's.
                                outcome_unknown::mark();
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
                            outcome_unknown::mark();
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
                running.end(&result);
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

/// The invocation a call runs in: the enclosing one, with `deadline` (if given) in
/// place of its deadline.
fn invocation_of(deadline: Option<SystemTime>) -> Option<Invocation> {
    let enclosing = invocation::current();
    match deadline {
        Some(deadline) => Some(Invocation {
            deadline,
            answer_by: enclosing.map_or(deadline, |i| i.answer_by.min(deadline)),
        }),
        None => enclosing,
    }
}

/// The payload as JSON, the form keys and validation hashes are read from.
pub(crate) fn to_json<P: Serialize + ?Sized>(payload: &P) -> Result<Value, Error> {
    serde_json::to_value(payload).map_err(|e| Error::InvalidKey {
        reason: "the payload does not serialize to JSON".into(),
        source: Some(Box::new(e)),
    })
}

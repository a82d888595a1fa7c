//! The state machine: claim, run, complete or release.

use crate::cache::{Cached, CompletedCache};
use crate::clock::{self, Clock};
use crate::config::{self, Config};
use crate::error::{Error, ExecuteError};
use crate::invocation;
use crate::key::{KeyStrategy, validation_hash};
use crate::record::{Claim, Record, Status};
use crate::store::{ClaimOutcome, IdempotencyStore};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tracing::{Instrument, debug, error, info, info_span, warn};

/// What separates the parts of a stored id: `{function_name}.{operation}#{key}`. The
/// function name may hold neither, the operation and an explicit key prefix no `#`, so
/// the first `#` ends the prefix and the first `.` the function name: two different
/// (function, operation, key) never share an id.
const PREFIX_END: char = '#';
const FUNCTION_END: char = '.';

/// The shortest time given to one store attempt, even when the cutoff has passed: a
/// result already paid for gets one real try, and the batch's own deadline still bounds
/// the invocation.
const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(100);

/// One idempotent operation: how its key is found, which fields must match on a
/// duplicate, and the name that keeps its keys apart from other operations'.
///
/// ```
/// use lambda_idempotency::{KeyStrategy, Operation};
/// let op = Operation::new("generate", KeyStrategy::field("request_id"))
///     .validate(["model", "messages"]);
/// # let _ = op;
/// ```
#[derive(Debug, Clone)]
pub struct Operation {
    name: String,
    key: KeyStrategy,
    validation: Option<Vec<String>>,
    key_prefix: Option<String>,
}

impl Operation {
    /// An operation named `name` (the function's name, usually) with its key strategy.
    /// The name must not contain `#`, which ends the stored id's prefix
    /// ([`Error::InvalidName`] on use).
    pub fn new(name: impl Into<String>, key: KeyStrategy) -> Self {
        Self {
            name: name.into(),
            key,
            validation: None,
            key_prefix: None,
        }
    }

    /// Stores a hash of these fields (top-level names or JSON pointers) and refuses a later
    /// call with the same key whose fields differ ([`Error::PayloadMismatch`]).
    pub fn validate<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.validation = Some(fields.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the id prefix explicitly instead of `{function_name}.{operation}`, so keys stay
    /// the same when the function or operation is renamed. It must not contain `#`. Two
    /// operations given one prefix share their keys: that is what it is for.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// The operation's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// How a call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The key was free: the function ran and its result was stored.
    Executed,
    /// An expired record or a crashed worker's lease was taken over: the function ran.
    TookOver,
    /// The function ran but its result could not be stored before the lease ended. The
    /// record stays in progress and can be taken over after the lease.
    ExecutedUnstored,
    /// The stored result of an earlier call was returned; the function did not run.
    Replayed,
    /// Like `Replayed`, from the local cache, with no store request.
    ReplayedFromCache,
    /// Idempotency is disabled: the function ran unprotected.
    Disabled,
}

impl Outcome {
    /// Whether the function ran in this call.
    pub fn ran(self) -> bool {
        matches!(
            self,
            Outcome::Executed | Outcome::TookOver | Outcome::ExecutedUnstored | Outcome::Disabled
        )
    }
}

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
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn IdempotencyStore>,
    config: Config,
    cache: Option<CompletedCache>,
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.inner.store)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Builds an [`Idempotency`] handle.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    store: Arc<dyn IdempotencyStore>,
    config: Config,
}

impl IdempotencyBuilder {
    /// How long records count. Default [`DEFAULT_EXPIRES_AFTER`](config::DEFAULT_EXPIRES_AFTER);
    /// see [`expiry_for_queue`](crate::expiry_for_queue). A record never expires before
    /// its lease ends, however short this is. Times past the year 2500 are capped there.
    pub fn expires_after(mut self, expiry: Duration) -> Self {
        self.config.expires_after = expiry;
        self
    }

    /// A fixed lease, instead of the invocation's deadline.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
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
    /// [`DEFAULT_STORE_ATTEMPT_TIMEOUT`](config::DEFAULT_STORE_ATTEMPT_TIMEOUT).
    pub fn store_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_attempt_timeout = timeout.max(MIN_ATTEMPT_TIMEOUT);
        self
    }

    /// Where the engine reads the time ([`TestClock`](crate::TestClock) in tests).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Runs functions without idempotency (default: the `POWERTOOLS_IDEMPOTENCY_DISABLED`
    /// environment variable).
    pub fn disabled(mut self, disabled: bool) -> Self {
        self.config.disabled = disabled;
        self
    }

    /// The handle.
    pub fn build(self) -> Idempotency {
        if self.config.disabled {
            warn!(
                env = config::DISABLED_ENV,
                "IDEMPOTENCY IS DISABLED: every message runs its function, duplicates included"
            );
        }
        let cache = (self.config.local_cache_capacity > 0)
            .then(|| CompletedCache::new(self.config.local_cache_capacity));
        Idempotency {
            inner: Arc::new(Inner {
                store: self.store,
                config: self.config,
                cache,
            }),
        }
    }
}

impl Idempotency {
    /// A handle with default settings.
    pub fn new(store: impl IdempotencyStore + 'static) -> Self {
        Self::builder(store).build()
    }

    /// A builder, to change settings.
    pub fn builder(store: impl IdempotencyStore + 'static) -> IdempotencyBuilder {
        IdempotencyBuilder {
            store: Arc::new(store),
            config: Config::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.inner.store
    }

    /// The stored id for `payload` under `op`: `{prefix}#{key}`.
    pub fn idempotency_id(&self, op: &Operation, payload: &Value) -> Result<String, Error> {
        let key = op.key.derive(payload)?;
        let id = match &op.key_prefix {
            Some(prefix) => {
                check_name("key prefix", prefix, &[PREFIX_END])?;
                format!("{prefix}{PREFIX_END}{key}")
            }
            None => {
                let function = &self.inner.config.function_name;
                check_name("function name", function, &[FUNCTION_END, PREFIX_END])?;
                check_name("operation name", &op.name, &[PREFIX_END])?;
                format!("{function}{FUNCTION_END}{}{PREFIX_END}{key}", op.name)
            }
        };
        let max = self.inner.store.limits().max_id_bytes;
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
    /// the fixed lease setting, or [`DEFAULT_LEASE`](config::DEFAULT_LEASE).
    pub async fn run<P, T, E, F, Fut>(&self, op: &Operation, payload: &P, f: F) -> Result<T, E>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error> + fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let payload = match serde_json::to_value(payload) {
            Ok(v) => v,
            Err(e) => {
                return Err(E::from(Error::InvalidKey {
                    reason: format!("the payload does not serialize to JSON: {e}"),
                }));
            }
        };
        self.execute(op, &payload, None, f)
            .await
            .map(|(value, _)| value)
            .map_err(ExecuteError::into_inner)
    }

    /// Runs `f` at most once per key and says how the call was answered.
    ///
    /// - a free key is claimed (one conditional write), `f` runs, its result is stored;
    /// - a completed key returns the stored result, `f` does not run;
    /// - a key in progress elsewhere is [`Error::AlreadyInProgress`]: redeliver later;
    /// - an expired record or a passed lease is taken over and `f` runs;
    /// - if `f` fails the claim is released and `f`'s error is returned.
    ///
    /// `deadline` is the invocation's deadline, the end of the lease unless a fixed lease
    /// is configured; `None` takes the enclosing invocation's (set by [`SqsBatch`](crate::SqsBatch)
    /// or [`with_context`](crate::with_context)), if any.
    pub async fn execute<T, E, F, Fut>(
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
        if self.inner.config.disabled {
            warn!(
                operation = op.name,
                "idempotency disabled: running unprotected"
            );
            return f()
                .await
                .map(|v| (v, Outcome::Disabled))
                .map_err(ExecuteError::Function);
        }
        let id = self
            .idempotency_id(op, payload)
            .map_err(ExecuteError::Idempotency)?;
        let deadline = deadline.or_else(invocation::current_deadline);
        let span = info_span!("idempotency", key = %id, operation = %op.name);
        async move {
            let validation = op
                .validation
                .as_deref()
                .map(|fields| validation_hash(payload, fields));
            match self
                .claim(&id, validation, deadline)
                .await
                .map_err(ExecuteError::Idempotency)?
            {
                Claimed::Stored(value) => Ok((value, Outcome::Replayed)),
                Claimed::Cached(value) => Ok((value, Outcome::ReplayedFromCache)),
                Claimed::Run { claim, took_over } => {
                    let result = f().await;
                    self.finish(&claim, result, took_over).await
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn claim<T: DeserializeOwned>(
        &self,
        id: &str,
        validation: Option<String>,
        deadline: Option<SystemTime>,
    ) -> Result<Claimed<T>, Error> {
        let cached = self
            .inner
            .cache
            .as_ref()
            .and_then(|c| c.get(id, self.now()));
        if let Some(cached) = cached {
            check_validation(id, cached.validation.as_deref(), validation.as_deref())?;
            debug!("replayed from the local cache");
            return decode(id, cached.data.as_deref()).map(Claimed::Cached);
        }
        let attempts = self.inner.config.max_claim_attempts;
        for _ in 0..attempts {
            let now = self.now();
            let lease_until = self.lease_until(now, deadline);
            let claim = Claim {
                id: id.to_owned(),
                now,
                // An expiry never ends a live lease.
                expiration: clock::add(now, self.inner.config.expires_after).max(lease_until),
                lease_until,
                lease_token: new_lease_token(),
                validation: validation.clone(),
            };
            let store = &self.inner.store;
            // The same claim (same token) on every attempt: a retry after an answer was
            // lost finds its own record and succeeds.
            let outcome = self
                .retry(
                    store_cutoff(&claim),
                    self.inner.config.max_store_attempts,
                    || store.claim(&claim),
                )
                .await?;
            match outcome {
                ClaimOutcome::Claimed { previous } => {
                    let own = previous
                        .as_ref()
                        .is_some_and(|p| p.lease_token.as_deref() == Some(&claim.lease_token));
                    match &previous {
                        _ if own => {
                            info!(
                                "found this claim's own record: an earlier attempt was applied but its answer was lost"
                            )
                        }
                        Some(old) if old.status == Status::InProgress => {
                            warn!(lease_ended = ?old.in_progress_expiration, "took over an in-progress record whose lease ended (a worker crashed or timed out)");
                        }
                        Some(_) => info!("took over an expired record"),
                        None => debug!("claimed"),
                    }
                    let took_over = previous.is_some() && !own;
                    return Ok(Claimed::Run { claim, took_over });
                }
                ClaimOutcome::Exists(record) => {
                    if record.is_claimable_by(&claim) {
                        // The store saw it live, we see it claimable: it changed between
                        // the write and the read. Claim again.
                        debug!("record changed between write and read; claiming again");
                        continue;
                    }
                    check_validation(id, record.validation.as_deref(), validation.as_deref())?;
                    return self.answer_existing(record);
                }
                ClaimOutcome::Vanished => {
                    debug!("record vanished between write and read; claiming again");
                    continue;
                }
            }
        }
        Err(Error::InconsistentState {
            key: id.to_owned(),
            attempts,
        })
    }

    fn answer_existing<T: DeserializeOwned>(&self, record: Record) -> Result<Claimed<T>, Error> {
        match record.status {
            Status::InProgress => {
                let lease_expires = record.in_progress_expiration.unwrap_or(record.expiration);
                info!(?lease_expires, "already in progress in another worker");
                Err(Error::AlreadyInProgress {
                    key: record.id,
                    lease_expires,
                })
            }
            Status::Completed => {
                let value = decode(&record.id, record.data.as_deref())?;
                info!("replayed the stored result");
                if let Some(cache) = &self.inner.cache {
                    cache.insert(
                        record.id,
                        Cached {
                            data: record.data,
                            validation: record.validation,
                            expiration: record.expiration,
                        },
                    );
                }
                Ok(Claimed::Stored(value))
            }
        }
    }

    async fn finish<T, E>(
        &self,
        claim: &Claim,
        result: Result<T, E>,
        took_over: bool,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize,
        E: fmt::Display,
    {
        let value = match result {
            Ok(value) => value,
            Err(err) => {
                self.release(claim, &format!("the function failed: {err}"))
                    .await;
                return Err(ExecuteError::Function(err));
            }
        };
        let data = match serde_json::to_string(&value) {
            Ok(data) => data,
            Err(source) => {
                self.release(claim, "its result does not serialize").await;
                return Err(ExecuteError::Idempotency(Error::Serialization {
                    key: claim.id.clone(),
                    source,
                }));
            }
        };
        let limits = self.inner.store.limits();
        let size = limits.record_overhead_bytes
            + claim.id.len()
            + data.len()
            + claim.lease_token.len()
            + claim.validation.as_ref().map_or(0, String::len);
        let max = limits.max_record_bytes;
        let too_large = size > max;
        if too_large {
            error!(
                size,
                max,
                "the result is too large to store; marking the record completed without it so the function never runs twice"
            );
        }
        let expiration = clock::add(self.now(), self.inner.config.expires_after);
        let stored = (!too_large).then_some(data.as_str());
        let store = &self.inner.store;
        // The result is already paid for: retry for as long as the lease allows. A retry
        // after a lost answer finds the record completed with its own token and succeeds.
        let completed = self
            .retry(store_cutoff(claim), u32::MAX, || {
                store.complete(&claim.id, &claim.lease_token, stored, expiration)
            })
            .await;
        match completed {
            Ok(()) if too_large => Err(ExecuteError::Idempotency(Error::ResultTooLarge {
                key: claim.id.clone(),
                size,
                max,
            })),
            Ok(()) => {
                debug!("completed");
                if let Some(cache) = &self.inner.cache {
                    cache.insert(
                        claim.id.clone(),
                        Cached {
                            data: Some(data),
                            validation: claim.validation.clone(),
                            expiration,
                        },
                    );
                }
                Ok((
                    value,
                    if took_over {
                        Outcome::TookOver
                    } else {
                        Outcome::Executed
                    },
                ))
            }
            Err(Error::LeaseLost { key }) => {
                warn!("lease lost before completion: another worker took the record over");
                Err(ExecuteError::Idempotency(Error::LeaseLost { key }))
            }
            Err(err) => {
                error!(error = %err, lease_until = ?claim.lease_until, "RESULT LOST: the function ran but its result could not be stored; the record stays in progress until its lease ends, and a later delivery will run the function again");
                Ok((value, Outcome::ExecutedUnstored))
            }
        }
    }

    async fn release(&self, claim: &Claim, why: &str) {
        let store = &self.inner.store;
        let released = self
            .retry(
                store_cutoff(claim),
                self.inner.config.max_store_attempts,
                || store.release(&claim.id, &claim.lease_token),
            )
            .await;
        match released {
            Ok(()) => info!(reason = why, "released the claim"),
            Err(err) => {
                warn!(reason = why, error = %err, "could not release the claim; it will be taken over when its lease ends")
            }
        }
    }

    fn now(&self) -> SystemTime {
        self.inner.config.clock.now()
    }

    fn lease_until(&self, now: SystemTime, deadline: Option<SystemTime>) -> SystemTime {
        let until = match (self.inner.config.lease, deadline) {
            (Some(lease), _) => clock::add(now, lease),
            (None, Some(deadline)) => deadline.min(clock::far_future()),
            (None, None) => clock::add(now, config::DEFAULT_LEASE),
        };
        until.max(clock::add(now, config::MIN_LEASE))
    }

    /// Runs one store request up to `max_attempts` times on retryable errors, with
    /// backoff. Every attempt is cut off after the attempt timeout or at `cutoff`,
    /// whichever comes first (a timed-out attempt is a retryable error: it may have been
    /// applied, which the store's own-token conditions make safe to repeat), and no
    /// retry starts past `cutoff`. The engine is the only retrier: it knows the deadline.
    async fn retry<'a, R>(
        &self,
        cutoff: SystemTime,
        max_attempts: u32,
        mut op: impl FnMut() -> crate::store::BoxFuture<'a, Result<R, Error>>,
    ) -> Result<R, Error> {
        let mut backoff = config::BASE_BACKOFF;
        let mut attempt = 1;
        loop {
            let left = clock::until(self.now(), cutoff);
            let timeout = self
                .inner
                .config
                .store_attempt_timeout
                .min(left)
                .max(MIN_ATTEMPT_TIMEOUT);
            let result = match tokio::time::timeout(timeout, op()).await {
                Ok(result) => result,
                Err(_) => Err(Error::store(
                    self.inner.store.name(),
                    true,
                    format!("no answer within {timeout:?}; the request may have been applied"),
                )),
            };
            match result {
                Err(err) if err.is_store_retryable() && attempt < max_attempts => {
                    let sleep = jitter(backoff);
                    if clock::add(self.now(), sleep) >= cutoff {
                        return Err(err);
                    }
                    warn!(error = %err, attempt, "store request failed; retrying");
                    tokio::time::sleep(sleep).await;
                    backoff = (backoff * 2).min(config::MAX_BACKOFF);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

impl Error {
    fn is_store_retryable(&self) -> bool {
        matches!(
            self,
            Error::Store {
                retryable: true,
                ..
            }
        )
    }
}

enum Claimed<T> {
    Run { claim: Claim, took_over: bool },
    Stored(T),
    Cached(T),
}

/// When store requests for `claim` stop: shortly before its lease ends, leaving the
/// handler time to answer Lambda before the invocation's deadline.
fn store_cutoff(claim: &Claim) -> SystemTime {
    let lease = clock::until(claim.now, claim.lease_until);
    claim.lease_until - config::COMPLETION_MARGIN.min(lease / 10)
}

/// Refuses a name holding a separator of the stored id, which would let two different
/// operations share ids.
fn check_name(what: &'static str, name: &str, forbidden: &[char]) -> Result<(), Error> {
    match name.chars().find(|c| forbidden.contains(c)) {
        Some(c) => Err(Error::InvalidName {
            what,
            name: name.to_owned(),
            reason: format!("it contains {c:?}, which separates the parts of a stored id"),
        }),
        None => Ok(()),
    }
}

fn check_validation(id: &str, stored: Option<&str>, ours: Option<&str>) -> Result<(), Error> {
    match (stored, ours) {
        (Some(stored), Some(ours)) if stored != ours => {
            warn!("payload mismatch: the key was used with a different payload");
            Err(Error::PayloadMismatch { key: id.to_owned() })
        }
        _ => Ok(()),
    }
}

fn decode<T: DeserializeOwned>(id: &str, data: Option<&str>) -> Result<T, Error> {
    match data {
        Some(data) => serde_json::from_str(data).map_err(|source| Error::Serialization {
            key: id.to_owned(),
            source,
        }),
        // Completed without data: the result was too large to store.
        None => Err(Error::ResultNotStored { key: id.to_owned() }),
    }
}

/// A token unique to this claim: 64 random bits, this process's start time and a counter.
fn new_lease_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = *PROCESS.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        nanos ^ (u64::from(std::process::id()) << 32) ^ fastrand::u64(..)
    });
    format!(
        "{:016x}{:016x}{:08x}",
        fastrand::u64(..),
        process,
        COUNTER.fetch_add(1, Ordering::Relaxed) as u32
    )
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + fastrand::f64() * 0.5)
}

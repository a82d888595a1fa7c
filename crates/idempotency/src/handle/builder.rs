//! The handle's builder: its settings, checked when built.

use super::Idempotency;
use crate::clock::Clock;
use crate::config::{self, Config};
use crate::engine::cache::CompletedCache;
use crate::engine::{Engine, MIN_ATTEMPT_TIMEOUT};
use crate::error::Error;
use crate::operation::check_function_name;
use crate::store::IdempotencyStore;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// Builds an [`Idempotency`] handle.
#[derive(Debug)]
pub struct IdempotencyBuilder {
    pub(super) store: Arc<dyn IdempotencyStore>,
    pub(super) config: Config,
    pub(super) clock: Arc<dyn Clock>,
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
    /// hours, as [`Operation::lease`](crate::Operation::lease) does.
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

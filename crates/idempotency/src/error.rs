//! The one error type of the library.

use std::error::Error as StdError;
use std::fmt;
use std::time::SystemTime;

/// A boxed error from a store backend or a wrapped function.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything the idempotency layer can refuse or fail with.
///
/// Variants are structured so a caller can decide the message's outcome:
/// [`Error::AlreadyInProgress`] means "redeliver later", [`Error::PayloadMismatch`] and
/// [`Error::KeyMissing`] will never succeed on retry (let the message reach the
/// dead-letter queue), [`Error::Store`] with `retryable: true` is worth another delivery.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Another worker holds a live lease on this key. Hand the message back for redelivery.
    AlreadyInProgress {
        /// The stored idempotency id.
        key: String,
        /// When the other worker's lease runs out and the record can be taken over.
        lease_expires: SystemTime,
    },
    /// The key was used before with a different payload (its validation hash differs).
    /// The earlier result is deliberately not returned.
    PayloadMismatch {
        /// The stored idempotency id.
        key: String,
    },
    /// The payload has no value where the key strategy looks for one (or an empty one:
    /// `null`, `""`, `[]` or `{}`).
    KeyMissing {
        /// What was looked for: a JSON pointer or a field list.
        field: String,
    },
    /// The payload could not be turned into a key (not serializable, or a closure failed).
    InvalidKey {
        /// Why.
        reason: String,
        /// The underlying error: the serializer's, or a custom key function's.
        source: Option<BoxError>,
    },
    /// A function name, operation name or key prefix holds a character that separates the
    /// parts of a stored id, so two different operations could share ids.
    InvalidName {
        /// Which name: `"function name"`, `"operation name"` or `"key prefix"`.
        what: &'static str,
        /// The name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// The stored id is longer than the store's partition key limit.
    KeyTooLong {
        /// The stored idempotency id, cut to its first 64 bytes.
        key_prefix: String,
        /// Its length in bytes.
        len: usize,
        /// The store's limit in bytes.
        max: usize,
    },
    /// Another worker took over this record after our lease ran out: our completion or
    /// release was refused so the new owner's record stays intact.
    LeaseLost {
        /// The stored idempotency id.
        key: String,
    },
    /// The function's result is too large to store. The function ran once; the record is
    /// marked completed without data, so later deliveries get this error too and never
    /// run the function again.
    ResultTooLarge {
        /// The stored idempotency id.
        key: String,
        /// The serialized record size in bytes.
        size: usize,
        /// The store's limit in bytes.
        max: usize,
    },
    /// A duplicate of a call whose result was too large to store: the function ran once
    /// and is not run again; there is nothing to replay.
    ResultNotStored {
        /// The stored idempotency id.
        key: String,
    },
    /// The result could not be serialized, or a stored result could not be deserialized
    /// into the function's return type.
    Serialization {
        /// The stored idempotency id.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The record kept changing between the conditional write and the read that followed.
    InconsistentState {
        /// The stored idempotency id.
        key: String,
        /// How many claims were tried.
        attempts: u32,
    },
    /// The store failed.
    Store {
        /// Which backend: `"dynamodb"`, `"memory"`, ...
        backend: &'static str,
        /// Whether the same request may succeed later (throttling, a 5xx, a timeout).
        retryable: bool,
        /// The backend's error.
        source: BoxError,
    },
}

impl Error {
    /// Whether a later delivery of the same message may succeed.
    ///
    /// Batch processing hands every error back as a batch item failure either way; this
    /// tells logs and metrics whether to expect the message in the dead-letter queue.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::AlreadyInProgress { .. }
            | Error::LeaseLost { .. }
            | Error::InconsistentState { .. } => true,
            Error::Store { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether the engine may repeat the store request that failed with this error
    /// (throttling, a 5xx, a timeout). Narrower than [`is_retryable`](Self::is_retryable),
    /// which is about the whole message.
    pub(crate) fn is_retryable_store_error(&self) -> bool {
        matches!(
            self,
            Error::Store {
                retryable: true,
                ..
            }
        )
    }

    pub(crate) fn store(
        backend: &'static str,
        retryable: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Store {
            backend,
            retryable,
            source: source.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::AlreadyInProgress { key, lease_expires } => {
                let left = lease_expires
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                write!(
                    f,
                    "idempotency key {key:?} is already in progress in another worker (lease ends in {:.1}s); retry later",
                    left.as_secs_f64()
                )
            }
            Error::PayloadMismatch { key } => write!(
                f,
                "idempotency key {key:?} was already used with a different payload; refusing to return its result"
            ),
            Error::KeyMissing { field } => write!(
                f,
                "the payload has no idempotency key at {field}; refusing to process it without one"
            ),
            Error::InvalidKey { reason, source } => {
                write!(f, "cannot derive an idempotency key: {reason}")?;
                if let Some(source) = source {
                    write!(f, ": {source}")?;
                }
                Ok(())
            }
            Error::InvalidName { what, name, reason } => write!(
                f,
                "invalid idempotency {what} {name:?}: {reason}; choose another name"
            ),
            Error::KeyTooLong {
                key_prefix,
                len,
                max,
            } => write!(
                f,
                "idempotency id {key_prefix:?}... is {len} bytes, over the store's {max}-byte key limit; hash the key instead"
            ),
            Error::LeaseLost { key } => write!(
                f,
                "lost the lease on idempotency key {key:?}: another worker took it over, so this worker's result was not stored"
            ),
            Error::ResultTooLarge { key, size, max } => write!(
                f,
                "the result for idempotency key {key:?} is {size} bytes, over the store's {max}-byte limit; the function ran once and its result was not stored"
            ),
            Error::ResultNotStored { key } => write!(
                f,
                "idempotency key {key:?} completed earlier but its result was too large to store; the function is not run again"
            ),
            Error::Serialization { key, source } => write!(
                f,
                "cannot (de)serialize the result for idempotency key {key:?}: {source}"
            ),
            Error::InconsistentState { key, attempts } => write!(
                f,
                "the record for idempotency key {key:?} kept changing during {attempts} claim attempts"
            ),
            Error::Store {
                backend,
                retryable,
                source,
            } => {
                let kind = if *retryable {
                    "retryable"
                } else {
                    "not retryable"
                };
                write!(f, "{backend} idempotency store error ({kind}): {source}")?;
                // The backend's own chain (an SDK error says little at its top level).
                let mut cause = source.source();
                while let Some(c) = cause {
                    write!(f, ": {c}")?;
                    cause = c.source();
                }
                Ok(())
            }
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Serialization { source, .. } => Some(source),
            Error::InvalidKey {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            Error::Store { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// What [`Idempotency::execute`](crate::Idempotency::execute) fails with: either the
/// idempotency layer refused or failed, or the wrapped function returned its own error
/// (after which the record was released).
#[derive(Debug)]
pub enum ExecuteError<E> {
    /// The idempotency layer's own error.
    Idempotency(Error),
    /// The wrapped function's error, unchanged.
    Function(E),
}

impl<E> ExecuteError<E> {
    /// Folds both cases into the function's error type, the shape a handler returns.
    pub fn into_inner(self) -> E
    where
        E: From<Error>,
    {
        match self {
            ExecuteError::Idempotency(e) => E::from(e),
            ExecuteError::Function(e) => e,
        }
    }
}

impl<E: fmt::Display> fmt::Display for ExecuteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecuteError::Idempotency(e) => e.fmt(f),
            ExecuteError::Function(e) => e.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for ExecuteError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            ExecuteError::Idempotency(e) => Some(e),
            ExecuteError::Function(e) => Some(e),
        }
    }
}

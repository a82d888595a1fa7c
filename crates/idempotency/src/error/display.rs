//! How an error reads: its one-line message (with the commands an operator runs, where
//! there are some), and its `Debug` forms.

use super::{Error, report};
use std::error::Error as StdError;
use std::fmt;

/// `text` as one argument for a POSIX shell: single-quoted, each `'` written `'\''`. A
/// tenant's stored id starts with `#`, which a shell reads as a comment when unquoted.
pub(super) fn shell_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::AlreadyInProgress {
                key, retry_after, ..
            } => {
                write!(
                    f,
                    "idempotency key {key:?} is already in progress in another worker (lease ends in {:.1}s); retry later",
                    retry_after.as_secs_f64()
                )
            }
            Error::ClaimAbandoned {
                key,
                lease_ended,
                claimed_at,
            } => {
                write!(f, "idempotency key {key:?} was claimed ")?;
                match claimed_at {
                    Some(at) => write!(f, "at {}", crate::clock::Utc(*at))?,
                    None => f.write_str("earlier")?,
                }
                let quoted = shell_quoted(key);
                write!(
                    f,
                    " by a run whose lease ended at {} without an outcome (it crashed or timed out): the earlier run's outcome is unknown, and the operation is at-most-once, so it is not run again. An operator checks whether its effect happened (`lambda-idempotency get {quoted}`), then forgets the record (`lambda-idempotency forget {quoted} --if-version V`, V the version `get` printed) to let the next delivery run; see docs/deploy.md",
                    crate::clock::Utc(*lease_ended)
                )
            }
            Error::PayloadMismatch { key } => write!(
                f,
                "idempotency key {key:?} was already used with a different payload; refusing to return its result"
            ),
            Error::MalformedBody { reason } => write!(
                f,
                "the request could not be read from the payload: {reason}"
            ),
            Error::KeyMissing { field } => write!(
                f,
                "the payload has no idempotency key at {field}; refusing to process it without one"
            ),
            Error::InvalidKey { reason, .. } => {
                write!(f, "cannot derive an idempotency key: {reason}")
            }
            Error::InvalidName { what, name, reason } => {
                write!(f, "invalid idempotency {what} {name:?}: {reason}")
            }
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
            Error::Serialization { key, .. } => write!(
                f,
                "the result for idempotency key {key:?} does not serialize to JSON"
            ),
            Error::StoredResultIncompatible { key, .. } => write!(
                f,
                "the stored result for idempotency key {key:?} does not deserialize into the function's return type, which changed since it was stored; the function is not run again. Keep old records readable (`#[serde(default)]` on new fields) or version the operation's name"
            ),
            Error::ReplayAnswerIncompatible { key, .. } => write!(
                f,
                "the operation's replay hook answered idempotency key {key:?} with a value that does not deserialize into the function's return type; the stored result is intact and the function is not run again: fix the hook"
            ),
            Error::InProgressAnswerIncompatible { key, .. } => write!(
                f,
                "idempotency key {key:?} is in progress and the operation's in-progress answer does not deserialize into the function's return type"
            ),
            Error::TwinFailed { key, reason, .. } => write!(
                f,
                "a twin of this record with idempotency key {key:?} ran in the same batch and failed: {reason}"
            ),
            Error::WritesRefused {
                key,
                reason,
                retryable: true,
            } => write!(
                f,
                "the store refused the function's writes for idempotency key {key:?}, so neither they nor the result were stored (the claim is released: a later delivery runs the function again): {reason}"
            ),
            Error::WritesRefused {
                key,
                reason,
                retryable: false,
            } => write!(
                f,
                "the store refused the function's writes for idempotency key {key:?} by their own condition, so neither they nor the result were stored; no later delivery can change that, so the refusal is the record's answer and later deliveries answer it without running the function (forget the record to run again, once the rows that refused them are deleted or upserted): {reason}"
            ),
            Error::WritesInvalid { key, reason } => write!(
                f,
                "the function's writes for idempotency key {key:?} cannot be made as built, so nothing was written and the claim is released (a mistake in the code: fixing it heals the message): {reason}"
            ),
            Error::WritesUnsupported { store, writes } => write!(
                f,
                "the {store} store cannot commit writes built for {writes} with a completion; nothing was written"
            ),
            Error::Unsupported { store, request } => write!(
                f,
                "the {store} store does not support {request} (an operator's request it may refuse)"
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
                // The backend's error is the source: [`report`] prints the whole chain.
                let _ = source;
                write!(f, "{backend} idempotency store error ({kind})")
            }
        }
    }
}

impl Error {
    /// The variant's name, for the structured `{:#?}`.
    fn variant(&self) -> &'static str {
        match self {
            Error::AlreadyInProgress { .. } => "AlreadyInProgress",
            Error::ClaimAbandoned { .. } => "ClaimAbandoned",
            Error::PayloadMismatch { .. } => "PayloadMismatch",
            Error::MalformedBody { .. } => "MalformedBody",
            Error::KeyMissing { .. } => "KeyMissing",
            Error::InvalidKey { .. } => "InvalidKey",
            Error::InvalidName { .. } => "InvalidName",
            Error::KeyTooLong { .. } => "KeyTooLong",
            Error::LeaseLost { .. } => "LeaseLost",
            Error::ResultTooLarge { .. } => "ResultTooLarge",
            Error::ResultNotStored { .. } => "ResultNotStored",
            Error::Serialization { .. } => "Serialization",
            Error::StoredResultIncompatible { .. } => "StoredResultIncompatible",
            Error::ReplayAnswerIncompatible { .. } => "ReplayAnswerIncompatible",
            Error::InProgressAnswerIncompatible { .. } => "InProgressAnswerIncompatible",
            Error::TwinFailed { .. } => "TwinFailed",
            Error::WritesRefused { .. } => "WritesRefused",
            Error::WritesInvalid { .. } => "WritesInvalid",
            Error::WritesUnsupported { .. } => "WritesUnsupported",
            Error::Unsupported { .. } => "Unsupported",
            Error::InconsistentState { .. } => "InconsistentState",
            Error::Store { .. } => "Store",
        }
    }
}

/// `{:?}` is [`report`]: the sentence and its causes, as anyhow's `Debug` is, so a `main`
/// that returns the error with `?` prints `Error: ` and a readable line. `{:#?}` is the
/// variant with each layer's text (a cause's `Display`, never a driver's `Debug`, which
/// may hold a connection's settings).
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return f.write_str(&report(self));
        }
        let mut causes = Vec::new();
        let mut cause = self.source();
        while let Some(c) = cause {
            causes.push(c.to_string());
            cause = c.source();
        }
        let mut structured = f.debug_struct(self.variant());
        structured
            .field("message", &self.to_string())
            .field("retryable", &self.is_retryable())
            .field("permanent", &self.is_permanent());
        if !causes.is_empty() {
            structured.field("causes", &causes);
        }
        structured.finish()
    }
}

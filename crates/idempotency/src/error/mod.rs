//! The one error type of the library.

mod display;
mod execute;
mod failure;

pub use execute::{ExecuteError, report};
pub use failure::FailureKind;

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

/// A boxed error from a store backend or a wrapped function.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything the idempotency layer can refuse or fail with.
///
/// Variants are structured so a caller can decide the message's outcome:
/// [`Error::AlreadyInProgress`] means "redeliver later", [`Error::PayloadMismatch`] and
/// [`Error::KeyMissing`] will never succeed on retry (let the message reach the
/// dead-letter queue), [`Error::Store`] with `retryable: true` is worth another delivery.
///
/// Printed, as every error of this crate: `{}` is its own layer only, [`report`] (and `{:?}`,
/// what a `main` that returns it with `?` prints) the sentence and every cause on one line;
/// `{:#?}` is structured.
#[non_exhaustive]
pub enum Error {
    /// Another worker holds a live lease on this key. Hand the message back for redelivery.
    AlreadyInProgress {
        /// The stored idempotency id.
        key: String,
        /// When the other worker's lease runs out and the record can be taken over.
        lease_expires: SystemTime,
        /// How long from when this answer was made (by the handle's clock) until the record
        /// can be taken over: when to try again (an HTTP `Retry-After`, a visibility
        /// timeout). For a record without a lease (Powertools writes those outside Lambda)
        /// it runs to the record's expiry, which may be days away: cap it to your
        /// transport's limit (SQS visibility timeouts end at 12 hours).
        retry_after: Duration,
    },
    /// An [at-most-once](crate::Operation::at_most_once) operation found its key claimed by
    /// a run whose lease ended without an outcome: that worker crashed or timed out, and
    /// whether its effect happened is unknown. The function is not run again; retrying
    /// never helps until an operator reads the record (`lambda-idempotency get '<key>'`),
    /// settles what happened, and forgets it (`lambda-idempotency forget '<key>'`) to let
    /// the next delivery run. See "At most once" in the repository's `docs/design.md`.
    ClaimAbandoned {
        /// The stored idempotency id.
        key: String,
        /// When the earlier run's lease ended (stored in the record, to the millisecond).
        lease_ended: SystemTime,
        /// When the earlier claim was made, to the second: the record's expiry less the
        /// handle's `expires_after` (right when that setting has not changed since).
        /// `None` when the expiry does not say (it was set by the lease, being later).
        claimed_at: Option<SystemTime>,
    },
    /// The key was used before with a different payload (its validation hash differs).
    /// The earlier result is deliberately not returned.
    PayloadMismatch {
        /// The stored idempotency id.
        key: String,
    },
    /// The request could not be taken out of the invocation's payload: its
    /// [`Envelope`](crate::Envelope) did not open (not a notification, bad base64 or
    /// gzip). It will not open next time either.
    MalformedBody {
        /// What was wrong, naming the envelope.
        reason: String,
    },
    /// The payload has no value where the key strategy looks for one (or an empty one:
    /// `null`, `""`, `[]` or `{}`).
    KeyMissing {
        /// What was looked for, as written: a JSON pointer, a field's name or a field list.
        field: String,
    },
    /// The payload could not be turned into a key (not serializable, or a closure failed).
    InvalidKey {
        /// Why.
        reason: String,
        /// The underlying error: the serializer's, or a custom key function's.
        source: Option<BoxError>,
    },
    /// A setting that could not work: a function name, operation name or key prefix that
    /// is empty or holds a character that separates the parts of a stored id (so two
    /// different operations could share ids), or a key or field pointer that is no JSON
    /// pointer (so it would find nothing in any payload), or a store's table name that
    /// cannot work. Raised when the handle, the operation or the store is built, never
    /// per message (but for `#[idempotent]`'s `hash = CONST`
    /// and `validate = CONST`, checked at the first call).
    InvalidName {
        /// Which setting: `"function name"`, `"operation name"`, `"key prefix"`,
        /// `"key pointer"`, `"key field"`, `"validation field"`, `"table name"` (the
        /// PostgreSQL store's), one of the HTTP layer's (`"key header name"`,
        /// `"fingerprint header name"`, `"replay header name"`, `"key length"`,
        /// `"caller scope"`), or `"execution timeout"` (a durable execution's).
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
    /// The function's result could not be serialized to JSON (a map with non-string keys,
    /// say). The function ran; its claim was released.
    Serialization {
        /// The stored idempotency id.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A completed record's stored result does not deserialize into the function's return
    /// type: the type changed since the result was stored (a field added without
    /// `#[serde(default)]`, a field renamed, another type). Retrying never helps; the
    /// function is not run again, since it already ran once for this key. Evolve result
    /// types so old records still deserialize (`#[serde(default)]` on new fields,
    /// `Option`), or, to run every key again, change the operation's name or `key_prefix`
    /// (a new version): see "Changing a result type" in the repository's `docs/design.md`.
    StoredResultIncompatible {
        /// The stored idempotency id.
        key: String,
        /// The serde error (what did not match, never the stored data).
        source: serde_json::Error,
    },
    /// The answer the operation's replay hook
    /// ([`Operation::on_replay`](crate::Operation::on_replay)) gave does not deserialize
    /// into the function's return type: a bug in the hook. The stored result is intact and
    /// the function is not run again; fixing the hook heals it.
    ReplayAnswerIncompatible {
        /// The stored idempotency id.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The answer [`Operation::when_in_progress`](crate::Operation::when_in_progress) gave
    /// for a key in progress does not deserialize into the function's return type: a bug
    /// in that answer. Retryable as the in-progress error it stands for: a later call
    /// finds the record completed or free.
    InProgressAnswerIncompatible {
        /// The stored idempotency id.
        key: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A twin of this call (the same stored id, in the same batch invocation) ran at the
    /// same time and failed, so this call failed with it instead of running the function a
    /// second time.
    TwinFailed {
        /// The stored idempotency id.
        key: String,
        /// The twin's failure.
        reason: String,
        /// Whether a later delivery may succeed (the twin's failure's own class).
        retryable: bool,
        /// The twin's failure's kind, as its batch classified it: a twin of a
        /// [`PermanentError`](crate::PermanentError) is permanent, of a panic `Panicked`.
        kind: FailureKind,
    },
    /// The function's own writes were refused by their own condition, so nothing was
    /// written: a condition of one of its items failed (a DynamoDB `ConditionCheck` or
    /// condition expression, a PostgreSQL constraint such as a unique key, or a statement
    /// that changed other than the rows it expected).
    ///
    /// No later delivery can change that (the rows that refuse them stay), so by default
    /// the refusal is **permanent**: the record is completed with it, the function is not
    /// run again, and every later delivery answers this same error (`retryable: false`)
    /// until the record expires. An operation whose refusals a later delivery can heal
    /// ([`Operation::refused_writes_retryable`](crate::Operation::refused_writes_retryable))
    /// releases the claim instead (`retryable: true`), and the next delivery runs the
    /// function again.
    WritesRefused {
        /// The stored idempotency id.
        key: String,
        /// Which write, and why (never its values).
        reason: String,
        /// Whether a later delivery runs the function again: the operation said so, or the
        /// store knows the condition can come to hold (a PostgreSQL foreign key whose
        /// parent row may arrive later).
        retryable: bool,
    },
    /// The function's writes cannot be made as they were built, whatever the rows hold: too
    /// many or too large for one transaction, a write without an operation or on the
    /// record's own item, a statement that would end the transaction. Nothing was written
    /// and the claim is released: a mistake in the code, which fixing heals (as
    /// [`WritesUnsupported`](Self::WritesUnsupported)); never kept in the record.
    WritesInvalid {
        /// The stored idempotency id.
        key: String,
        /// Which write, and why.
        reason: String,
    },
    /// The function returned writes of a type its store cannot commit with a completion
    /// (another store's writes, or a store without writes: Redis). Nothing was written; the
    /// claim is released. A deployment mistake: fixing the code heals it.
    WritesUnsupported {
        /// The store's name.
        store: &'static str,
        /// The store the writes were built for.
        writes: &'static str,
    },
    /// The store does not offer an operator's request ([`forget`] or [`list`]); the
    /// engine never needs them.
    ///
    /// [`forget`]: crate::store::IdempotencyStore::forget
    /// [`list`]: crate::store::IdempotencyStore::list
    Unsupported {
        /// The store's name.
        store: &'static str,
        /// The request: `"forget"` or `"list"`.
        request: &'static str,
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
            | Error::InProgressAnswerIncompatible { .. }
            | Error::LeaseLost { .. }
            | Error::InconsistentState { .. } => true,
            Error::Store { retryable, .. }
            | Error::TwinFailed { retryable, .. }
            | Error::WritesRefused { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether this message can never succeed, whatever is retried or fixed in the store:
    /// the failure comes from the message itself (no key, a payload that differs from the
    /// stored one, a stored result its type no longer reads, a result too large to store).
    /// A store error that is not retryable (a missing table, denied access) is not
    /// permanent: fixing the deployment heals it.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::MalformedBody { .. }
            | Error::KeyMissing { .. }
            | Error::InvalidKey { .. }
            | Error::InvalidName { .. }
            | Error::KeyTooLong { .. }
            | Error::PayloadMismatch { .. }
            | Error::ResultTooLarge { .. }
            | Error::ResultNotStored { .. }
            | Error::Serialization { .. }
            | Error::StoredResultIncompatible { .. }
            | Error::ClaimAbandoned { .. } => true,
            Error::TwinFailed { kind, .. } => kind.is_permanent(),
            Error::WritesRefused { retryable, .. } => !retryable,
            Error::AlreadyInProgress { .. }
            | Error::InProgressAnswerIncompatible { .. }
            | Error::ReplayAnswerIncompatible { .. }
            | Error::LeaseLost { .. }
            | Error::InconsistentState { .. }
            | Error::WritesInvalid { .. }
            | Error::WritesUnsupported { .. }
            | Error::Unsupported { .. }
            | Error::Store { .. } => false,
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

    /// A store's failure: what a backend returns when its request fails. `retryable`
    /// when the same request may succeed later (throttling, a 5xx, a timeout, a dropped
    /// connection), so the engine retries it within the lease.
    pub fn store(backend: &'static str, retryable: bool, source: impl Into<BoxError>) -> Self {
        Error::Store {
            backend,
            retryable,
            source: source.into(),
        }
    }
}

impl Error {
    /// The kind of a failure with this error, as a batch reports it: a twin's is its
    /// sibling's.
    pub(crate) fn failure_kind(&self) -> FailureKind {
        match self {
            Error::AlreadyInProgress { .. } => FailureKind::InProgress,
            Error::TwinFailed { kind, .. } => *kind,
            Error::MalformedBody { .. } => FailureKind::MalformedBody,
            e if e.is_permanent() => FailureKind::Rejected,
            _ => FailureKind::Error,
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Serialization { source, .. }
            | Error::StoredResultIncompatible { source, .. }
            | Error::InProgressAnswerIncompatible { source, .. }
            | Error::ReplayAnswerIncompatible { source, .. } => Some(source),
            Error::InvalidKey {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            Error::Store { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);
    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn display_is_one_layer_and_report_the_whole_chain_once() {
        let driver = Layer(
            "Connection refused (os error 111)",
            Some(Box::new(Layer("Connection refused (os error 111)", None))),
        );
        let err = Error::store("redis", true, driver);
        assert_eq!(
            err.to_string(),
            "redis idempotency store error (retryable)",
            "Display is this layer only"
        );
        assert_eq!(
            report(&err),
            "redis idempotency store error (retryable): Connection refused (os error 111)"
        );
        let chain = Layer(
            "a",
            Some(Box::new(Layer("b", Some(Box::new(Layer("c", None)))))),
        );
        assert_eq!(report(&chain), "a: b: c");
        let bad: serde_json::Error = serde_json::from_str::<u8>("x").unwrap_err();
        let err = Error::InvalidKey {
            reason: "the custom key function failed".into(),
            source: Some(Box::new(bad)),
        };
        assert!(!err.to_string().contains("expected value"), "{err}");
        assert!(
            report(&err).ends_with("expected value at line 1 column 1"),
            "{}",
            report(&err)
        );
    }

    #[test]
    fn execute_error_shows_its_inner_error_once_and_gives_it_as_its_source() {
        let inner = Error::store("redis", true, Layer("refused", None));
        let err: ExecuteError<Layer> = ExecuteError::Idempotency(inner);
        assert_eq!(
            report(&err),
            "the idempotency layer failed the call: redis idempotency store error (retryable): refused"
        );
        let source = StdError::source(&err).and_then(|s| s.downcast_ref::<Error>());
        assert!(matches!(source, Some(Error::Store { .. })), "{source:?}");
        let err: ExecuteError<Layer> =
            ExecuteError::Function(Layer("a", Some(Box::new(Layer("b", None)))));
        assert_eq!(report(&err), "the idempotent function failed: a: b");
    }

    /// `{:?}`, what a `main` returning the error with `?` prints, is the report of every
    /// error a caller may print that way; `{:#?}` is structured.
    #[test]
    fn debug_is_the_report_and_the_alternate_form_is_structured() {
        let err = Error::store("redis", true, Layer("refused", None));
        assert_eq!(format!("{err:?}"), report(&err));
        let structured = format!("{err:#?}");
        assert!(
            structured.starts_with("Store {")
                && structured.contains("retryable: true")
                && structured.contains("\"refused\""),
            "{structured}"
        );
        let err: ExecuteError<Layer> = ExecuteError::Idempotency(err);
        assert_eq!(format!("{err:?}"), report(&err));
        assert!(
            format!("{err:#?}").starts_with("Idempotency(\n    Store {"),
            "{err:#?}"
        );
        let permanent = || crate::PermanentError::new(Layer("a", Some(Box::new(Layer("b", None)))));
        let err: ExecuteError<crate::PermanentError> = ExecuteError::Function(permanent());
        assert_eq!(format!("{err:?}"), "the idempotent function failed: a: b");
        assert_eq!(format!("{err:?}"), report(&err));
        assert_eq!(format!("{:?}", permanent()), "a: b");
        let err = crate::BatchError::MissingItemId { index: 3 };
        assert_eq!(format!("{err:?}"), err.to_string());
        assert_eq!(format!("{err:#?}"), "MissingItemId {\n    index: 3,\n}");
        let err = crate::OutcomeUnknown::new(crate::PermanentError::new("timed out"));
        assert_eq!(format!("{err:?}"), "outcome unknown: timed out");
    }

    #[test]
    fn an_execute_error_prints_each_cause_once_with_anyhow_and_is_still_found_behind() {
        let inner = Error::store("redis", true, Layer("connection refused", None));
        let err: ExecuteError<Layer> = ExecuteError::Idempotency(inner);
        let text = format!("{:#}", anyhow::Error::new(err));
        assert_eq!(
            text.matches("redis idempotency store error").count(),
            1,
            "{text}"
        );
        assert!(text.ends_with(": connection refused"), "{text}");
        let err: ExecuteError<crate::PermanentError> =
            ExecuteError::Function(crate::PermanentError::new("HTTP 400 from the provider"));
        let text = format!("{:#}", anyhow::Error::new(err));
        assert_eq!(text.matches("HTTP 400").count(), 1, "{text}");
        let boxed: BoxError = Box::new(ExecuteError::Function(crate::PermanentError::new("x")));
        let mut layer: Option<&(dyn StdError + 'static)> = Some(boxed.as_ref());
        let mut found = false;
        while let Some(e) = layer {
            found |= e.is::<crate::PermanentError>();
            layer = e.source();
        }
        assert!(found, "a batch still finds the PermanentError behind it");
    }

    #[test]
    fn permanent_and_retryable_kinds() {
        let key = || "k".to_string();
        let json = || serde_json::from_str::<u8>("x").unwrap_err();
        for (err, permanent, retryable) in [
            (
                Error::KeyMissing {
                    field: "/id".into(),
                },
                true,
                false,
            ),
            (Error::PayloadMismatch { key: key() }, true, false),
            (
                Error::StoredResultIncompatible {
                    key: key(),
                    source: json(),
                },
                true,
                false,
            ),
            (
                Error::Serialization {
                    key: key(),
                    source: json(),
                },
                true,
                false,
            ),
            (Error::ResultNotStored { key: key() }, true, false),
            (
                Error::TwinFailed {
                    key: key(),
                    reason: "x".into(),
                    retryable: false,
                    kind: crate::FailureKind::Rejected,
                },
                true,
                false,
            ),
            (
                // A twin of a store error that is not retryable: not permanent either.
                Error::TwinFailed {
                    key: key(),
                    reason: "x".into(),
                    retryable: false,
                    kind: crate::FailureKind::Error,
                },
                false,
                false,
            ),
            (
                Error::TwinFailed {
                    key: key(),
                    reason: "x".into(),
                    retryable: true,
                    kind: crate::FailureKind::Error,
                },
                false,
                true,
            ),
            (Error::store("memory", false, "denied"), false, false),
            (Error::store("memory", true, "throttled"), false, true),
            (Error::LeaseLost { key: key() }, false, true),
            (
                Error::ClaimAbandoned {
                    key: key(),
                    lease_ended: SystemTime::UNIX_EPOCH,
                    claimed_at: None,
                },
                true,
                false,
            ),
            (
                Error::AlreadyInProgress {
                    key: key(),
                    lease_expires: SystemTime::UNIX_EPOCH,
                    retry_after: Duration::ZERO,
                },
                false,
                true,
            ),
        ] {
            assert_eq!(
                (err.is_permanent(), err.is_retryable()),
                (permanent, retryable),
                "{err:?}"
            );
        }
    }

    /// The commands an abandoned claim's message suggests can be pasted into a shell as
    /// they are: the key single-quoted, so a tenant's id (which starts with `#`, a shell
    /// comment) and any `'`, `$`, space or `;` in a key stay part of the argument.
    #[test]
    fn an_abandoned_claims_commands_quote_the_key_for_a_shell() {
        let abandoned = |key: &str| {
            Error::ClaimAbandoned {
                key: key.to_owned(),
                lease_ended: SystemTime::UNIX_EPOCH,
                claimed_at: None,
            }
            .to_string()
        };
        let text = abandoned("#acme#fn.pay#k-1");
        assert!(
            text.contains("`lambda-idempotency get '#acme#fn.pay#k-1'`"),
            "{text}"
        );
        assert!(
            text.contains("`lambda-idempotency forget '#acme#fn.pay#k-1' --if-version V`"),
            "{text}"
        );
        let text = abandoned("fn.pay#it's $HOME; rm -rf x");
        assert!(
            text.contains(r#"get 'fn.pay#it'\''s $HOME; rm -rf x'`"#),
            "{text}"
        );
        assert_eq!(super::display::shell_quoted("a'b"), r#"'a'\''b'"#);
        assert_eq!(super::display::shell_quoted(""), "''");
    }
}

//! An idempotent operation (its key, the fields a duplicate must match, the stored id's
//! prefix), and how a call was answered.

use crate::error::Error;
use crate::key::KeyStrategy;
use serde_json::Value;

/// What separates the parts of a stored id: `{function_name}.{operation}#{key}`. The
/// function name may hold neither, the operation and an explicit key prefix no `#`, so
/// the first `#` ends the prefix and the first `.` the function name: two different
/// (function, operation, key) never share an id.
const PREFIX_END: char = '#';
const FUNCTION_END: char = '.';

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
    pub(crate) name: String,
    pub(crate) key: KeyStrategy,
    pub(crate) validation: Option<Vec<String>>,
    pub(crate) key_prefix: Option<String>,
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

    /// The stored id for `payload`: `{function_name}.{name}#{key}`, or `{key_prefix}#{key}`.
    pub(crate) fn stored_id(&self, function_name: &str, payload: &Value) -> Result<String, Error> {
        let key = self.key.derive(payload)?;
        match &self.key_prefix {
            Some(prefix) => {
                check_name("key prefix", prefix, &[PREFIX_END])?;
                Ok(format!("{prefix}{PREFIX_END}{key}"))
            }
            None => {
                check_name("function name", function_name, &[FUNCTION_END, PREFIX_END])?;
                check_name("operation name", &self.name, &[PREFIX_END])?;
                Ok(format!(
                    "{function_name}{FUNCTION_END}{}{PREFIX_END}{key}",
                    self.name
                ))
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ran_says_whether_the_function_ran() {
        for (outcome, ran) in [
            (Outcome::Executed, true),
            (Outcome::TookOver, true),
            (Outcome::ExecutedUnstored, true),
            (Outcome::Disabled, true),
            (Outcome::Replayed, false),
            (Outcome::ReplayedFromCache, false),
        ] {
            assert_eq!(outcome.ran(), ran, "{outcome:?}");
        }
    }

    #[test]
    fn names_and_stored_ids() {
        let op = Operation::new("charge", KeyStrategy::field("id"));
        assert_eq!(op.name(), "charge");
        let payload = serde_json::json!({"id": "42"});
        assert_eq!(
            op.stored_id("orders", &payload).unwrap(),
            "orders.charge#42"
        );
        let pinned = op.key_prefix("v1-charge");
        assert_eq!(
            pinned.stored_id("orders", &payload).unwrap(),
            "v1-charge#42"
        );
    }
}

//! An idempotent operation: its key, the fields a duplicate must match, the stored id's
//! prefix, and its hooks (the replay hook, the in-progress answer).

pub(crate) mod in_progress;
pub(crate) mod outcome;
pub(crate) mod replay;

pub use outcome::Outcome;

use crate::error::Error;
use crate::key::KeyStrategy;
use crate::metrics::OutcomeKeys;
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What separates the parts of a stored id: `{function_name}.{operation}#{key}`. The
/// function name may hold neither, the operation and an explicit key prefix no `#`, so
/// the first `#` ends the prefix and the first `.` the function name: two different
/// (function, operation, key) never share an id.
///
/// An invocation with a tenant (Lambda's tenant isolation mode) prefixes its ids with
/// `#{tenant}#`, the tenant percent-encoded ([`push_tenant`]): `#{tenant}#{prefix}#{key}`.
/// That keeps every id apart from every other:
/// - no untenanted id starts with `#` (its prefix is a name, never empty, holding no `#`),
///   and every tenanted one does;
/// - the encoded tenant holds no `#`, so the second `#` ends it; the encoding is
///   one-to-one, so two tenants never share it;
/// - after it, `{prefix}#{key}` splits as an untenanted id does.
///
/// The tenant goes first, not after the prefix: there the key (any text, `#` included) of
/// an untenanted id could spell another tenant's id.
const PREFIX_END: char = '#';
const FUNCTION_END: char = '.';
/// What a tenanted id starts with, and the end of its tenant.
const TENANT_MARK: char = '#';

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
    /// Never take over a claim whose lease ended; see [`at_most_once`](Self::at_most_once).
    pub(crate) at_most_once: bool,
    /// This operation's lease, in place of the handle's; see [`lease`](Self::lease).
    pub(crate) lease: Option<Duration>,
    /// What a replay returns, changed (see [`on_replay`](Self::on_replay)).
    pub(crate) on_replay: Option<replay::ReplayHook>,
    /// What a direct call returns for a key in progress (see
    /// [`when_in_progress`](Self::when_in_progress)).
    pub(crate) when_in_progress: Option<in_progress::InProgressAnswer>,
    /// Writes refused by their own condition release the claim instead of being kept
    /// (see [`refused_writes_retryable`](Self::refused_writes_retryable)).
    pub(crate) refused_writes_retryable: bool,
    /// Its outcome counters, built by its first call (shared by its clones).
    pub(crate) outcome_keys: OutcomeKeysCache,
}

impl Operation {
    /// An operation named `name` (the function's name, usually) with its key strategy.
    ///
    /// # Panics
    ///
    /// If `name` is empty or contains `#`, which ends the stored id's prefix (see
    /// [`try_new`](Self::try_new) for a name read at run time). Build operations at
    /// start-up, so that a bad name fails the init phase instead of every message.
    pub fn new(name: impl Into<String>, key: KeyStrategy) -> Self {
        Self::try_new(name, key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`new`](Self::new), returning [`Error::InvalidName`] instead of panicking.
    pub fn try_new(name: impl Into<String>, key: KeyStrategy) -> Result<Self, Error> {
        let op = Self::unchecked(name.into(), key);
        op.check()?;
        Ok(op)
    }

    pub(crate) fn unchecked(name: String, key: KeyStrategy) -> Self {
        Self {
            name,
            key,
            validation: None,
            key_prefix: None,
            at_most_once: false,
            lease: None,
            on_replay: None,
            when_in_progress: None,
            refused_writes_retryable: false,
            outcome_keys: OutcomeKeysCache::default(),
        }
    }

    /// Its outcome counters under `function` (the handle's function name): built once,
    /// then shared; an operation used by handles of two functions counts the second's
    /// with keys built per count, as the first call's were before the cache.
    pub(crate) fn outcome_keys(&self, function: &str) -> Arc<OutcomeKeys> {
        let keys = self
            .outcome_keys
            .0
            .get_or_init(|| Arc::new(OutcomeKeys::new(function, &self.name)));
        if keys.is_for(function, &self.name) {
            Arc::clone(keys)
        } else {
            Arc::new(OutcomeKeys::uncached(function, &self.name))
        }
    }

    /// Every name and pointer of the operation, as [`Error::InvalidName`] for the first
    /// that would not work: a name that could share ids with another operation's, or a
    /// pointer that would find nothing in any payload.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_name("operation name", &self.name, &[PREFIX_END])?;
        self.key.check()?;
        if let Some(fields) = &self.validation {
            crate::key::check_fields("validation field", fields)?;
        }
        if let Some(prefix) = &self.key_prefix {
            check_name("key prefix", prefix, &[PREFIX_END])?;
        }
        if let Some(lease) = self.lease {
            check_lease(lease)?;
        }
        Ok(())
    }

    /// Stores a hash of these fields (top-level names or JSON pointers) and refuses a later
    /// call with the same key whose fields differ ([`Error::PayloadMismatch`]).
    ///
    /// # Panics
    ///
    /// If a field that starts with `/` is not a valid JSON pointer.
    pub fn validate<I, S>(self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.validate_unchecked(fields.into_iter().map(Into::into).collect())
            .or_panic()
    }

    /// Like [`validate`](Self::validate), returning [`Error::InvalidName`] instead of
    /// panicking.
    pub fn try_validate<I, S>(self, fields: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let op = self.validate_unchecked(fields.into_iter().map(Into::into).collect());
        op.check()?;
        Ok(op)
    }

    pub(crate) fn validate_unchecked(mut self, fields: Vec<String>) -> Self {
        self.validation = Some(fields);
        self
    }

    /// Sets the id prefix explicitly instead of `{function_name}.{operation}`, so keys stay
    /// the same when the function or operation is renamed. Two operations given one prefix
    /// share their keys: that is what it is for.
    ///
    /// # Panics
    ///
    /// If `prefix` is empty or contains `#`. A prefix built from message data must use
    /// [`try_key_prefix`](Self::try_key_prefix): its error is a permanent failure of that
    /// message, where a panic would be retried until the dead-letter queue.
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        self.key_prefix_unchecked(prefix.into()).or_panic()
    }

    /// Like [`key_prefix`](Self::key_prefix), returning [`Error::InvalidName`] instead of
    /// panicking: for a prefix built at run time (per tenant, say).
    pub fn try_key_prefix(self, prefix: impl Into<String>) -> Result<Self, Error> {
        let op = self.key_prefix_unchecked(prefix.into());
        op.check()?;
        Ok(op)
    }

    pub(crate) fn key_prefix_unchecked(mut self, prefix: String) -> Self {
        self.key_prefix = Some(prefix);
        self
    }

    /// Runs the operation at most once per key: a claim whose lease ended without an
    /// outcome (its worker crashed or timed out mid-run) is never taken over. The delivery
    /// that finds one fails for good with [`Error::ClaimAbandoned`], which says when the
    /// claim was made; an operator decides what happened and forgets the record to let
    /// the key run again. For effects where a second run is worse than none (a payment,
    /// an email). Off by default: a lapsed claim is taken over and the function runs again.
    ///
    /// A function that returns an error (or panics) still releases its claim, as it does
    /// without this: the next delivery runs it again. Return an error only when the
    /// effect did not happen. When it may have happened (a request sent whose answer never
    /// came, a `5xx` from a service that may have acted first), wrap the error in
    /// [`OutcomeUnknown`](crate::OutcomeUnknown): the claim is kept, and after its lease
    /// the next delivery is refused as abandoned instead of running again.
    ///
    /// The record must outlive the lease: a call under a handle whose
    /// [`expires_after`](crate::IdempotencyBuilder::expires_after) is no longer than
    /// the lease (this operation's, the handle's, or 15 minutes without either) fails
    /// with [`Error::InvalidName`] naming both, before any store request.
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Writes this operation's function commits with its record
    /// ([`execute_committing`](crate::Idempotency::execute_committing)) that are refused by
    /// their own condition release the claim, and the next delivery runs the function
    /// again: for conditions a later delivery can meet (a row another process is about to
    /// write). Off by default: a refusal is kept in the record as its answer
    /// ([`Error::WritesRefused`] with `retryable: false`), and later deliveries answer it
    /// without running the function, so a message whose writes can never be made costs
    /// one call on its way to the dead-letter queue, not one per delivery.
    pub fn refused_writes_retryable(mut self, retryable: bool) -> Self {
        self.refused_writes_retryable = retryable;
        self
    }

    /// Claims of this operation hold their key for `lease`, in place of the handle's
    /// [`lease`](crate::IdempotencyBuilder::lease) or the invocation's deadline; never
    /// past the deadline (nothing runs after it). Choose it longer than the function can
    /// take: a claim whose lease ended counts as crashed, is taken over (or, with
    /// [`at_most_once`](Self::at_most_once), refused as abandoned), and store requests
    /// for it stop shortly before it ends.
    ///
    /// # Panics
    ///
    /// If `lease` is shorter than a second or longer than 12 hours (see
    /// [`try_lease`](Self::try_lease)).
    pub fn lease(self, lease: Duration) -> Self {
        self.lease_unchecked(lease).or_panic()
    }

    /// Like [`lease`](Self::lease), returning [`Error::InvalidName`] (`what: "lease"`)
    /// instead of panicking.
    pub fn try_lease(self, lease: Duration) -> Result<Self, Error> {
        let op = self.lease_unchecked(lease);
        op.check()?;
        Ok(op)
    }

    pub(crate) fn lease_unchecked(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    fn or_panic(self) -> Self {
        if let Err(e) = self.check() {
            panic!("{e}");
        }
        self
    }

    /// Changes or annotates what a replay returns: `hook` gets the stored value and the
    /// record it came from ([`Replay`](crate::Replay)) and returns the answer, which then
    /// becomes the function's type. It runs on every replay (from the store, from a claim
    /// that finds the record completed, from the local cache), never when the function
    /// runs, nor for a twin joined in the same batch (its answer is its sibling's run).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
    /// use serde_json::{Value, json};
    ///
    /// let op = Operation::new("greet", KeyStrategy::field("id"))
    ///     .on_replay(|mut stored, replay| {
    ///         stored["replayed_from"] = json!(replay.id);
    ///         stored
    ///     });
    /// let idempotency = Idempotency::builder(MemoryStore::new()).function_name("fn").build();
    /// let payload = json!({"id": "42"});
    /// let run = || async { Ok::<_, lambda_idempotency::Error>(json!({"hello": "ada"})) };
    /// let first: Value = idempotency.run(&op, &payload, run).await.unwrap();
    /// let again: Value = idempotency.run(&op, &payload, run).await.unwrap();
    /// assert_eq!(first, json!({"hello": "ada"}));
    /// assert_eq!(again, json!({"hello": "ada", "replayed_from": "fn.greet#42"}));
    /// # }
    /// ```
    pub fn on_replay(
        mut self,
        hook: impl Fn(Value, &crate::Replay) -> Value + Send + Sync + 'static,
    ) -> Self {
        self.on_replay = Some(replay::ReplayHook(std::sync::Arc::new(hook)));
        self
    }

    /// Answers a direct call whose key is in progress in another call, instead of
    /// [`Error::AlreadyInProgress`]: `answer` gets the record in progress
    /// ([`InProgress`](crate::InProgress)) and returns the value the call returns, as the
    /// function's type, with [`Outcome::InProgressAnswered`]; `None` keeps the error. An
    /// answer that does not deserialize into the function's type is
    /// [`Error::InProgressAnswerIncompatible`].
    ///
    /// Direct calls are [`Idempotency::execute`](crate::Idempotency::execute) and
    /// [`run`](crate::Idempotency::run) and [`IdempotentLayer`](crate::IdempotentLayer).
    /// Never within a batch ([`SqsBatch`](crate::SqsBatch), the stream batches): a record
    /// in progress there is still handed back for redelivery, never acknowledged unrun.
    /// The HTTP `Idempotency-Key` layer keeps its `409`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, Outcome};
    /// use serde_json::json;
    ///
    /// let op = Operation::new("charge", KeyStrategy::field("id")).when_in_progress(|p| {
    ///     Some(json!({"status": "pending", "retry_after_s": p.retry_after.as_secs()}))
    /// });
    /// let idempotency = Idempotency::new(MemoryStore::new());
    /// let payload = json!({"id": "42"});
    /// let charge = || async { Ok::<_, std::io::Error>(json!({"status": "charged"})) };
    /// let first = idempotency.execute(&op, &payload, || async {
    ///     // Another call with the key while this one holds it: answered, not refused.
    ///     let (pending, outcome) = idempotency.execute(&op, &payload, charge).await.unwrap();
    ///     assert_eq!(outcome, Outcome::InProgressAnswered);
    ///     assert_eq!(pending["status"], "pending");
    ///     charge().await
    /// });
    /// let (charged, outcome) = first.await.unwrap();
    /// assert_eq!((charged["status"].as_str(), outcome), (Some("charged"), Outcome::Executed));
    /// # }
    /// ```
    pub fn when_in_progress(
        mut self,
        answer: impl Fn(&crate::InProgress) -> Option<Value> + Send + Sync + 'static,
    ) -> Self {
        self.when_in_progress = Some(in_progress::InProgressAnswer(std::sync::Arc::new(answer)));
        self
    }

    /// The operation's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stored id for `payload`: `{function_name}.{name}#{key}`, or `{key_prefix}#{key}`,
    /// after `#{tenant}#` for an invocation with a tenant (see [`PREFIX_END`]). The names
    /// were checked when the operation and the handle were built.
    pub(crate) fn stored_id(
        &self,
        function_name: &str,
        tenant: Option<&str>,
        payload: &Value,
    ) -> Result<String, Error> {
        let key = self.key.derive(payload)?;
        // Pushed rather than formatted: this runs for every message.
        let mut id = String::with_capacity(
            tenant.map_or(0, |t| t.len() + 2)
                + self
                    .key_prefix
                    .as_ref()
                    .map_or(function_name.len() + 1 + self.name.len(), String::len)
                + 1
                + key.len(),
        );
        if let Some(tenant) = tenant {
            id.push(TENANT_MARK);
            push_tenant(&mut id, tenant);
            id.push(TENANT_MARK);
        }
        match &self.key_prefix {
            Some(prefix) => id.push_str(prefix),
            None => {
                id.push_str(function_name);
                id.push(FUNCTION_END);
                id.push_str(&self.name);
            }
        }
        id.push(PREFIX_END);
        id.push_str(&key);
        Ok(id)
    }
}

/// Pushes `tenant` with `%` and `#` percent-encoded (`%25`, `%23`): one-to-one, and free
/// of the `#` that ends it. Lambda's tenant ids hold neither, so they read as they are.
fn push_tenant(id: &mut String, tenant: &str) {
    for c in tenant.chars() {
        match c {
            '%' => id.push_str("%25"),
            '#' => id.push_str("%23"),
            c => id.push(c),
        }
    }
}

/// Refuses a function name that holds a separator of the stored id (or is empty).
pub(crate) fn check_function_name(name: &str) -> Result<(), Error> {
    check_name("function name", name, &[FUNCTION_END, PREFIX_END])
}

/// The longest lease an operation may set: SQS's longest visibility timeout. A claim
/// held longer would outlive any redelivery's wait, and keep its record past the
/// expiry.
pub(crate) const MAX_OPERATION_LEASE: Duration = Duration::from_secs(12 * 60 * 60);

/// Refuses a lease shorter than [`MIN_LEASE`](crate::record::lease::MIN_LEASE), which the store's
/// millisecond clock and the completion's margin leave no time to run in, or longer than
/// [`MAX_OPERATION_LEASE`].
pub(crate) fn check_lease(lease: Duration) -> Result<(), Error> {
    if (crate::record::lease::MIN_LEASE..=MAX_OPERATION_LEASE).contains(&lease) {
        return Ok(());
    }
    Err(Error::InvalidName {
        what: "lease",
        name: format!("{lease:?}"),
        reason: "a lease runs from 1 second to 12 hours (SQS's longest visibility timeout); choose one longer than the function can take".into(),
    })
}

/// Refuses an empty name, or one holding a separator of the stored id, which would let two
/// different operations share ids.
fn check_name(what: &'static str, name: &str, forbidden: &[char]) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("it is empty; choose a name".into()));
    }
    match name.chars().find(|c| forbidden.contains(c)) {
        Some(c) => Err(invalid(format!(
            "it contains {c:?}, which separates the parts of a stored id; choose another name"
        ))),
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
            (Outcome::Joined, false),
            (Outcome::InProgressAnswered, false),
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
            op.stored_id("orders", None, &payload).unwrap(),
            "orders.charge#42"
        );
        assert_eq!(
            op.stored_id("orders", Some("t-1"), &payload).unwrap(),
            "#t-1#orders.charge#42"
        );
        let pinned = op.key_prefix("v1-charge");
        assert_eq!(
            pinned.stored_id("orders", None, &payload).unwrap(),
            "v1-charge#42"
        );
        assert_eq!(
            pinned.stored_id("orders", Some("a%b#c"), &payload).unwrap(),
            "#a%25b%23c#v1-charge#42"
        );
    }

    /// Tenants, prefixes and keys chosen to spell one another's ids: every (tenant,
    /// prefix, key) gives an id of its own.
    #[test]
    fn tenanted_ids_never_collide() {
        let tenants = [
            None,
            Some("a"),
            Some("b"),
            Some("a#b"),
            Some("a%23b"),
            Some("a%b"),
            Some("%"),
            Some("#"),
            Some("a#p"),
            Some("p"),
            Some("."),
        ];
        let prefixes = ["p", "a", "b", "a.p", "f.op", "%23", "%", "bp"];
        let keys = [
            "k", "#k", "a#p#k", "p#k", "b#p#k", "#a#p#k", "", "%23", "k#",
        ];
        let mut seen = std::collections::HashMap::new();
        for tenant in tenants {
            for prefix in prefixes {
                for key in keys {
                    let op = Operation::new("op", KeyStrategy::field("id")).key_prefix(prefix);
                    let payload = serde_json::json!({ "id": key });
                    let Ok(id) = op.stored_id("f", tenant, &payload) else {
                        continue; // an empty key is refused
                    };
                    if let Some(other) = seen.insert(id.clone(), (tenant, prefix, key)) {
                        panic!("{id:?} from {other:?} and {:?}", (tenant, prefix, key));
                    }
                }
            }
            let op = Operation::new("op", KeyStrategy::field("id"));
            let id = op
                .stored_id("f", tenant, &serde_json::json!({ "id": "k" }))
                .unwrap();
            assert_eq!(id.starts_with('#'), tenant.is_some(), "{id}");
            // `f.op` as a key prefix shares the function's ids, as untenanted; no more.
            assert!(seen.contains_key(&id), "{id}");
        }
    }

    #[test]
    fn bad_names_and_pointers_fail_when_the_operation_is_built() {
        let key = || KeyStrategy::field("id");
        let refused = |op: Result<Operation, Error>| match op {
            Err(Error::InvalidName { what, name, .. }) => (what, name),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(Operation::try_new("a#b", key())),
            ("operation name", "a#b".into())
        );
        assert_eq!(
            refused(Operation::try_new("", key())),
            ("operation name", "".into())
        );
        assert_eq!(
            refused(Operation::try_new(
                "op",
                KeyStrategy::pointer_unchecked("request_id".into())
            )),
            ("key pointer", "request_id".into())
        );
        let with = |f: fn(Operation) -> Operation| {
            std::panic::catch_unwind(move || f(Operation::new("op", KeyStrategy::field("id"))))
        };
        assert!(with(|op| op.key_prefix("v1#x")).is_err());
        assert!(with(|op| op.key_prefix("")).is_err());
        assert!(with(|op| op.validate(["/a~x"])).is_err());
        assert!(with(|op| op.validate(["a~x", "/a~1b"]).key_prefix("v1.x")).is_ok());
        assert!(
            std::panic::catch_unwind(|| Operation::new("a#b", KeyStrategy::field("id"))).is_err()
        );
        let op = || Operation::new("op", KeyStrategy::field("id"));
        assert!(matches!(
            op().try_key_prefix("t#1"),
            Err(Error::InvalidName {
                what: "key prefix",
                ..
            })
        ));
        assert!(matches!(
            op().try_validate(["/x~"]),
            Err(Error::InvalidName {
                what: "validation field",
                ..
            })
        ));
        assert!(op().try_key_prefix("tenant-1").is_ok() && op().try_validate(["/x"]).is_ok());
        assert!(check_function_name("fn.name").is_err());
        assert!(check_function_name("fn#name").is_err());
        assert!(check_function_name("").is_err());
        check_function_name("my-function_1").unwrap();
        let builder = || crate::Idempotency::builder(crate::MemoryStore::new());
        assert!(matches!(
            builder().function_name("my.fn").try_build(),
            Err(Error::InvalidName {
                what: "function name",
                ..
            })
        ));
        assert!(std::panic::catch_unwind(|| builder().function_name("a#b").build()).is_err());
        assert!(builder().function_name("my-fn").try_build().is_ok());
    }
}

/// An operation's outcome counters, built by its first call and shared by its clones.
/// Its `Debug` shows nothing: it changes after the first call.
#[derive(Clone, Default)]
pub(crate) struct OutcomeKeysCache(Arc<OnceLock<Arc<OutcomeKeys>>>);

impl std::fmt::Debug for OutcomeKeysCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

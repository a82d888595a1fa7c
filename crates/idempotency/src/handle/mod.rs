//! The handle users keep and its entry points: `run`, `execute`, `execute_until` and
//! `execute_committing`.

mod builder;
mod call;

pub use builder::IdempotencyBuilder;

use crate::clock::SystemClock;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::{Error, ExecuteError};
use crate::operation::{Operation, Outcome};
use crate::store::IdempotencyStore;
use crate::store::writes::{StoreWrites, WithWrites, Writes};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

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
        let tenant = crate::context::current_tenant();
        self.stored_id(op, tenant.as_deref(), payload)
    }

    /// [`idempotency_id`](Self::idempotency_id) within `tenant`.
    pub(crate) fn stored_id(
        &self,
        op: &Operation,
        tenant: Option<&str>,
        payload: &Value,
    ) -> Result<String, Error> {
        let id = op.stored_id(&self.engine.config.function_name, tenant, payload)?;
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
}

/// Committing the function's writes with its record: the handle's entry points.
impl Idempotency {
    /// Like [`execute`](Self::execute), for a function whose answer is persisted by writes
    /// of its own: `f` returns its result [`WithWrites`], and the store applies the writes
    /// and completes the record in one atomic step (a DynamoDB `TransactWriteItems`, one
    /// PostgreSQL transaction, one lock of the in-memory store), fenced by the claim's
    /// lease: a worker whose lease was taken over writes nothing
    /// ([`Error::LeaseLost`]). The answer and its record can never disagree. A replay
    /// returns the stored result and writes nothing.
    ///
    /// - writes whose own condition fails: [`Error::WritesRefused`], nothing written; the
    ///   refusal is kept as the record's answer, so later deliveries answer it without
    ///   running `f` ([`Operation::refused_writes_retryable`] releases the claim instead);
    /// - writes of a type the store cannot commit (another store's; Redis has none):
    ///   [`Error::WritesUnsupported`] before the claim, `f` not run. Check it at start-up
    ///   with [`check_writes`](Self::check_writes);
    /// - a commit whose outcome stays unknown (the store did not answer before the lease's
    ///   cutoff) is an error, never a success: the message comes again and finds the record
    ///   completed, or takes it over after its lease and runs again.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use lambda_idempotency::store::memory::MemoryWrites;
    /// use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, WithWrites};
    /// use serde_json::json;
    ///
    /// let store = MemoryStore::new();
    /// let idempotency = Idempotency::new(store.clone());
    /// idempotency.check_writes::<MemoryWrites>().unwrap();
    /// let op = Operation::new("answer", KeyStrategy::field("id"));
    /// let request = json!({"id": "r-1", "question": "2+2"});
    /// for _ in 0..2 {
    ///     let (answer, _) = idempotency
    ///         .execute_committing(&op, &request, || async {
    ///             let answer = "4".to_string();
    ///             let writes = MemoryWrites::new().put("answers", "r-1", json!({"answer": answer}));
    ///             Ok::<_, std::io::Error>(WithWrites::new(answer, writes))
    ///         })
    ///         .await
    ///         .unwrap();
    ///     assert_eq!(answer, "4");
    /// }
    /// assert_eq!(store.table("answers").len(), 1, "written once, with the record");
    /// # }
    /// ```
    pub async fn execute_committing<P, T, W, E, F, Fut>(
        &self,
        op: &Operation,
        payload: &P,
        f: F,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        P: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        W: StoreWrites,
        E: fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<WithWrites<T, W>, E>>,
    {
        // Before the claim: a store that cannot commit them would refuse them only after
        // the function ran, on every delivery.
        self.refuse_writes_for_another_store(W::STORE)
            .map_err(ExecuteError::Idempotency)?;
        let f = move || async move {
            f().await.map(|answer| {
                let writes = (!answer.writes.is_empty()).then(|| Writes::new(answer.writes));
                (answer.value, writes)
            })
        };
        self.execute_writing(op, payload, f).await
    }

    /// Refuses writes built for `store` (a [`StoreWrites::STORE`]) that this handle's store
    /// cannot commit, as [`check_writes`](Self::check_writes) does (a disabled handle
    /// commits none). Writes whose store is chosen at run time ([`Writes`]) are left to
    /// the commit.
    pub(crate) fn refuse_writes_for_another_store(&self, store: &'static str) -> Result<(), Error> {
        let engine = &self.engine;
        let refused_by = if store == Writes::STORE {
            return Ok(());
        } else if engine.config.disabled {
            "disabled idempotency"
        } else if engine.store.commits_writes(store) {
            return Ok(());
        } else {
            engine.store.name()
        };
        Err(Error::WritesUnsupported {
            store: refused_by,
            writes: store,
        })
    }

    /// [`execute_committing`](Self::execute_committing) with writes of any store's type.
    pub(crate) async fn execute_writing<P, T, E, F, Fut>(
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
        Fut: Future<Output = Result<(T, Option<Writes>), E>>,
    {
        let payload = to_json(payload).map_err(ExecuteError::Idempotency)?;
        self.execute_observed(op, &payload, None, true, f).await
    }

    /// Whether this handle's store commits writes of type `W` with a completion: call it
    /// at start-up, so a store that cannot (another store's writes, Redis) fails the init
    /// instead of every message.
    pub fn check_writes<W: StoreWrites>(&self) -> Result<(), Error> {
        let store = if self.engine.config.disabled {
            // Nothing would commit them: every call would pay, then fail.
            "disabled idempotency"
        } else if self.engine.store.commits_writes(W::STORE) {
            return Ok(());
        } else {
            self.engine.store.name()
        };
        Err(Error::WritesUnsupported {
            store,
            writes: W::STORE,
        })
    }
}

/// The payload as JSON, the form keys and validation hashes are read from.
pub(crate) fn to_json<P: Serialize + ?Sized>(payload: &P) -> Result<Value, Error> {
    serde_json::to_value(payload).map_err(|e| Error::InvalidKey {
        reason: "the payload does not serialize to JSON".into(),
        source: Some(Box::new(e)),
    })
}

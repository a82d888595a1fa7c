//! The function's own writes, committed in the same atomic step as its record's completion:
//! the answer persisted and the record completed can never disagree. Each store that can
//! do this has its own writes type ([`MemoryWrites`](crate::store::memory::MemoryWrites),
//! `PostgresWrites`, `DynamoDbWrites`); a store without one (Redis) has none to build, and a
//! store given another store's writes refuses them.

use crate::error::{Error, ExecuteError};
use crate::handle::{Idempotency, to_json};
use crate::operation::{Operation, Outcome};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// A store's writes type: what [`Idempotency::execute_committing`](crate::Idempotency::execute_committing)
/// accepts. Implemented by the writes type of each store that commits writes with a
/// completion.
pub trait StoreWrites: Send + Sync + 'static {
    /// The store that applies these writes ([`IdempotencyStore::name`](crate::store::IdempotencyStore::name)).
    const STORE: &'static str;

    /// Whether there is nothing to write (the completion alone is then a plain completion).
    fn is_empty(&self) -> bool;
}

/// A function's result, with the writes that commit in the same atomic step as its record.
/// The result is stored and replayed as any result; the writes are applied once, with the
/// completion, or not at all (the lease was lost: [`Error::LeaseLost`](crate::Error::LeaseLost)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WithWrites<T, W> {
    /// The function's result.
    pub value: T,
    /// The writes.
    pub writes: W,
}

impl<T, W> WithWrites<T, W> {
    /// `value`, committed with `writes`.
    pub fn new(value: T, writes: W) -> Self {
        Self { value, writes }
    }
}

/// Writes of some store's type, as a store receives them: it reads its own type with
/// [`downcast_ref`](Self::downcast_ref) and refuses any other. Cheap to clone (a store may
/// need them again to retry).
///
/// Also a [`StoreWrites`] itself, for code that picks its store at run time (a worker
/// configured by its environment): return `WithWrites<T, Writes>` and build each store's
/// writes with [`Writes::new`]. Check such a handle at start-up with the concrete type
/// (`check_writes::<PostgresWrites>()`).
#[derive(Clone)]
pub struct Writes {
    inner: Arc<dyn Any + Send + Sync>,
    store: &'static str,
    empty: bool,
}

impl Writes {
    /// `writes`, for the store named `W::STORE` (writes already erased stay as they are).
    pub fn new<W: StoreWrites>(writes: W) -> Self {
        let empty = writes.is_empty();
        let mut slot = Some(writes);
        if let Some(erased) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Writes>>() {
            return erased.take().unwrap_or_default();
        }
        Self {
            inner: Arc::new(slot.take()),
            store: W::STORE,
            empty,
        }
    }

    /// The writes, if they are of type `W`.
    pub fn downcast_ref<W: StoreWrites>(&self) -> Option<&W> {
        self.inner.downcast_ref::<Option<W>>()?.as_ref()
    }

    /// The writes, as the store of `W` reads them: of type `W`, or
    /// [`Error::WritesUnsupported`] naming both stores.
    pub fn of<W: StoreWrites>(&self) -> Result<&W, Error> {
        self.downcast_ref().ok_or(Error::WritesUnsupported {
            store: W::STORE,
            writes: self.store,
        })
    }

    /// The store these writes are for.
    pub fn store(&self) -> &'static str {
        self.store
    }
}

/// No writes.
impl Default for Writes {
    fn default() -> Self {
        Self {
            inner: Arc::new(()),
            store: "none",
            empty: true,
        }
    }
}

impl StoreWrites for Writes {
    const STORE: &'static str = "any store (chosen at run time)";

    fn is_empty(&self) -> bool {
        self.empty
    }
}

impl fmt::Debug for Writes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writes")
            .field("store", &self.store)
            .finish_non_exhaustive()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryWrites;

    #[test]
    fn writes_erased_twice_stay_the_store_s_own() {
        let writes = Writes::new(MemoryWrites::new().put("t", "k", serde_json::json!(1)));
        let again = Writes::new(writes);
        assert_eq!(again.store(), "memory");
        assert!(again.downcast_ref::<MemoryWrites>().is_some());
        assert!(!StoreWrites::is_empty(&again));
        assert!(StoreWrites::is_empty(&Writes::default()));
        assert!(StoreWrites::is_empty(&Writes::new(MemoryWrites::new())));
        assert_eq!(format!("{again:?}"), r#"Writes { store: "memory", .. }"#);
        assert!(again.of::<MemoryWrites>().is_ok());
        assert!(matches!(
            again.of::<Writes>(),
            Err(Error::WritesUnsupported {
                writes: "memory",
                ..
            })
        ));
    }
}

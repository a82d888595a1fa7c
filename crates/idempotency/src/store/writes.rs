//! The function's own writes, committed in the same atomic step as its record's completion:
//! the answer persisted and the record completed can never disagree. Each store that can
//! do this has its own writes type ([`MemoryWrites`](crate::store::memory::MemoryWrites),
//! `PostgresWrites`, `DynamoDbWrites`); a store without one (Redis) has none to build, and a
//! store given another store's writes refuses them.

use crate::error::Error;
use std::any::Any;
use std::fmt;
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

//! The in-memory store: the reference behaviour, and the embedded default for local runs
//! and for tests of user code.
//!
//! Records live in one process, behind one mutex, so every operation is atomic. To inject
//! faults or count requests, wrap it in a `FaultyStore` (`store::faulty`, feature `test-support`). Nothing
//! survives the process: use it for local runs and tests, not for a deployed function
//! (each Lambda execution environment would have its own).

use super::{
    BoxFuture, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, RecordPage, StoreWrites,
    Writes,
};
use crate::error::Error;
use crate::record::{Claim, Record, Status};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// An in-memory [`IdempotencyStore`]. Cloning shares the records.
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore};
/// let store = MemoryStore::new();
/// let idempotency = Idempotency::new(store.clone());
/// assert_eq!(store.len(), 0);
/// # let _ = idempotency;
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// In id order: a listing page reads a range, only what it returns.
    records: Mutex<BTreeMap<String, Record>>,
    /// The function's own tables ([`MemoryWrites`]). Locked after `records`, always.
    tables: Mutex<HashMap<String, BTreeMap<String, Value>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of records held (expired ones included, as a TTL store would).
    pub fn len(&self) -> usize {
        self.records().len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the record with this id.
    pub fn record(&self, id: &str) -> Option<Record> {
        self.records().get(id).cloned()
    }

    /// A copy of the table `name` that [`MemoryWrites`] wrote (empty if none).
    pub fn table(&self, name: &str) -> BTreeMap<String, Value> {
        let _records = self.records();
        self.tables().get(name).cloned().unwrap_or_default()
    }

    fn tables(&self) -> MutexGuard<'_, HashMap<String, BTreeMap<String, Value>>> {
        self.inner.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<String, Record>> {
        // A panic elsewhere cannot leave a half-written record: every update is one insert.
        self.inner.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim_now(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let mut records = self.records();
        match records.get(&claim.id) {
            Some(existing) if !existing.is_claimable_by(claim) => {
                Ok(ClaimOutcome::Exists(existing.clone()))
            }
            _ => {
                let previous = records.insert(claim.id.clone(), claim.to_record());
                Ok(ClaimOutcome::Claimed { previous })
            }
        }
    }

    fn complete_now(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let mut records = self.records();
        match records.get_mut(id) {
            Some(r) if r.lease_token.as_deref() == Some(token) => {
                r.status = Status::Completed;
                r.data = data.map(str::to_owned);
                r.expiration = expiration;
                Ok(())
            }
            _ => Err(Error::LeaseLost { key: id.to_owned() }),
        }
    }

    /// The completion and `writes` under one lock: all or nothing.
    fn complete_with_now(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &Writes,
    ) -> Result<(), Error> {
        let writes = writes.of::<MemoryWrites>()?;
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let mut records = self.records();
        let record = match records.get_mut(id) {
            Some(r) if r.lease_token.as_deref() == Some(token) => r,
            _ => return Err(Error::LeaseLost { key: id.to_owned() }),
        };
        if record.status == Status::Completed {
            // An earlier attempt was applied and its answer lost: written already.
            return Ok(());
        }
        let mut tables = self.tables();
        for (i, write) in writes.0.iter().enumerate() {
            let current = tables.get(write.table()).and_then(|t| t.get(write.key()));
            let holds = match write {
                MemoryWrite::PutNew { .. } => current.is_none(),
                MemoryWrite::Expect { value, .. } => current == value.as_ref(),
                MemoryWrite::Put { .. } | MemoryWrite::Delete { .. } => true,
            };
            if !holds {
                return Err(Error::WritesRefused {
                    key: id.to_owned(),
                    reason: format!(
                        "write {i} ({} {:?} in table {:?}): its condition does not hold",
                        write.verb(),
                        write.key(),
                        write.table()
                    ),
                    retryable: false,
                });
            }
        }
        for write in &writes.0 {
            let table = tables.entry(write.table().to_owned()).or_default();
            match write {
                MemoryWrite::Put { key, value, .. } | MemoryWrite::PutNew { key, value, .. } => {
                    table.insert(key.clone(), value.clone());
                }
                MemoryWrite::Delete { key, .. } => {
                    table.remove(key);
                }
                MemoryWrite::Expect { .. } => {}
            }
        }
        record.status = Status::Completed;
        record.data = data.map(str::to_owned);
        record.expiration = expiration;
        Ok(())
    }

    fn release_now(&self, claim: &Claim) -> Result<(), Error> {
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let mut records = self.records();
        match records.get(id) {
            Some(r) if r.lease_token.as_deref() == Some(token) => {
                records.remove(id);
                Ok(())
            }
            _ => Err(Error::LeaseLost { key: id.to_owned() }),
        }
    }

    fn forget_now(&self, read: &Record) -> Forgotten {
        let mut records = self.records();
        match records.get(&read.id) {
            None => Forgotten::Absent,
            Some(r) if !r.is_as_read(read) => Forgotten::Changed,
            Some(_) => {
                records.remove(&read.id);
                Forgotten::Deleted
            }
        }
    }

    /// In id order, after the cursor (the last id of the page before).
    fn list_now(&self, request: &ListRequest) -> RecordPage {
        use std::ops::Bound;
        let records = self.records();
        let prefix = request.prefix.as_str();
        // The ids under the prefix are one range of the sorted ids: from the prefix, or
        // after the cursor, for as long as they start with it.
        let start = match request.cursor.as_deref() {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let page: Vec<Record> = records
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(id, _)| id.starts_with(prefix))
            .take(request.limit)
            .map(|(_, record)| record.clone())
            .collect();
        // A full page may have more after it.
        let next = (page.len() >= request.limit)
            .then(|| page.last().map(|r| r.id.clone()))
            .flatten();
        RecordPage::new(page, next)
    }
}

impl IdempotencyStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn commits_writes(&self, writes: &'static str) -> bool {
        writes == <MemoryWrites as crate::store::StoreWrites>::STORE
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move { self.claim_now(claim) })
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.complete_now(claim, data, expiration) })
    }

    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.complete_with_now(claim, data, expiration, writes) })
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.release_now(claim) })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move { Ok(self.record(id)) })
    }

    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        Box::pin(async move { Ok(self.forget_now(record)) })
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        Box::pin(async move { Ok(self.list_now(request)) })
    }
}

/// Writes to the in-memory store's own tables ([`MemoryStore::table`]), committed with a
/// completion under the store's one lock: the in-memory form of a transaction, for tests
/// and local runs of code that persists its answer with
/// [`execute_committing`](crate::Idempotency::execute_committing). A condition that does
/// not hold refuses them all ([`Error::WritesRefused`]).
#[derive(Debug, Clone, Default)]
pub struct MemoryWrites(Vec<MemoryWrite>);

#[derive(Debug, Clone)]
enum MemoryWrite {
    Put {
        table: String,
        key: String,
        value: Value,
    },
    PutNew {
        table: String,
        key: String,
        value: Value,
    },
    Delete {
        table: String,
        key: String,
    },
    Expect {
        table: String,
        key: String,
        value: Option<Value>,
    },
}

impl MemoryWrite {
    fn table(&self) -> &str {
        match self {
            MemoryWrite::Put { table, .. }
            | MemoryWrite::PutNew { table, .. }
            | MemoryWrite::Delete { table, .. }
            | MemoryWrite::Expect { table, .. } => table,
        }
    }

    fn key(&self) -> &str {
        match self {
            MemoryWrite::Put { key, .. }
            | MemoryWrite::PutNew { key, .. }
            | MemoryWrite::Delete { key, .. }
            | MemoryWrite::Expect { key, .. } => key,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            MemoryWrite::Put { .. } => "put",
            MemoryWrite::PutNew { .. } => "put_new",
            MemoryWrite::Delete { .. } => "delete",
            MemoryWrite::Expect { .. } => "expect",
        }
    }
}

impl MemoryWrites {
    /// No writes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` of `table` to `value`.
    pub fn put(mut self, table: &str, key: &str, value: Value) -> Self {
        self.0.push(MemoryWrite::Put {
            table: table.into(),
            key: key.into(),
            value,
        });
        self
    }

    /// Sets `key` of `table` to `value`, on condition that it has none.
    pub fn put_new(mut self, table: &str, key: &str, value: Value) -> Self {
        self.0.push(MemoryWrite::PutNew {
            table: table.into(),
            key: key.into(),
            value,
        });
        self
    }

    /// Removes `key` from `table`.
    pub fn delete(mut self, table: &str, key: &str) -> Self {
        self.0.push(MemoryWrite::Delete {
            table: table.into(),
            key: key.into(),
        });
        self
    }

    /// Writes nothing, on condition that `key` of `table` holds `value` (`None`: nothing).
    pub fn expect(mut self, table: &str, key: &str, value: Option<Value>) -> Self {
        self.0.push(MemoryWrite::Expect {
            table: table.into(),
            key: key.into(),
            value,
        });
        self
    }
}

impl StoreWrites for MemoryWrites {
    const STORE: &'static str = "memory";

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

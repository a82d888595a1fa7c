//! The in-memory store: the reference behaviour, and the embedded default for local runs
//! and for tests of user code.
//!
//! Records live in one process, behind one mutex, so every operation is atomic. To inject
//! faults or count requests, wrap it in a `FaultyStore` (`store::faulty`, feature `test-support`). Nothing
//! survives the process: use it for local runs and tests, not for a deployed function
//! (each Lambda execution environment would have its own).

use super::{BoxFuture, ClaimOutcome, IdempotencyStore};
use crate::error::Error;
use crate::record::{Claim, Record, Status};
use std::collections::HashMap;
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
    records: Mutex<HashMap<String, Record>>,
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

    fn records(&self) -> MutexGuard<'_, HashMap<String, Record>> {
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
}

impl IdempotencyStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
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

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.release_now(claim) })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move { Ok(self.record(id)) })
    }
}

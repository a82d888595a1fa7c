//! Where idempotency records live: one small trait, several backends.
//!
//! A store does four things, each in one request where the backend allows:
//! [`claim`](IdempotencyStore::claim) is the atomic conditional write taken before the
//! work, [`complete`](IdempotencyStore::complete) and [`release`](IdempotencyStore::release)
//! end a claim and are fenced by its lease token, [`get`](IdempotencyStore::get) reads.
//! Two more serve operators, not the engine: [`forget`](IdempotencyStore::forget) deletes
//! a record if it is still as it was read, and [`list`](IdempotencyStore::list) pages
//! through the records whose ids start with a prefix.
//! The engine ([`Idempotency`](crate::Idempotency)) holds all policy; a store only
//! evaluates conditions atomically.

use crate::error::Error;
pub(crate) mod writes;

pub use writes::{StoreWrites, Writes};

pub use crate::record::{
    Claim, Record, Status, UnknownStatus, Utc, epoch_millis, epoch_secs, from_epoch_millis,
    from_epoch_secs,
};
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

pub(crate) mod attempt_bound;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
#[cfg(feature = "test-support")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-support")))]
pub mod faulty;
pub mod memory;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

/// One of the store's operations, for fault injection and counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// [`IdempotencyStore::claim`].
    Claim,
    /// [`IdempotencyStore::complete`].
    Complete,
    /// [`IdempotencyStore::release`].
    Release,
    /// [`IdempotencyStore::get`].
    Get,
    /// [`IdempotencyStore::forget`].
    Forget,
    /// [`IdempotencyStore::list`].
    List,
}

impl StoreOp {
    /// All of them, in a fixed order.
    pub const ALL: [StoreOp; 6] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Get,
        StoreOp::Forget,
        StoreOp::List,
    ];

    /// The position in [`ALL`](Self::ALL), for per-operation counters.
    pub const fn index(self) -> usize {
        match self {
            StoreOp::Claim => 0,
            StoreOp::Complete => 1,
            StoreOp::Release => 2,
            StoreOp::Get => 3,
            StoreOp::Forget => 4,
            StoreOp::List => 5,
        }
    }
}

/// A boxed future, so stores can be used as `dyn IdempotencyStore`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The claim was written. `previous` is the record it replaced (expired, or in
    /// progress with a passed lease), if the backend returns it.
    Claimed {
        /// The replaced record.
        previous: Option<Record>,
    },
    /// A live record holds the key; the claim was not written.
    Exists(Record),
    /// The claim was refused but the record was gone when read: the caller retries.
    Vanished,
}

/// What [`IdempotencyStore::forget`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgotten {
    /// The record was still as read, and is deleted.
    Deleted,
    /// The record changed since it was read (claimed again, completed, taken over):
    /// nothing was deleted. Read it again before deciding.
    Changed,
    /// No record has the id: it expired and was deleted, was forgotten already, or an
    /// earlier attempt of this same request deleted it and its answer was lost.
    Absent,
}

/// Which records [`IdempotencyStore::list`] reads: those whose id starts with `prefix`,
/// from `cursor` on, about `limit` items at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListRequest {
    /// What every listed id starts with (`""`: every record).
    pub prefix: String,
    /// Where to go on from: a previous page's [`RecordPage::next`]; `None` starts.
    pub cursor: Option<String>,
    /// How many items a page holds at most, about: what one request reads on DynamoDB
    /// and PostgreSQL; on Redis the first `SCAN` step's `COUNT`, later ones scaled by how
    /// many keys matched (a page may hold fewer matches, even none, with more to come).
    pub limit: usize,
}

impl ListRequest {
    /// The first page of the records whose id starts with `prefix`, `limit` at a time
    /// (at least 1).
    pub fn new(prefix: impl Into<String>, limit: usize) -> Self {
        Self {
            prefix: prefix.into(),
            cursor: None,
            limit: limit.max(1),
        }
    }

    /// The page after the one that returned `cursor`.
    pub fn after(mut self, cursor: Option<String>) -> Self {
        self.cursor = cursor;
        self
    }
}

/// One page of [`IdempotencyStore::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordPage {
    /// The records read, in the store's order. A record may appear on two pages (Redis's
    /// `SCAN` may return a key twice); one present for the whole listing appears at least
    /// once.
    pub records: Vec<Record>,
    /// Items under the prefix that are not readable records (another application's data,
    /// or a malformed record), each with why.
    pub unreadable: Vec<(String, String)>,
    /// Where the next page starts; `None` when the listing is done.
    pub next: Option<String>,
    /// About how many items the store looked at for this page, matching or not: a
    /// DynamoDB `Scan`'s `ScannedCount`, a Redis `SCAN`'s `COUNT`, the rows SQL read. What
    /// bounds a listing's cost where a prefix matches few of the store's items (its pages
    /// may come back empty).
    pub examined: usize,
}

impl RecordPage {
    /// A page of `records`, with `next` where the following one starts.
    pub fn new(records: Vec<Record>, next: Option<String>) -> Self {
        Self {
            examined: records.len(),
            records,
            unreadable: Vec::new(),
            next,
        }
    }
}

/// Size limits the engine checks before writing, so an oversized write fails clearly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLimits {
    /// Largest stored id in bytes (DynamoDB's partition key limit is 2048).
    pub max_id_bytes: usize,
    /// Largest record in bytes, ids, attribute names and result included
    /// (DynamoDB's item limit is 400 KB).
    pub max_record_bytes: usize,
    /// Bytes a record takes besides its id, result, validation hash and lease token:
    /// attribute names, status, numbers. Generous, so the size check errs on the safe side.
    pub record_overhead_bytes: usize,
}

impl StoreLimits {
    /// Limits of `max_id_bytes` per id and `max_record_bytes` per record, with DynamoDB's
    /// estimate of the bytes a record takes besides its contents.
    pub const fn new(max_id_bytes: usize, max_record_bytes: usize) -> Self {
        Self {
            max_id_bytes,
            max_record_bytes,
            record_overhead_bytes: Self::DYNAMODB.record_overhead_bytes,
        }
    }

    /// The same limits with another per-record overhead.
    pub const fn record_overhead_bytes(mut self, bytes: usize) -> Self {
        self.record_overhead_bytes = bytes;
        self
    }

    /// DynamoDB's limits, which the in-memory store mirrors so local tests fail alike.
    pub const DYNAMODB: StoreLimits = StoreLimits {
        max_id_bytes: 2048,
        max_record_bytes: 400 * 1024,
        record_overhead_bytes: 256,
    };
}

/// A backend for idempotency records.
///
/// # Contract
/// - `claim` writes `claim.to_record()` in one atomic conditional operation that succeeds
///   only when [`Record::is_claimable_by`] holds for the stored record, evaluated by the
///   store: no record has the id; or it is in progress and its lease ended before
///   `claim.now` (by milliseconds); or it has expired (`expiration` before `claim.now`, by
///   whole seconds) and is not in progress with a live lease; or it is in progress with
///   the claim's own lease token (an earlier attempt of this same claim was applied but
///   its answer was lost). Never read-then-write. An
///   [at-most-once](Claim::at_most_once) claim never takes over an in-progress record
///   whose lease ended but which has not expired ([`Record::is_abandoned_at`]): it gets
///   that record back in [`ClaimOutcome::Exists`]. `is_claimable_by` says all of this;
///   a store that evaluates its own condition must honour the flag too.
/// - `complete` sets status `COMPLETED`, the result and a new expiration, and `release`
///   deletes the record, each only if the stored lease token equals `lease_token`;
///   otherwise they fail with [`Error::LeaseLost`] and change nothing (a missing record
///   is not created). Both may be repeated: a repeated completion succeeds again.
/// - `forget` deletes the record only if it is still as read
///   ([`Record::is_as_read`]: same status, expiration in seconds, lease end in
///   milliseconds and lease token), in one conditional request; `list` reads a bounded
///   page. Both serve operators: a store may refuse them ([`Error::Unsupported`], the
///   default).
/// - Backend failures are [`Error::Store`], with `retryable` set for throttling, 5xx
///   answers and timeouts. The engine owns retries and timeouts; a store should not
///   retry on its own, beyond what its protocol needs to deliver one request (the Redis
///   Cluster client follows a `MOVED` or `ASK` redirect).
///
/// [`conformance`] (feature `conformance`) checks all of this.
pub trait IdempotencyStore: Send + Sync + Debug {
    /// The backend's name, for errors, logs and the `store` label of the metrics: one
    /// name for the store's life (a handle builds its metric keys with it once).
    fn name(&self) -> &'static str;

    /// The size limits the engine enforces before writing.
    fn limits(&self) -> StoreLimits {
        StoreLimits::DYNAMODB
    }

    /// Atomically claims `claim.id` (see the contract above).
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// Marks `claim`'s record completed with `data` (the result as JSON; `None` when it
    /// was too large to store) and a new `expiration`, if it still holds the claim's token.
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Whether [`complete_with`](Self::complete_with) commits writes built for the store
    /// named `writes` ([`StoreWrites::STORE`]): what
    /// [`Idempotency::check_writes`](crate::Idempotency::check_writes) asks at start-up. A
    /// wrapper forwards it with `complete_with`. The default: none.
    fn commits_writes(&self, writes: &'static str) -> bool {
        let _ = writes;
        false
    }

    /// [`complete`](Self::complete), with `writes` (the function's own) applied in the
    /// same atomic step: all of them and the completion, or nothing. Fenced by the claim's
    /// token as `complete` is (nothing is written when it no longer holds:
    /// [`Error::LeaseLost`]). A write whose own condition fails is
    /// [`Error::WritesRefused`], and nothing is written. May be repeated after a lost
    /// answer: a record already completed with the claim's token is success, and the
    /// writes are not applied again. A store without writes of its own (the default)
    /// refuses them all ([`Error::WritesUnsupported`]): it never writes them apart from its
    /// record.
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (claim, data, expiration);
        Box::pin(async move {
            Err(Error::WritesUnsupported {
                store: self.name(),
                writes: writes.store(),
            })
        })
    }

    /// Deletes `claim`'s record, if it still holds the claim's token, so the next delivery
    /// can run the function again.
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>>;

    /// Reads a record (strongly consistent where the backend offers it).
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>>;

    /// Deletes `record.id`'s record if it is still `record` as read
    /// ([`Record::is_as_read`]), in one conditional request: a claim or completion made
    /// since is never deleted by mistake. For operators (a stuck claim, a bad stored
    /// result); the default refuses ([`Error::Unsupported`]).
    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        let _ = record;
        Box::pin(async move { Err(self.unsupported("forget")) })
    }

    /// One page of the records whose id starts with `request.prefix`: one bounded
    /// request (a DynamoDB `Scan` or `Query` with a limit, a Redis `SCAN`, SQL with a
    /// limit). For operators; the default refuses ([`Error::Unsupported`]).
    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        let _ = request;
        Box::pin(async move { Err(self.unsupported("list")) })
    }

    /// [`Error::Unsupported`] for `request` on this store.
    #[doc(hidden)]
    fn unsupported(&self, request: &'static str) -> Error {
        Error::Unsupported {
            store: self.name(),
            request,
        }
    }
}

impl<S: IdempotencyStore + ?Sized> IdempotencyStore for std::sync::Arc<S> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn limits(&self) -> StoreLimits {
        (**self).limits()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        (**self).claim(claim)
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).complete(claim, data, expiration)
    }
    fn commits_writes(&self, writes: &'static str) -> bool {
        (**self).commits_writes(writes)
    }
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).complete_with(claim, data, expiration, writes)
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        (**self).release(claim)
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        (**self).get(id)
    }
    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        (**self).forget(record)
    }
    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        (**self).list(request)
    }
}

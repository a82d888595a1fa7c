//! The Redis store: Redis 6.2+, Valkey, ElastiCache and MemoryDB, on one node or a cluster.
//!
//! # Records
//! One record is one hash at `namespace + id`, with the fields `status`, `expiration`
//! (epoch seconds), `in_progress_expiration` (epoch milliseconds), `data`, `validation`
//! and `lease_token`. The key's own expiry (`PEXPIREAT`) is set past the record's
//! `expiration` and past its lease, plus [`KEY_GRACE`], so Redis deletes what no longer
//! counts, as DynamoDB's TTL does. Expiry is still decided by the stored numbers against
//! the caller's clock, never by the key being gone.
//!
//! # Protocol
//! Each operation is one Lua script on one key (cluster-safe without hash tags), sent as
//! `EVALSHA`; a server that answers `NOSCRIPT` (restarted, failed over, or never saw the
//! script) gets the script itself through `EVAL` on the same key, once.
//! 1. **Claim** reads the hash and, if the record is claimable by the claim
//!    ([`Record::is_claimable_by`]: free, lease ended, expired without a live lease, or
//!    its own in-progress record), replaces it; either way it returns the old record in
//!    the same round trip. The caller's `now` is an argument: the server's clock plays no
//!    part.
//! 2. **Complete** sets `COMPLETED`, the result and the new expiry if the lease token
//!    still matches; **release** deletes the key if it does.
//!
//! A first delivery costs two round trips (claim, complete), a duplicate (completed or in
//! progress) one, a takeover two, like a first delivery: its claim returns the record it
//! replaced in the same script, with no read before it.
//!
//! # Server settings
//! - **No eviction.** An evicted key is a forgotten record: its duplicate runs again. Set
//!   `maxmemory-policy noeviction` (ElastiCache's default, `volatile-lru`, evicts keys that
//!   have an expiry, which is every record here) and watch memory.
//! - **A full server.** Under `noeviction`, a server whose memory is past `maxmemory`
//!   answers `OOM` to a script whose first write adds data (Redis 7, measured by the test
//!   `a_full_redis_refuses_writes_retryably_and_keeps_records_whole`): a claim of a free
//!   key is refused before the call (nothing written; the message goes back to the queue
//!   and, after `maxReceiveCount` deliveries, to the dead-letter queue), and so is a
//!   **completion**: the call has run and been paid for, and its result cannot be stored.
//!   `OOM` is retryable, so the engine retries the completion until the lease's cut-off
//!   (memory frees as records expire); if it stays full, the function's value is still
//!   returned (`Outcome::ExecutedUnstored`, logged `RESULT LOST`), the record stays in
//!   progress until its lease ends, and a later delivery runs the function again. Reads
//!   work, a release (a `DEL`) works, and a claim over a claimable record (the script
//!   deletes it first) is written. Alert on `used_memory` well before `maxmemory`.
//! - **Failover.** Replication is asynchronous: a claim or completion acknowledged by a
//!   primary that fails before its replica copied it is lost, and a duplicate delivered
//!   after the failover runs again. Where one extra run after a failover is not
//!   acceptable, use MemoryDB (a durable multi-AZ log) or another store.
//! - **Persistence.** A restart without AOF/RDB forgets every record, with the same effect.
//!
//! # Connections
//! [`RedisStore::connect`] keeps one multiplexed connection per execution environment
//! and **rebuilds it on the next call** after any request on it failed in a way that may
//! have broken it (an I/O error, a dropped or refused connection, a timeout, `READONLY`
//! or `MASTERDOWN` from a node demoted by a failover) or was cut off by the engine's
//! attempt timeout. A connection that went half-open during a Lambda freeze (a NAT's idle
//! timeout) therefore costs one attempt, not every attempt until the kernel gives up.
//! A cluster connection is kept whole: the cluster client reconnects to each node and
//! follows failovers and redirects itself (rebuilding it because one node stopped
//! answering would take the healthy shards down too). Connects are bounded at 1 s, and
//! each request at [`DEFAULT_REQUEST_TIMEOUT`] (5 s,
//! [`request_timeout`](RedisStore::request_timeout)), so a call outside the
//! engine (a health check) never hangs; inside it, the engine's attempt timeout
//! (`IdempotencyBuilder::store_attempt_timeout`, 2 s by default) is the bound that counts,
//! and the store sets no timer of its own when that bound is the shorter.
//! `rediss://` URLs use TLS (ElastiCache in-transit encryption, through rustls and the
//! system's root certificates); `redis://user:password@host` authenticates with ACL
//! credentials (ElastiCache RBAC), `redis://:password@host` with a password alone.
//!
//! ```no_run
//! # async fn f() -> Result<(), lambda_idempotency::Error> {
//! use lambda_idempotency::Idempotency;
//! use lambda_idempotency::store::redis::RedisStore;
//!
//! let store = RedisStore::connect("rediss://worker:secret@my-cache.example.com:6379").await?;
//! let idempotency = Idempotency::new(store.namespace("idempotency:"));
//! # let _ = idempotency;
//! # Ok(()) }
//! ```

mod connection;
mod error;
mod list;
mod reply;
mod scripts;

use super::{
    BoxFuture, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, RecordPage, StoreLimits,
};
use crate::error::Error;
use crate::record::{Claim, Record};
use connection::{Inner, Target};
use error::store_error;
use redis::{Cmd, Value};
use reply::{fields, parse};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const BACKEND: &str = "redis";

/// The longest a request may wait for its reply by default, so a call made outside the
/// engine (a health check, a `get`) never waits forever on a server that stopped
/// answering. Above the engine's attempt timeout (2 s by default), which is the bound that
/// normally counts.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How much longer a key lives than its record counts: a server clock up to this far
/// ahead of the workers' never deletes a record that still counts for them.
pub const KEY_GRACE: Duration = Duration::from_secs(60);

/// An [`IdempotencyStore`] in Redis (see the [module docs](self)). Cloning shares the
/// connection.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    namespace: String,
    request_timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.inner.target {
            Target::Node(_) => "node",
            Target::Cluster(_) => "cluster",
        };
        struct Redacted;
        impl fmt::Debug for Redacted {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("<redacted>")
            }
        }
        let mut d = f.debug_struct("RedisStore");
        d.field("target", &target)
            .field("servers", &self.inner.servers);
        // Only whether there is one.
        if self.inner.password {
            d.field("password", &Redacted);
        }
        d.field("namespace", &self.namespace)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Bounds every request's wait for its reply ([`DEFAULT_REQUEST_TIMEOUT`] unless set).
    /// Keep it above the engine's attempt timeout, which is the bound that should count.
    ///
    /// # Panics
    ///
    /// If `timeout` is zero: every request would fail. Set it at start-up.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "RedisStore::request_timeout must be more than zero: every request would time out"
        );
        self.request_timeout = timeout;
        self
    }

    /// Prepends `namespace` to every record's key, to share a server with other data (or
    /// other tests). Default: none, so the key is the record's id, as in Powertools.
    /// Unrelated to an operation's `key_prefix`, which is part of the stored id itself.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// What every record's key starts with.
    pub fn namespace_of_keys(&self) -> &str {
        &self.namespace
    }

    /// The Redis key of the record `id`. A test hook.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn key(&self, id: &str) -> String {
        self.redis_key(id)
    }

    /// The Redis key of the record `id`.
    pub(crate) fn redis_key(&self, id: &str) -> String {
        let mut key = String::with_capacity(self.namespace.len() + id.len());
        key.push_str(&self.namespace);
        key.push_str(id);
        key
    }

    /// Sends one command on the store's connection (its own node's, for a single node;
    /// routed by its key, for a cluster), bounded by the request timeout. For health
    /// checks and diagnostics.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, Error> {
        self.send(cmd).await?.map_err(store_error)
    }

    async fn read_record(&self, id: &str) -> Result<Option<Record>, Error> {
        let reply = self
            .query(redis::cmd("HGETALL").arg(self.redis_key(id)))
            .await?;
        let fields = fields(id, reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        parse(id, fields).map(Some)
    }
}

impl IdempotencyStore for RedisStore {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn limits(&self) -> StoreLimits {
        // Redis takes values up to 512 MB; the DynamoDB limits keep records portable
        // and a function's replies small.
        StoreLimits::DYNAMODB
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.send_claim(claim))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_completion(claim, data, expiration))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_release(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read_record(id))
    }

    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        Box::pin(self.send_forget(record))
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        Box::pin(self.send_list(request))
    }
}

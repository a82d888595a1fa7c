//! The Redis store: Redis 6.2+, Valkey, ElastiCache and MemoryDB, on one node or a cluster.
//!
//! # Records
//! One record is one hash at `key_prefix + id`, with the fields `status`, `expiration`
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
//! A first delivery costs two round trips, a duplicate (completed or in progress) one, a
//! takeover one.
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
//! [`with_request_timeout`](RedisStore::with_request_timeout)), so a call outside the
//! engine (a health check) never hangs; inside it, the engine's attempt timeout
//! (`IdempotencyBuilder::store_attempt_timeout`, 2 s by default) is the bound that counts.
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
//! let idempotency = Idempotency::new(store.with_key_prefix("idempotency:"));
//! # let _ = idempotency;
//! # Ok(()) }
//! ```

use super::{BoxFuture, ClaimOutcome, IdempotencyStore, StoreLimits};
use crate::error::Error;
use crate::record::{
    Claim, Record, Status, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs,
};
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

const BACKEND: &str = "redis";

/// How long a connect may take, for one node and for each node of a cluster.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a request may wait for its reply by default, so a call made outside the
/// engine (a health check, a `get`) never waits forever on a server that stopped
/// answering. Above the engine's attempt timeout (2 s by default), which is the bound that
/// normally counts.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How much longer a key lives than its record counts: a server clock up to this far
/// ahead of the workers' never deletes a record that still counts for them.
pub const KEY_GRACE: Duration = Duration::from_secs(60);

/// `KEYS[1]`: the record. `ARGV`: now (ms), now (s), expiration (s), lease end (ms),
/// lease token, `"1"` if a validation hash follows, the hash, the key's expiry (ms).
/// Returns `{1, old}` when written, `{0, old}` when refused; `old` is the old hash, flat.
const CLAIM_LUA: &str = r#"
local old = redis.call('HGETALL', KEYS[1])
if #old > 0 then
  local r = {}
  for i = 1, #old, 2 do r[old[i]] = old[i + 1] end
  local lease = tonumber(r['in_progress_expiration'])
  local claimable
  if r['status'] == 'INPROGRESS' and r['lease_token'] == ARGV[5] then
    claimable = true
  elseif r['status'] == 'INPROGRESS' and lease then
    claimable = lease < tonumber(ARGV[1])
  else
    local expiration = tonumber(r['expiration'])
    claimable = expiration ~= nil and expiration < tonumber(ARGV[2])
  end
  if not claimable then return {0, old} end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'status', 'INPROGRESS', 'expiration', ARGV[3],
  'in_progress_expiration', ARGV[4], 'lease_token', ARGV[5])
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'validation', ARGV[7]) end
redis.call('PEXPIREAT', KEYS[1], ARGV[8])
return {1, old}
"#;

/// `KEYS[1]`: the record. `ARGV`: lease token, expiration (s), the key's expiry (ms),
/// `"1"` if a result follows, the result. Returns 1 when completed, 0 when the token
/// differs or the record is gone (nothing is created).
const COMPLETE_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'expiration', ARGV[2])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'data', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'data')
end
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return 1
"#;

/// `KEYS[1]`: the record. `ARGV[1]`: lease token. Returns 1 when deleted, 0 otherwise.
const RELEASE_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// A script's body and its SHA-1, computed once.
struct Lua {
    body: &'static str,
    script: LazyLock<Script>,
}

impl Lua {
    const fn new(body: &'static str, script: fn() -> Script) -> Self {
        Self {
            body,
            script: LazyLock::new(script),
        }
    }
}

static CLAIM: Lua = Lua::new(CLAIM_LUA, || Script::new(CLAIM_LUA));
static COMPLETE: Lua = Lua::new(COMPLETE_LUA, || Script::new(COMPLETE_LUA));
static RELEASE: Lua = Lua::new(RELEASE_LUA, || Script::new(RELEASE_LUA));

/// Where connections come from. One per store, behind its `Arc`: the size of the
/// variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Target {
    Node(redis::Client),
    Cluster(ClusterClient),
}

/// A live connection; cloning shares it.
#[derive(Clone)]
enum Connection {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

struct Inner {
    target: Target,
    /// Where it connects, for errors and `Debug`: `host:port`, or a cluster's nodes.
    servers: Option<String>,
    /// Whether the URL holds a password (`Debug` says so, never shows it).
    password: bool,
    /// The connection and its generation, if one is open. A plain mutex: held only to
    /// copy or swap the value.
    current: Mutex<Option<(u64, Connection)>>,
    /// Serialises connects, so concurrent calls share one new connection.
    connecting: tokio::sync::Mutex<u64>,
}

/// An [`IdempotencyStore`] in Redis (see the [module docs](self)). Cloning shares the
/// connection.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    key_prefix: String,
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
        d.field("key_prefix", &self.key_prefix)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// Marks the connection broken if the request is dropped before its answer: the engine
/// cut it off, and a connection that does not answer is not used again.
struct InFlight<'a> {
    store: &'a RedisStore,
    generation: u64,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.store.forget(self.generation);
        }
    }
}

impl RedisStore {
    /// Connects to one Redis node (`redis://`, or `rediss://` for TLS). Fails if the
    /// first connection cannot be made, so a wrong URL or password fails at start-up.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        install_crypto_provider();
        let client = redis::Client::open(url).map_err(store_error)?;
        Self::from_client(client).await
    }

    /// Connects to a Redis Cluster through any of its nodes (their URLs; `rediss://` for
    /// TLS, credentials in the URL). Requests follow `MOVED`/`ASK` redirects.
    pub async fn connect_cluster<I, U>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = U>,
        U: redis::IntoConnectionInfo,
    {
        install_crypto_provider();
        let nodes = nodes
            .into_iter()
            .map(|node| node.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(store_error)?;
        let servers = nodes
            .iter()
            .map(|node| node.addr().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let password = nodes
            .iter()
            .any(|n| n.redis_settings().password().is_some());
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            // Enough for a redirect and a reconnect; the engine retries the rest within
            // the lease, knowing the deadline.
            .retries(2)
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(DEFAULT_REQUEST_TIMEOUT)
            .build()
            .map_err(store_error)?;
        Self::open(Target::Cluster(client), Some(servers), password).await
    }

    /// A store on one node through a client you built (TLS certificates of your own,
    /// say), connected now.
    pub async fn from_client(client: redis::Client) -> Result<Self, Error> {
        let info = client.get_connection_info();
        let servers = info.addr().to_string();
        let password = info.redis_settings().password().is_some();
        Self::open(Target::Node(client), Some(servers), password).await
    }

    /// A store on a cluster through a client you built, connected now. Give it few
    /// retries: the engine retries within the lease.
    pub async fn from_cluster_client(client: ClusterClient) -> Result<Self, Error> {
        Self::open(Target::Cluster(client), None, false).await
    }

    async fn open(target: Target, servers: Option<String>, password: bool) -> Result<Self, Error> {
        let store = Self {
            inner: Arc::new(Inner {
                target,
                servers,
                password,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(0),
            }),
            key_prefix: String::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        };
        store.connection().await?;
        Ok(store)
    }

    /// Bounds every request's wait for its reply ([`DEFAULT_REQUEST_TIMEOUT`] unless set).
    /// Keep it above the engine's attempt timeout, which is the bound that should count.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Prepends `prefix` to every record's key, to share a server with other data (or
    /// other tests). Default: none, so the key is the record's id, as in Powertools.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The prefix of every record's key.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The Redis key of the record `id`.
    pub fn key(&self, id: &str) -> String {
        format!("{}{id}", self.key_prefix)
    }

    /// Sends one command on the store's connection (its own node's, for a single node;
    /// routed by its key, for a cluster), bounded by the request timeout. For health
    /// checks and diagnostics.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, Error> {
        self.send(cmd).await?.map_err(store_error)
    }

    /// Sends `cmd`: the outer error is a failed connect (already an [`Error`] naming the
    /// server), the inner one the request's.
    async fn send(&self, cmd: &Cmd) -> Result<Result<Value, RedisError>, Error> {
        let (generation, connection) = self.connection().await?;
        let mut in_flight = InFlight {
            store: self,
            generation,
            answered: false,
        };
        let request = async {
            match connection {
                Connection::Node(mut c) => cmd.query_async(&mut c).await,
                Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
            }
        };
        let result = match tokio::time::timeout(self.request_timeout, request).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no reply within {:?}", self.request_timeout),
            )
            .into()),
        };
        in_flight.answered = true;
        if let Err(e) = &result
            && breaks_connection(e)
        {
            self.forget(generation);
        }
        Ok(result)
    }

    /// The open connection, or a new one.
    async fn connection(&self) -> Result<(u64, Connection), Error> {
        self.connection_or_driver_error()
            .await
            .map_err(|source| self.connect_error(source))
    }

    /// A failed connect: retryable as the driver's error is, naming the server.
    fn connect_error(&self, source: RedisError) -> Error {
        let target = match (&self.inner.target, &self.inner.servers) {
            (Target::Node(_), Some(servers)) => format!("Redis at {servers}"),
            (Target::Node(_), None) => "Redis".to_owned(),
            (Target::Cluster(_), Some(servers)) => format!("the Redis cluster at {servers}"),
            (Target::Cluster(_), None) => "the Redis cluster".to_owned(),
        };
        Error::store(
            BACKEND,
            is_retryable(&source),
            ConnectError { target, source },
        )
    }

    async fn connection_or_driver_error(&self) -> Result<(u64, Connection), RedisError> {
        if let Some(open) = self.current().clone() {
            return Ok(open);
        }
        let mut generation = self.inner.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(open) = self.current().clone() {
            return Ok(open);
        }
        let connection = match &self.inner.target {
            Target::Node(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(None);
                Connection::Node(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
            Target::Cluster(client) => Connection::Cluster(client.get_async_connection().await?),
        };
        *generation += 1;
        let open = (*generation, connection);
        *self.current() = Some(open.clone());
        Ok(open)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<(u64, Connection)>> {
        // Every update is one assignment: a poisoned lock holds a whole value.
        self.inner.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops connection `generation` (if it is still the current one): the next call
    /// connects again.
    ///
    /// A cluster connection is never dropped: the cluster client reconnects to each node
    /// and follows failovers itself, and rebuilding it whole (a connection to every node)
    /// because one node stopped answering would take the healthy shards down with it.
    fn forget(&self, generation: u64) {
        if matches!(self.inner.target, Target::Cluster(_)) {
            return;
        }
        let mut current = self.current();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// `EVALSHA`, and the script itself once if the server does not know it.
    async fn eval(&self, lua: &Lua, key: &str, args: &[String]) -> Result<Value, Error> {
        let command = |name: &str, script: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script).arg(1).arg(key).arg(args);
            cmd
        };
        match self
            .send(&command("EVALSHA", lua.script.get_hash()))
            .await?
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => self
                .send(&command("EVAL", lua.body))
                .await?
                .map_err(store_error),
            other => other.map_err(store_error),
        }
    }

    async fn claim_once(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let args = [
            epoch_millis(claim.now).to_string(),
            epoch_secs(claim.now).to_string(),
            epoch_secs(claim.expiration).to_string(),
            epoch_millis(claim.lease_until).to_string(),
            claim.lease_token.clone(),
            if claim.validation.is_some() { "1" } else { "0" }.to_owned(),
            claim.validation.clone().unwrap_or_default(),
            key_expiry_ms(claim.expiration, Some(claim.lease_until)).to_string(),
        ];
        let reply = self.eval(&CLAIM, &self.key(&claim.id), &args).await?;
        claim_outcome(&claim.id, reply)
    }

    async fn complete_once(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let args = [
            claim.lease_token.clone(),
            epoch_secs(expiration).to_string(),
            key_expiry_ms(expiration, None).to_string(),
            if data.is_some() { "1" } else { "0" }.to_owned(),
            data.unwrap_or_default().to_owned(),
        ];
        let reply = self.eval(&COMPLETE, &self.key(&claim.id), &args).await?;
        fenced(&claim.id, reply)
    }

    async fn release_once(&self, claim: &Claim) -> Result<(), Error> {
        let args = [claim.lease_token.clone()];
        let reply = self.eval(&RELEASE, &self.key(&claim.id), &args).await?;
        fenced(&claim.id, reply)
    }

    async fn get_once(&self, id: &str) -> Result<Option<Record>, Error> {
        let reply = self.query(redis::cmd("HGETALL").arg(self.key(id))).await?;
        let fields = fields(id, reply)?;
        if fields.is_empty() {
            return Ok(None);
        }
        parse(id, &fields).map(Some)
    }
}

/// When Redis may delete the key: after the second of `expiration` and after the lease
/// (a record counts through both), plus [`KEY_GRACE`].
fn key_expiry_ms(expiration: SystemTime, lease_until: Option<SystemTime>) -> u64 {
    let expires = epoch_secs(expiration)
        .saturating_add(1)
        .saturating_mul(1000);
    let lease_ends = lease_until.map_or(0, |l| epoch_millis(l).saturating_add(1));
    expires
        .max(lease_ends)
        .saturating_add(KEY_GRACE.as_millis() as u64)
}

/// The claim script's answer: `{1, old}` written, `{0, old}` refused, `old` the hash
/// that was there (empty when none was).
fn claim_outcome(id: &str, reply: Value) -> Result<ClaimOutcome, Error> {
    let (written, old) = match reply {
        Value::Array(parts) => match <[Value; 2]>::try_from(parts) {
            Ok([written, old]) => (written, old),
            Err(parts) => return Err(unexpected(id, &Value::Array(parts))),
        },
        other => return Err(unexpected(id, &other)),
    };
    let old = fields(id, old)?;
    match written {
        // A record we replaced that we cannot read is no reason to fail the claim; an
        // empty hash (no record was there) does not parse either.
        Value::Int(1) => Ok(ClaimOutcome::Claimed {
            previous: parse(id, &old).ok(),
        }),
        // Refused: a live record holds the key. It cannot be empty (that is claimable).
        Value::Int(0) => Ok(ClaimOutcome::Exists(parse(id, &old)?)),
        other => Err(unexpected(id, &other)),
    }
}

/// A completion's or release's answer: 1 done, 0 the lease token no longer matches.
fn fenced(id: &str, reply: Value) -> Result<(), Error> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(Error::LeaseLost { key: id.to_owned() }),
        other => Err(unexpected(id, &other)),
    }
}

/// A hash's fields, from `HGETALL` (a flat array in RESP2, a map in RESP3).
fn fields(id: &str, value: Value) -> Result<HashMap<String, String>, Error> {
    let text = |v: Value| match v {
        Value::BulkString(bytes) => String::from_utf8(bytes).map_err(|_| ()),
        Value::SimpleString(s) => Ok(s),
        _ => Err(()),
    };
    let pairs: Vec<(Value, Value)> = match value {
        Value::Nil => Vec::new(),
        Value::Map(pairs) => pairs,
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        other => return Err(unexpected(id, &other)),
    };
    pairs
        .into_iter()
        .map(|(k, v)| match (text(k), text(v)) {
            (Ok(k), Ok(v)) => Ok((k, v)),
            _ => Err(malformed(id, "a field or value is not UTF-8 text")),
        })
        .collect()
}

/// The record in a hash, or a non-retryable [`Error::Store`] if it is malformed.
fn parse(id: &str, fields: &HashMap<String, String>) -> Result<Record, Error> {
    // Times past the year 2500 are no record of ours: malformed, not a panic later.
    let number = |name: &str, max: u64| -> Result<Option<u64>, Error> {
        fields
            .get(name)
            .map(|v| {
                v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                    malformed(id, &format!("{name} is not a whole number up to {max}"))
                })
            })
            .transpose()
    };
    let far = crate::clock::far_future();
    let status: Status = fields
        .get("status")
        .ok_or_else(|| malformed(id, "no status"))?
        .parse()
        .map_err(|e: crate::record::UnknownStatus| malformed(id, &e.to_string()))?;
    let expiration =
        number("expiration", epoch_secs(far))?.ok_or_else(|| malformed(id, "no expiration"))?;
    let mut record = Record::new(id, status, from_epoch_secs(expiration));
    record.in_progress_expiration =
        number("in_progress_expiration", epoch_millis(far))?.map(from_epoch_millis);
    record.data = fields.get("data").cloned();
    record.validation = fields.get("validation").cloned();
    record.lease_token = fields.get("lease_token").cloned();
    Ok(record)
}

fn malformed(id: &str, what: &str) -> Error {
    Error::store(
        BACKEND,
        false,
        format!("malformed idempotency record {id:?}: {what}"),
    )
}

/// A reply of a shape the store does not expect: named by its type and size, never its
/// content (it may hold a stored result, which must not land in logs).
fn unexpected(id: &str, reply: &Value) -> Error {
    Error::store(
        BACKEND,
        false,
        format!(
            "unexpected reply for idempotency record {id:?}: {}",
            ReplyShape(reply)
        ),
    )
}

/// A reply's type and size, without its content.
struct ReplyShape<'a>(&'a Value);

impl fmt::Display for ReplyShape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Value::Nil => f.write_str("nil"),
            Value::Int(_) => f.write_str("an integer"),
            Value::Okay => f.write_str("OK"),
            Value::BulkString(b) => write!(f, "a bulk string of {} bytes", b.len()),
            Value::SimpleString(s) => write!(f, "a simple string of {} bytes", s.len()),
            Value::Array(items) => {
                write!(f, "an array of {} elements", items.len())?;
                let kinds: Vec<String> = items.iter().map(|i| ReplyShape(i).to_string()).collect();
                if !kinds.is_empty() && kinds.len() <= 4 {
                    write!(f, " ({})", kinds.join(", "))?;
                }
                Ok(())
            }
            Value::Map(pairs) => write!(f, "a map of {} entries", pairs.len()),
            Value::Set(items) => write!(f, "a set of {} elements", items.len()),
            Value::ServerError(_) => f.write_str("an error reply"),
            _ => f.write_str("a value of another RESP3 type"),
        }
    }
}

/// A connect that failed: names the server; the driver's error is the source.
#[derive(Debug)]
struct ConnectError {
    target: String,
    source: RedisError,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot connect to {}: {}", self.target, self.source)
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether the connection that answered `err` may be unusable: its socket failed, it
/// timed out, or its node is no longer the primary (after a failover, reconnecting to the
/// same endpoint reaches the new one).
fn breaks_connection(err: &RedisError) -> bool {
    // A dropped, refused or timed-out connection is an I/O error.
    err.is_io_error()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
                | ErrorKind::ClusterConnectionNotFound
        )
}

/// Maps a driver error to [`Error::Store`], keeping it as the source (downcast it to
/// [`redis::RedisError`]; a failed connect's source is a message naming the server, whose
/// `source()` is the `RedisError`). Retryable: the connection dropped, refused or timed
/// out, and the server's transient answers (`TRYAGAIN`, `LOADING`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `READONLY` after a failover, redirects the cluster client gave up on,
/// `BUSY` while another client's script runs, `OOM` from a full server under
/// `noeviction`: memory frees as records expire).
fn store_error(err: RedisError) -> Error {
    Error::store(BACKEND, is_retryable(&err), err)
}

/// Whether a later attempt of the same request may succeed.
fn is_retryable(err: &RedisError) -> bool {
    // A certificate or protocol the client refuses fails the same way every time.
    let refused = err.is_io_error()
        && (matches!(err.retry_method(), redis::RetryMethod::NoRetry) || invalid_data(err));
    // A dropped, refused or timed-out connection is an I/O error.
    !refused
        && (err.is_io_error()
            || matches!(err.code(), Some("BUSY" | "OOM"))
            || matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                ) | ErrorKind::ClusterConnectionNotFound
            ))
}

/// Whether `err` holds a TLS refusal (an untrusted or mismatched certificate, a protocol
/// the other side will not speak): rustls's own error, or the `InvalidData` I/O error it
/// travels in.
fn invalid_data(err: &RedisError) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let refusal = |e: &(dyn std::error::Error + 'static)| {
        e.downcast_ref::<rustls::Error>().is_some()
            || e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                io.kind() == std::io::ErrorKind::InvalidData
                    && io
                        .get_ref()
                        .is_some_and(|inner| inner.is::<rustls::Error>())
            })
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(c) = cause {
        // redis-rs keeps the I/O error in an `Arc`, which is the source it reports.
        if refusal(c)
            || c.downcast_ref::<Shared>()
                .is_some_and(|shared| refusal(&**shared))
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// TLS goes through rustls with aws-lc-rs, the provider the AWS SDK already builds; set
/// it as the process default unless one is set (rustls refuses to guess when the build
/// holds two).
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
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
        Box::pin(self.claim_once(claim))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.complete_once(claim, data, expiration))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release_once(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.get_once(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_outlives_its_record_and_its_lease() {
        let exp = from_epoch_secs(1_000);
        // Through the whole expiration second, plus the grace.
        assert_eq!(key_expiry_ms(exp, None), 1_001_000 + 60_000);
        // A lease past the expiry keeps the key through its last millisecond.
        assert_eq!(
            key_expiry_ms(exp, Some(from_epoch_millis(2_000_500))),
            2_000_501 + 60_000
        );
        assert_eq!(
            key_expiry_ms(exp, Some(from_epoch_millis(10))),
            1_001_000 + 60_000
        );
        // Capped times never overflow.
        assert!(key_expiry_ms(crate::clock::far_future(), None) > 1_001_000);
    }

    #[test]
    fn a_malformed_hash_is_a_store_error_not_a_panic() {
        let hash = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for bad in [
            hash(&[("expiration", "1")]),
            hash(&[("status", "DONE"), ("expiration", "1")]),
            hash(&[("status", "COMPLETED")]),
            hash(&[("status", "COMPLETED"), ("expiration", "-1")]),
            hash(&[("status", "COMPLETED"), ("expiration", "99999999999999999")]),
            hash(&[
                ("status", "INPROGRESS"),
                ("expiration", "1"),
                ("in_progress_expiration", "x"),
            ]),
        ] {
            match parse("k", &bad) {
                Err(Error::Store {
                    backend: "redis",
                    retryable: false,
                    ..
                }) => {}
                other => panic!("{bad:?} must be a malformed record, got {other:?}"),
            }
        }
        let good = parse(
            "k",
            &hash(&[
                ("status", "COMPLETED"),
                ("expiration", "5"),
                ("in_progress_expiration", "4000"),
                ("data", "{\"a\": 1}"),
                ("validation", "v"),
                ("lease_token", "t"),
            ]),
        )
        .unwrap();
        assert_eq!(good.status, Status::Completed);
        assert_eq!(good.expiration, from_epoch_secs(5));
        assert_eq!(good.in_progress_expiration, Some(from_epoch_millis(4_000)));
        assert_eq!(good.data.as_deref(), Some("{\"a\": 1}"));
        assert_eq!(
            (good.validation.as_deref(), good.lease_token.as_deref()),
            (Some("v"), Some("t"))
        );
    }

    #[test]
    fn the_claim_scripts_answers() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let hash = Value::Array(
            ["status", "COMPLETED", "expiration", "5", "data", "1"]
                .map(bulk)
                .to_vec(),
        );
        let answer = |written: i64, old: Value| Value::Array(vec![Value::Int(written), old]);
        assert_eq!(
            claim_outcome("k", answer(1, Value::Array(vec![]))).unwrap(),
            ClaimOutcome::Claimed { previous: None }
        );
        match claim_outcome("k", answer(1, hash.clone())).unwrap() {
            ClaimOutcome::Claimed { previous: Some(r) } => {
                assert_eq!(
                    (r.status, r.data.as_deref()),
                    (Status::Completed, Some("1"))
                )
            }
            other => panic!("{other:?}"),
        }
        match claim_outcome("k", answer(0, hash.clone())).unwrap() {
            ClaimOutcome::Exists(r) => assert_eq!(r.expiration, from_epoch_secs(5)),
            other => panic!("{other:?}"),
        }
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Array(vec![]), Value::Nil]),
            answer(2, hash.clone()),
            answer(0, Value::Array(vec![])),
        ] {
            assert!(
                matches!(
                    claim_outcome("k", bad.clone()),
                    Err(Error::Store {
                        retryable: false,
                        ..
                    })
                ),
                "{bad:?} is an error"
            );
        }
    }

    #[test]
    fn which_errors_drop_the_connection_and_which_are_retried() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "socket"));
        let server = |kind| RedisError::from((ErrorKind::Server(kind), "server"));
        for err in [
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::TimedOut),
            io(std::io::ErrorKind::BrokenPipe),
            server(ServerErrorKind::ReadOnly),
            server(ServerErrorKind::MasterDown),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "gone")),
        ] {
            assert!(breaks_connection(&err), "{err} drops the connection");
            assert!(store_error(err).is_retryable());
        }
        for err in [
            server(ServerErrorKind::NoScript),
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::ClusterDown),
            RedisError::from((ErrorKind::AuthenticationFailed, "auth")),
            RedisError::from((ErrorKind::UnexpectedReturnType, "type")),
        ] {
            assert!(!breaks_connection(&err), "{err} keeps the connection");
        }
        for (err, retryable) in [
            (server(ServerErrorKind::TryAgain), true),
            (server(ServerErrorKind::BusyLoading), true),
            (server(ServerErrorKind::ClusterDown), true),
            (server(ServerErrorKind::ResponseError), false),
            (
                RedisError::from((ErrorKind::AuthenticationFailed, "auth")),
                false,
            ),
            (io(std::io::ErrorKind::PermissionDenied), false),
        ] {
            let text = err.to_string();
            assert_eq!(store_error(err).is_retryable(), retryable, "{text}");
        }
    }

    #[test]
    fn an_unexpected_reply_names_its_shape_never_the_stored_data() {
        let secret = "the model's stored answer: 4111 1111 1111 1111";
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let hash = Value::Array(
            ["status", "COMPLETED", "expiration", "5", "data", secret]
                .map(bulk)
                .to_vec(),
        );
        let odd = Value::Array(
            ["status", "COMPLETED", "data", secret, "x"]
                .map(bulk)
                .to_vec(),
        );
        let errors = [
            claim_outcome(
                "k",
                Value::Array(vec![Value::Int(1), hash.clone(), Value::Nil]),
            ),
            claim_outcome("k", Value::Array(vec![hash.clone()])),
            claim_outcome("k", bulk(secret)),
            claim_outcome("k", Value::Array(vec![Value::Int(1), odd.clone()])),
            fenced("k", bulk(secret)).map(|()| ClaimOutcome::Vanished),
            fields("k", odd).map(|_| ClaimOutcome::Vanished),
        ];
        for result in errors {
            let err = result.expect_err("an unexpected reply");
            let Error::Store { source, .. } = &err else {
                panic!("{err:?}")
            };
            for text in [source.to_string(), format!("{err:?}")] {
                assert!(!text.contains("4111"), "the stored data leaked: {text}");
                assert!(
                    text.contains("unexpected reply")
                        && (text.contains("an array of") || text.contains("a bulk string of")),
                    "names the reply's type and size: {text}"
                );
            }
        }
    }

    #[test]
    fn unexpected_replies_are_errors() {
        assert!(matches!(fenced("k", Value::Int(1)), Ok(())));
        assert!(matches!(
            fenced("k", Value::Int(0)),
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            fenced("k", Value::Nil),
            Err(Error::Store {
                retryable: false,
                ..
            })
        ));
        assert!(fields("k", Value::Array(vec![Value::Int(1)])).is_err());
        assert!(fields("k", Value::Nil).unwrap().is_empty());
        // RESP3 answers a map, of simple or bulk strings.
        let map = Value::Map(vec![(
            Value::SimpleString("status".into()),
            Value::BulkString(b"COMPLETED".to_vec()),
        )]);
        assert_eq!(fields("k", map).unwrap()["status"], "COMPLETED");
        assert!(fields("k", Value::Array(vec![Value::Int(1), Value::Int(2)])).is_err());
    }
}

//! Connecting: one node or a cluster, the one connection a store keeps (rebuilt on the
//! next call after a request may have broken it), and a failed connect's error.

use super::error::{breaks_connection, is_retryable, store_error};
use super::{BACKEND, DEFAULT_REQUEST_TIMEOUT, RedisStore};
use crate::error::Error;
use crate::store::attempt_bound;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, RedisError, Value};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connect may take, for one node and for each node of a cluster.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where connections come from. One per store, behind its `Arc`: the size of the
/// variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Node(redis::Client),
    Cluster(ClusterClient),
}

/// A live connection; cloning shares it.
#[derive(Clone)]
pub(super) enum Connection {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

pub(super) struct Inner {
    pub(super) target: Target,
    /// Where it connects, for errors and `Debug`: `host:port`, or a cluster's nodes.
    pub(super) servers: Option<String>,
    /// Whether the URL holds a password (`Debug` says so, never shows it).
    pub(super) password: bool,
    /// The connection and its generation, if one is open. A plain mutex: held only to
    /// copy or swap the value.
    pub(super) current: Mutex<Option<(u64, Connection)>>,
    /// Serialises connects, so concurrent calls share one new connection.
    pub(super) connecting: tokio::sync::Mutex<u64>,
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

    /// Whether this store talks to one node ([`connect`](Self::connect)) that belongs to a
    /// Redis Cluster (`INFO cluster`), such as a cluster's configuration endpoint: it
    /// reaches only the keys of that node's slots, and another node's key answers
    /// `MOVED`. Connect with [`connect_cluster`](Self::connect_cluster) instead; a store
    /// made by it answers `false`. A server that refuses the question (a user without
    /// `INFO`, `-@dangerous`; a proxy that does not know it) answers `false` too: the
    /// question is a guard, and refusing it must not refuse the store.
    pub async fn is_one_node_of_a_cluster(&self) -> Result<bool, Error> {
        if matches!(self.inner.target, Target::Cluster(_)) {
            return Ok(false);
        }
        let reply = match self.send(redis::cmd("INFO").arg("cluster")).await? {
            Ok(reply) => reply,
            // The server answered, with a refusal: no connection or time fault.
            Err(refused) if refused.code().is_some() => return Ok(false),
            Err(failed) => return Err(store_error(failed)),
        };
        let text = match reply {
            Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Value::VerbatimString { text, .. } => text,
            Value::SimpleString(text) => text,
            _ => return Err(super::reply::malformed("INFO", "not text")),
        };
        Ok(text.lines().any(|line| line.trim() == "cluster_enabled:1"))
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
            namespace: String::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        };
        store.connection().await?;
        Ok(store)
    }

    /// Sends `cmd`: the outer error is a failed connect (already an [`Error`] naming the
    /// server), the inner one the request's.
    pub(super) async fn send(&self, cmd: &Cmd) -> Result<Result<Value, RedisError>, Error> {
        self.send_to(cmd, None).await
    }

    /// [`send`](Self::send), to the cluster node at `node` (host, port) when there is
    /// one: a `SCAN` walks one node's keys. A single node ignores it.
    pub(super) async fn send_to(
        &self,
        cmd: &Cmd,
        node: Option<&(String, u16)>,
    ) -> Result<Result<Value, RedisError>, Error> {
        let (generation, connection) = self.connection().await?;
        let mut in_flight = InFlight {
            store: self,
            generation,
            answered: false,
        };
        let request = async {
            match connection {
                Connection::Node(mut c) => cmd.query_async(&mut c).await,
                Connection::Cluster(mut c) => match node {
                    None => cmd.query_async(&mut c).await,
                    Some((host, port)) => {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        });
                        c.route_command(cmd.clone(), route).await
                    }
                },
            }
        };
        // Within an engine attempt as short as our bound, the engine's timer is the one.
        let result = attempt_bound::own_bound(self.request_timeout, request)
            .await
            .unwrap_or_else(|| Err(self.timed_out()));
        in_flight.answered = true;
        if let Err(e) = &result
            && breaks_connection(e)
        {
            self.forget(generation);
        }
        Ok(result)
    }

    /// A request that had no reply within the store's own bound: an I/O timeout, which
    /// breaks the connection.
    fn timed_out(&self) -> RedisError {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no reply within {:?}", self.request_timeout),
        )
        .into()
    }

    /// The open connection, or a new one.
    pub(super) async fn connection(&self) -> Result<(u64, Connection), Error> {
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

/// TLS goes through rustls with aws-lc-rs, the provider the AWS SDK already builds; set
/// it as the process default unless one is set (rustls refuses to guess when the build
/// holds two).
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

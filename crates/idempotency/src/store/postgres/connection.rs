//! The connection's life: one per store, made on first use (connects serialised, so
//! concurrent calls share one), bounded by the connect timeout; every request bounded by
//! the request timeout; dropped, for the next call to reconnect, after an error that
//! broke it or a call cut off unfinished.

use super::PostgresStore;
use super::error::breaks_connection;
use crate::error::Error;
use crate::store::attempt_bound;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

/// Connect timeout when the URL sets none: a stalled connect must not take the whole
/// store attempt.
pub(super) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl PostgresStore {
    /// One statement, one round trip: prepared once per connection (its first use costs a
    /// second round trip), or an unnamed statement with its parameter types when prepared
    /// statements are off.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        self.query_with(sql, params, self.prepared).await
    }

    /// [`query`](Self::query) as an unnamed statement whatever the setting: for a
    /// statement sent once (the start-up check), which nothing should keep prepared.
    pub(super) async fn query_unprepared(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        self.query_with(sql, params, false).await
    }

    async fn query_with(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        prepared: bool,
    ) -> Result<Vec<Row>, Error> {
        let client = self.client().await?;
        let call = Call::new(self, &client);
        let request = async {
            if !prepared {
                return client.query_typed(sql, params).await;
            }
            let statement = self.prepared_statement(&client, sql, params).await?;
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            let rows = client.query(&statement, &values).await;
            if let Err(e) = &rows
                && super::error::lost_prepared_statement(e)
            {
                // The retry (the error is retryable) prepares again.
                self.statements().1.clear();
            }
            rows
        };
        // Within an engine attempt as short as our bound, the engine's timer is the one
        // (its cut-off drops the unfinished call, which drops the connection).
        match attempt_bound::own_bound(self.request_timeout, request).await {
            Some(result) => call.done(result.map_err(|e| self.pg_error(e))),
            // Dropping the unfinished call drops the connection.
            None => Err(self.timed_out("answer", self.request_timeout)),
        }
    }

    /// `sql` prepared on `client`: from the cache, or prepared now (and cached). A new
    /// connection starts with an empty cache.
    async fn prepared_statement(
        &self,
        client: &Arc<Client>,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        // One of the store's own statements (they live as long as the store) is known by
        // its address: no comparison of its text, which is long, on every request.
        let origin = self.inner.sql.owns(sql).then_some(sql.as_ptr() as usize);
        let cached = {
            let cache = self.statements();
            (std::ptr::eq(cache.0.as_ptr(), Arc::as_ptr(client)))
                .then(|| {
                    cache.1.iter().find(|(text, from, _)| match origin {
                        Some(origin) => *from == Some(origin),
                        None => text == sql,
                    })
                })
                .flatten()
                .map(|(_, _, statement)| statement.clone())
        };
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = client.prepare_typed(sql, &types).await?;
        let mut cache = self.statements();
        if !std::ptr::eq(cache.0.as_ptr(), Arc::as_ptr(client)) {
            *cache = (Arc::downgrade(client), Default::default());
        }
        // One entry per text; an entry cached as a copy learns the address, so that a
        // lookup by address finds it.
        match cache.1.iter_mut().find(|(text, _, _)| text == sql) {
            Some((_, from, _)) => *from = from.or(origin),
            None => cache.1.push((sql.to_owned(), origin, statement.clone())),
        }
        Ok(statement)
    }

    fn statements(&self) -> std::sync::MutexGuard<'_, super::PreparedStatements> {
        self.inner
            .statements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Statements separated by `;`, without parameters, in one round trip.
    pub(super) async fn batch_execute(&self, sql: &str) -> Result<(), Error> {
        let client = self.client().await?;
        let call = Call::new(self, &client);
        match tokio::time::timeout(self.request_timeout, client.batch_execute(sql)).await {
            Ok(result) => call.done(result.map_err(|e| self.pg_error(e))),
            // Dropping the unfinished call drops the connection.
            Err(_) => Err(self.timed_out("answer", self.request_timeout)),
        }
    }

    /// The open connection, or a new one.
    pub(super) async fn client(&self) -> Result<Arc<Client>, Error> {
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let _connecting = self.inner.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let client = Arc::new(self.open().await?);
        *self.slot() = Some(client.clone());
        Ok(client)
    }

    fn current(&self) -> Option<Arc<Client>> {
        let mut slot = self.slot();
        match &*slot {
            Some(client) if client.is_closed() => {
                *slot = None;
                None
            }
            other => other.clone(),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Client>>> {
        // Every update is one assignment: a poisoned lock holds a whole value.
        self.inner.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops `client` from the slot (if it is still the current one): the next call
    /// reconnects.
    fn forget(&self, client: &Arc<Client>) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    /// A new connection, TCP, TLS negotiation and start-up bounded together by the connect
    /// timeout (once per host: tokio-postgres tries them in turn).
    pub(super) async fn open(&self) -> Result<Client, Error> {
        let config = &self.inner.config;
        let per_host = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        let bound = per_host.saturating_mul(hosts);
        match tokio::time::timeout(bound, self.open_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(self.timed_out("connection", bound)),
        }
    }

    async fn open_unbounded(&self) -> Result<Client, Error> {
        let config = &self.inner.config;
        let connect_error = |e: tokio_postgres::Error| self.connect_error(e);
        let log_end = |result: Result<(), tokio_postgres::Error>| {
            if let Err(err) = result {
                tracing::debug!(error = %err, "postgres idempotency store connection ended");
            }
        };
        if config.get_ssl_mode() == SslMode::Disable {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(connect_error)?;
            tokio::spawn(async move { log_end(connection.await) });
            return Ok(client);
        }
        let tls = self.tls_config()?;
        let (client, connection) = config
            .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
            .await
            .map_err(connect_error)?;
        tokio::spawn(async move { log_end(connection.await) });
        Ok(client)
    }
}

/// A call in flight on `client`: if it is dropped unfinished (the engine's attempt
/// timeout cut it off), the connection may be stalled, so the next call reconnects
/// rather than queue behind it.
struct Call<'a> {
    store: &'a PostgresStore,
    client: &'a Arc<Client>,
    finished: bool,
}

impl<'a> Call<'a> {
    fn new(store: &'a PostgresStore, client: &'a Arc<Client>) -> Self {
        Self {
            store,
            client,
            finished: false,
        }
    }

    /// Ends the call; an error that broke the connection drops it.
    fn done<T>(mut self, result: Result<T, Error>) -> Result<T, Error> {
        self.finished = true;
        if let Err(Error::Store { source, .. }) = &result
            && breaks_connection(source)
        {
            self.store.forget(self.client);
        }
        result
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.store.forget(self.client);
        }
    }
}

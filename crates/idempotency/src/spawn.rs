//! Tasks the library spawns inherit the invocation of the task that spawns them: its
//! deadline and its tenant. A plain `tokio::spawn` drops every task-local, so a tenant's
//! request would share another tenant's records. A spawned task is an entry point of its
//! own (an HTTP request): it does not join the spawner's batch record or its twins.

use std::future::Future;

/// [`tokio::spawn`], carrying the current invocation (deadline, tenant), read now.
pub(crate) fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Boxed first: the layers then wrap a pointer, not a copy of a large future.
    tokio::spawn(crate::invocation::carry(Box::pin(fut)))
}

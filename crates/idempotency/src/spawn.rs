//! Tasks the library spawns inherit what the call that spawns them inherits: the
//! invocation (deadline, tenant), the batch's twins and record, the call's marks. A plain
//! `tokio::spawn` drops every task-local, so a tenant's request would share another
//! tenant's records.

use std::future::Future;

/// `fut`, carrying everything the current call inherits, read now (before it is spawned).
pub(crate) fn carried<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    crate::invocation::carry(crate::twins::carry(crate::record_scope::carry(
        crate::outcome_unknown::carry(fut),
    )))
}

/// [`tokio::spawn`], carrying what the current call inherits ([`carried`]).
pub(crate) fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Boxed first: the layers then wrap a pointer, not a copy of a large future.
    tokio::spawn(carried(Box::pin(fut)))
}

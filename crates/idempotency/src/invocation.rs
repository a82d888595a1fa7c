//! The current Lambda invocation's deadline, carried to every record's lease, and its
//! tenant, carried to every stored id.
//!
//! Batch processing and the tower layer set them from the [`lambda_runtime::Context`], so
//! an `#[idempotent]` function deep in a handler claims no longer than the invocation lives,
//! and never shares a record with another tenant's invocation.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

tokio::task_local! {
    static INVOCATION: Invocation;
    /// Apart from the deadline: an invocation may have a tenant and no usable deadline
    /// (`cargo lambda watch`, a test's `Context::default()`), and a nested
    /// [`with_deadline`] changes the deadline but never the tenant.
    static TENANT: Arc<str>;
}

/// The invocation a call runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invocation {
    /// When Lambda ends the invocation.
    pub(crate) deadline: SystemTime,
    /// When the enclosing batch stops waiting and answers (the deadline outside a batch).
    pub(crate) answer_by: SystemTime,
}

/// The deadline of a Lambda context, or `None` for a context without one
/// (`Context::default()` in tests) or with one already past when read: a real invocation
/// always starts before its deadline, and some local emulators send a duration instead
/// of an epoch time (`cargo lambda watch` sends `600000`). Reads the system clock; the
/// library's own callers read the time from their handle's clock instead.
pub(crate) fn context_deadline(context: &lambda_runtime::Context) -> Option<SystemTime> {
    context_deadline_at(context, SystemTime::now())
}

/// [`context_deadline`] as seen at `now`.
pub(crate) fn context_deadline_at(
    context: &lambda_runtime::Context,
    now: SystemTime,
) -> Option<SystemTime> {
    let deadline = UNIX_EPOCH + Duration::from_millis(context.deadline);
    (context.deadline > 0 && deadline > now).then_some(deadline)
}

/// Runs `fut` with `deadline` as the invocation deadline seen by idempotent functions in it.
pub async fn with_deadline<F: Future>(deadline: Option<SystemTime>, fut: F) -> F::Output {
    // Inside a batch, the batch still answers when it said it would.
    let enclosing = current();
    within(
        deadline.map(|deadline| Invocation {
            deadline,
            answer_by: enclosing.map_or(deadline, |i| i.answer_by.min(deadline)),
        }),
        fut,
    )
    .await
}

/// Runs `fut` within `invocation`, if any.
pub(crate) async fn within<F: Future>(invocation: Option<Invocation>, fut: F) -> F::Output {
    match invocation {
        Some(invocation) => INVOCATION.scope(invocation, fut).await,
        None => fut.await,
    }
}

/// Runs `fut` within the invocation described by `context`: its deadline and, in Lambda's
/// tenant isolation mode, its tenant ([`Context::tenant_id`](lambda_runtime::Context)),
/// which every stored id in `fut` then includes.
pub async fn with_context<F: Future>(context: &lambda_runtime::Context, fut: F) -> F::Output {
    within_tenant(
        context_tenant(context),
        with_deadline(context_deadline(context), fut),
    )
    .await
}

/// The tenant of a Lambda context: `None` without one, and for an empty tenant id, which
/// Lambda never sends (a tenant id is 1 to 256 characters) and which would make a stored id
/// no different from another tenant's empty one: it is no tenant.
pub(crate) fn context_tenant(context: &lambda_runtime::Context) -> Option<Arc<str>> {
    context
        .tenant_id
        .as_deref()
        .filter(|tenant| !tenant.is_empty())
        .map(Arc::from)
}

/// Runs `fut` with `tenant` as the tenant of its stored ids. `None` keeps the enclosing
/// tenant: a context without one, met inside a tenant's invocation, never lets its calls
/// out of that tenant's records.
pub(crate) async fn within_tenant<F: Future>(tenant: Option<Arc<str>>, fut: F) -> F::Output {
    match tenant {
        Some(tenant) => TENANT.scope(tenant, fut).await,
        None => fut.await,
    }
}

/// The tenant set by an enclosing [`with_context`] (or a batch, or a layer), if any.
pub fn current_tenant() -> Option<Arc<str>> {
    TENANT.try_with(Arc::clone).ok()
}

/// The deadline set by an enclosing [`with_deadline`] or [`with_context`].
pub fn current_deadline() -> Option<SystemTime> {
    current().map(|i| i.deadline)
}

/// The enclosing invocation, if any.
pub(crate) fn current() -> Option<Invocation> {
    INVOCATION.try_with(|i| *i).ok()
}

/// `fut` within the invocation and tenant enclosing this call, read now: for a future
/// that runs elsewhere (a spawned task), where task-locals are not inherited.
#[cfg(feature = "http")]
pub(crate) fn carry<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let (invocation, tenant) = (current(), current_tenant());
    within(invocation, within_tenant(tenant, fut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_tenant_outlives_a_nested_deadline_and_an_empty_one_is_none() {
        let mut context = lambda_runtime::Context::default();
        context.tenant_id = Some(String::new());
        assert_eq!(context_tenant(&context), None);
        context.tenant_id = Some("a".into());
        let seen = with_context(&context, async {
            let nested = with_deadline(Some(SystemTime::now()), async { current_tenant() });
            let none = lambda_runtime::Context::default();
            let untenanted = with_context(&none, async { current_tenant() }).await;
            (nested.await, untenanted)
        })
        .await;
        assert_eq!(seen, (Some("a".into()), Some("a".into())));
        assert_eq!(current_tenant(), None);
    }

    #[test]
    fn a_deadline_already_past_is_no_deadline() {
        let mut context = lambda_runtime::Context::default();
        assert_eq!(context_deadline(&context), None, "no deadline");
        // `cargo lambda watch` sends 600000: ten minutes after 1970, not from now.
        context.deadline = 600_000;
        assert_eq!(context_deadline(&context), None, "a duration, not a time");
        let future = SystemTime::now() + Duration::from_secs(30);
        context.deadline = crate::record::epoch_millis(future);
        assert_eq!(
            context_deadline(&context),
            Some(crate::record::from_epoch_millis(context.deadline))
        );
    }
}

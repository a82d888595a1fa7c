//! The current Lambda invocation's deadline, carried to every record's lease.
//!
//! Batch processing and the tower layer set it from the [`lambda_runtime::Context`], so an
//! `#[idempotent]` function deep in a handler claims no longer than the invocation lives.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

tokio::task_local! {
    static INVOCATION: Invocation;
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
pub fn context_deadline(context: &lambda_runtime::Context) -> Option<SystemTime> {
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

/// Runs `fut` within the invocation described by `context`.
pub async fn with_context<F: Future>(context: &lambda_runtime::Context, fut: F) -> F::Output {
    with_deadline(context_deadline(context), fut).await
}

/// The deadline set by an enclosing [`with_deadline`] or [`with_context`].
pub fn current_deadline() -> Option<SystemTime> {
    current().map(|i| i.deadline)
}

/// The enclosing invocation, if any.
pub(crate) fn current() -> Option<Invocation> {
    INVOCATION.try_with(|i| *i).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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

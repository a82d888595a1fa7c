//! The current Lambda invocation's deadline, carried to every record's lease.
//!
//! Batch processing and the tower layer set it from the [`lambda_runtime::Context`], so an
//! `#[idempotent]` function deep in a handler claims no longer than the invocation lives.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

tokio::task_local! {
    static DEADLINE: SystemTime;
}

/// The deadline of a Lambda context, or `None` for a context without one
/// (`Context::default()` in tests) or with one already past when read: a real invocation
/// always starts before its deadline, and some local emulators send a duration instead
/// of an epoch time (`cargo lambda watch` sends `600000`).
pub fn context_deadline(context: &lambda_runtime::Context) -> Option<SystemTime> {
    let deadline = UNIX_EPOCH + Duration::from_millis(context.deadline);
    (context.deadline > 0 && deadline > SystemTime::now()).then_some(deadline)
}

/// Runs `fut` with `deadline` as the invocation deadline seen by idempotent functions in it.
pub async fn with_deadline<F: Future>(deadline: Option<SystemTime>, fut: F) -> F::Output {
    match deadline {
        Some(d) => DEADLINE.scope(d, fut).await,
        None => fut.await,
    }
}

/// Runs `fut` within the invocation described by `context`.
pub async fn with_context<F: Future>(context: &lambda_runtime::Context, fut: F) -> F::Output {
    with_deadline(context_deadline(context), fut).await
}

/// The deadline set by an enclosing [`with_deadline`] or [`with_context`].
pub fn current_deadline() -> Option<SystemTime> {
    DEADLINE.try_with(|d| *d).ok()
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

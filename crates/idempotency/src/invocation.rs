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
/// (`Context::default()` in tests).
pub fn context_deadline(context: &lambda_runtime::Context) -> Option<SystemTime> {
    (context.deadline > 0).then(|| UNIX_EPOCH + Duration::from_millis(context.deadline))
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

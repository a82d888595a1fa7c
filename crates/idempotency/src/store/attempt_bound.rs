//! The engine's bound on a store request, seen by the store: a store that bounds its own
//! requests (Redis, PostgreSQL: so that a call outside the engine never hangs) skips its
//! own timer when the engine's is as short, so an attempt runs under one timer, not two.
//!
//! The bound is set on the thread while the engine polls the request (the store reads it
//! in its request's first poll), and restored after: a task the store spawned, or another
//! task on the thread, never sees it.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

thread_local! {
    static ENGINE_BOUND: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// `request`, an engine attempt cut off after `bound`.
pub(crate) fn within<F: Future + Unpin>(bound: Duration, request: F) -> Within<F> {
    Within { bound, request }
}

/// Whether the engine already cuts the current request off within `own`, the store's
/// own bound: then the store's timer would never fire first.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) fn engine_bounds_within(own: Duration) -> bool {
    ENGINE_BOUND.get().is_some_and(|bound| bound <= own)
}

/// A store request polled with the engine's bound set on the thread.
pub(crate) struct Within<F> {
    bound: Duration,
    request: F,
}

impl<F: Future + Unpin> Future for Within<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts the previous bound back, even if the poll panics.
        struct Restore(Option<Duration>);
        impl Drop for Restore {
            fn drop(&mut self) {
                ENGINE_BOUND.set(self.0);
            }
        }
        let _restore = Restore(ENGINE_BOUND.replace(Some(self.bound)));
        Pin::new(&mut self.request).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_bound_is_seen_only_while_the_engine_polls_the_request() {
        let own = Duration::from_secs(5);
        assert!(
            !engine_bounds_within(own),
            "no engine: the store's own timer"
        );
        let seen = within(
            Duration::from_secs(2),
            Box::pin(async {
                let first = engine_bounds_within(own);
                tokio::task::yield_now().await;
                // After a pending poll, the next poll sets it again.
                (
                    first,
                    engine_bounds_within(own),
                    engine_bounds_within(Duration::from_secs(1)),
                )
            }),
        )
        .await;
        assert_eq!(
            seen,
            (true, true, false),
            "a store bound shorter than the engine's keeps its own timer"
        );
        assert!(!engine_bounds_within(own), "restored after the request");
        // Another task on the thread never sees it.
        let other = tokio::spawn(async move { engine_bounds_within(own) });
        let seen_by_other = within(
            Duration::from_secs(2),
            Box::pin(async { tokio::task::yield_now().await }),
        );
        seen_by_other.await;
        assert!(!other.await.unwrap());
    }
}

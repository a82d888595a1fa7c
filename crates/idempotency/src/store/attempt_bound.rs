//! The engine's bound on a store request, seen by the store: a store that bounds its own
//! requests (Redis, PostgreSQL: so that a call outside the engine never hangs) sets no
//! timer of its own while the engine's is as short, so an attempt runs under one timer,
//! not two.
//!
//! The engine publishes its bound on the thread while it polls the request, with the
//! waker of the task it polls for, and restores the previous value after. The store looks
//! at every poll its request is pending on: a poll outside the engine's (another task
//! awaiting a shared request, a nested executor driving it inside the engine's poll, which
//! sees another waker) arms the store's own timer, due its bound after the request began.
//! So a request is never without a bound that can fire.

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The engine's bound and the task it polls for (its waker's data and vtable addresses).
#[derive(Clone, Copy)]
struct Bound {
    bound: Duration,
    waker: (usize, usize),
}

thread_local! {
    static ENGINE_BOUND: Cell<Option<Bound>> = const { Cell::new(None) };
}

fn waker_id(waker: &Waker) -> (usize, usize) {
    (
        waker.data() as usize,
        std::ptr::from_ref(waker.vtable()) as usize,
    )
}

/// `request`, an engine attempt cut off after `bound`.
pub(crate) fn within<F: Future + Unpin>(bound: Duration, request: F) -> Within<F> {
    Within { bound, request }
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
        struct Restore(Option<Bound>);
        impl Drop for Restore {
            fn drop(&mut self) {
                ENGINE_BOUND.set(self.0);
            }
        }
        let bound = Bound {
            bound: self.bound,
            waker: waker_id(cx.waker()),
        };
        let _restore = Restore(ENGINE_BOUND.replace(Some(bound)));
        Pin::new(&mut self.request).poll(cx)
    }
}

/// Whether the engine cuts off, within `own`, the request being polled with `cx`: its
/// bound is set and the poll is its own.
fn engine_bounds_within(own: Duration, cx: &Context<'_>) -> bool {
    ENGINE_BOUND
        .get()
        .is_some_and(|engine| engine.bound <= own && engine.waker == waker_id(cx.waker()))
}

/// A store's request under the store's own bound `own`, whose timer is armed only if the
/// request is polled pending outside an engine attempt as short: `None` when it fired.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) async fn own_bound<F: Future>(own: Duration, request: F) -> Option<F::Output> {
    let began = tokio::time::Instant::now();
    let mut request = pin!(request);
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(answer) = request.as_mut().poll(cx) {
            return Poll::Ready(Some(answer));
        }
        if timer.is_none() && !engine_bounds_within(own, cx) {
            // A bound past what an instant can hold (`Duration::MAX`) never fires: none.
            if let Some(due) = began.checked_add(own) {
                timer = Some(Box::pin(tokio::time::sleep_until(due)));
            }
        }
        let fired = timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
        if fired {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A request that never answers.
    fn hung() -> futures_util::future::Pending<()> {
        futures_util::future::pending()
    }

    #[tokio::test]
    async fn outside_the_engine_the_store_bound_fires() {
        let started = Instant::now();
        let answer = own_bound(Duration::from_millis(50), hung()).await;
        assert_eq!(answer, None);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn the_shorter_of_the_two_bounds_ends_a_hung_request() {
        // The engine's own timer is what cuts it off: here, a timeout around `within`.
        let request = Box::pin(own_bound(Duration::from_secs(5), hung()));
        let engine = tokio::time::timeout(
            Duration::from_millis(50),
            within(Duration::from_millis(50), request),
        );
        assert!(engine.await.is_err(), "the engine's timer fired");
        // A longer engine bound leaves the store's shorter one armed.
        let request = Box::pin(own_bound(Duration::from_millis(50), hung()));
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            within(Duration::from_secs(10), request),
        )
        .await;
        assert_eq!(answer.ok(), Some(None), "the store's own timer fired first");
    }

    #[tokio::test]
    async fn a_request_that_escapes_the_engine_keeps_its_own_bound() {
        use futures_util::FutureExt;
        let shared = own_bound(Duration::from_millis(100), hung())
            .boxed()
            .shared();
        // First polled by the engine, which gives up (its timer) ...
        let engine = tokio::time::timeout(
            Duration::from_millis(20),
            within(Duration::from_millis(20), shared.clone()),
        );
        assert!(engine.await.is_err());
        // ... then awaited by another caller: the store's timer still ends it.
        let outside = tokio::time::timeout(Duration::from_secs(5), shared).await;
        assert_eq!(outside.ok(), Some(None));
    }

    #[tokio::test]
    async fn the_bound_is_restored_after_the_engines_poll() {
        let own = Duration::from_secs(5);
        let waker = futures_util::task::noop_waker();
        let cx = Context::from_waker(&waker);
        assert!(!engine_bounds_within(own, &cx));
        let seen = within(
            Duration::from_secs(2),
            Box::pin(std::future::poll_fn(|cx| {
                Poll::Ready(engine_bounds_within(own, cx))
            })),
        )
        .await;
        assert!(seen, "seen during the engine's poll, with its waker");
        assert!(!engine_bounds_within(own, &cx), "restored after it");
        // The same task, polled again after the engine's poll: no bound left behind.
        let after = std::future::poll_fn(|cx| Poll::Ready(engine_bounds_within(own, cx))).await;
        assert!(!after, "restored after it, for the engine's own task too");
    }

    #[tokio::test]
    async fn a_nested_executor_inside_the_engines_poll_is_not_the_engine() {
        let own = Duration::from_secs(5);
        let seen = within(
            Duration::from_secs(2),
            Box::pin(std::future::poll_fn(|_| {
                // As `block_on` inside the engine's poll polls with a waker of its own.
                let waker = futures_util::task::noop_waker();
                let nested = Context::from_waker(&waker);
                Poll::Ready(engine_bounds_within(own, &nested))
            })),
        )
        .await;
        assert!(!seen, "another waker's poll keeps the store's own timer");
    }
}

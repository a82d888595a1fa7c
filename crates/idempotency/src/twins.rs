//! Twins: two records of one batch invocation with one stored id, most often a producer's
//! re-send landing in the same SQS batch as the original. The later call waits for the
//! earlier one and answers with its result. Claiming in the store instead would find the
//! earlier call's claim and hand the message back to SQS: a whole visibility timeout and
//! a receive for a result this invocation is about to have.
//!
//! The batch scopes the registry to its invocation ([`scope`]): calls outside a batch, or
//! in another invocation, meet in the store as any two workers do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How the earlier call ended, as its twins see it.
#[derive(Debug, Clone)]
pub(crate) enum Settled {
    /// Its result, as JSON (stored, replayed, or computed and not stored).
    Value(Arc<str>),
    /// Another worker held the key: the twin is in progress elsewhere too.
    InProgress(std::time::SystemTime),
    /// It failed: the twin answers with the same failure, of the same class.
    Failed {
        reason: Arc<str>,
        retryable: bool,
        permanent: bool,
    },
}

tokio::task_local! {
    static IN_FLIGHT: Arc<InFlight>;
    /// When a twin stops waiting, besides the invocation's own bound: an HTTP caller's
    /// patience, the same bound for every join of one request.
    static WAIT_UNTIL: std::time::SystemTime;
    /// The calls whose function is running around this future, by handle and id: a call
    /// nested in one with its own id (a shared `key_prefix`, a recursion) is no twin, it
    /// would wait for its own caller.
    static ENCLOSING: Arc<Vec<(usize, String)>>;
}

/// Whether `id` of `handle` is a call that encloses the current future.
pub(crate) fn encloses(handle: usize, id: &str) -> bool {
    ENCLOSING
        .try_with(|ids| ids.iter().any(|(h, i)| *h == handle && i == id))
        .unwrap_or(false)
}

/// Runs `fut`, the function of the call to `id`, as enclosed by that call.
pub(crate) async fn enclosed_by<F: std::future::Future>(
    handle: usize,
    id: &str,
    fut: F,
) -> F::Output {
    let mut ids = ENCLOSING
        .try_with(|ids| ids.as_ref().clone())
        .unwrap_or_default();
    ids.push((handle, id.to_owned()));
    ENCLOSING.scope(Arc::new(ids), fut).await
}

/// Runs `fut` (a batch invocation's records) with one registry of running calls.
pub(crate) async fn scope<F: std::future::Future>(fut: F) -> F::Output {
    IN_FLIGHT.scope(Arc::default(), fut).await
}

/// Runs `fut` with `in_flight` as its registry: one that outlives an invocation, shared by
/// the concurrent requests of one HTTP layer.
#[cfg(feature = "http")]
pub(crate) async fn scope_in<F: std::future::Future>(
    in_flight: Arc<InFlight>,
    fut: F,
) -> F::Output {
    IN_FLIGHT.scope(in_flight, fut).await
}

/// Runs `fut` with its twins waiting until `until` at most.
#[cfg(feature = "http")]
pub(crate) async fn waiting_until<F: std::future::Future>(
    until: std::time::SystemTime,
    fut: F,
) -> F::Output {
    WAIT_UNTIL.scope(until, fut).await
}

/// The enclosing bound on waiting for a twin, if any.
pub(crate) fn wait_until() -> Option<std::time::SystemTime> {
    WAIT_UNTIL.try_with(|until| *until).ok()
}

/// The enclosing batch invocation's registry, if any.
pub(crate) fn current() -> Option<Arc<InFlight>> {
    IN_FLIGHT.try_with(Arc::clone).ok()
}

/// The calls running now, by handle and stored id.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    calls: Mutex<HashMap<(usize, String), Call>>,
}

#[derive(Debug)]
struct Call {
    /// Which call this is, so a later call with the same id never removes another's entry.
    serial: u64,
    validation: Option<String>,
    settled: watch::Sender<Option<Settled>>,
}

/// What [`InFlight::enter`] found.
pub(crate) enum Entered {
    /// No twin is running: run, and settle the guard.
    First(Running),
    /// A twin is running: wait for it.
    Twin(Twin),
}

/// The running call's entry; removed when dropped, so a cancelled or panicking call never
/// leaves its twins waiting (they see the sender gone and claim in the store themselves).
pub(crate) struct Running {
    in_flight: Arc<InFlight>,
    id: (usize, String),
    serial: u64,
    settled: watch::Sender<Option<Settled>>,
}

/// A waiting twin.
pub(crate) struct Twin {
    /// The running call's validation hash: a twin whose payload differs is a mismatch.
    pub(crate) validation: Option<String>,
    settled: watch::Receiver<Option<Settled>>,
}

impl InFlight {
    /// Enters the call to `id` of the handle `handle` (its address: two handles over two
    /// stores may use the same ids).
    pub(crate) fn enter(
        self: &Arc<Self>,
        handle: usize,
        id: &str,
        validation: Option<&str>,
    ) -> Entered {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let key = (handle, id.to_owned());
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(call) = calls.get(&key) {
            return Entered::Twin(Twin {
                validation: call.validation.clone(),
                settled: call.settled.subscribe(),
            });
        }
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (settled, _) = watch::channel(None);
        calls.insert(
            key.clone(),
            Call {
                serial,
                validation: validation.map(str::to_owned),
                settled: settled.clone(),
            },
        );
        Entered::First(Running {
            in_flight: Arc::clone(self),
            id: key,
            serial,
            settled,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl Running {
    /// Whether a twin waits for this call (so its result is worth a second serialization).
    pub(crate) fn awaited(&self) -> bool {
        self.settled.receiver_count() > 0
    }

    /// Hands `settled` to every waiting twin.
    pub(crate) fn settle(self, settled: Settled) {
        self.settled.send_replace(Some(settled));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut calls = self
            .in_flight
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if calls.get(&self.id).is_some_and(|c| c.serial == self.serial) {
            calls.remove(&self.id);
        }
    }
}

impl Twin {
    /// How the running call ended, or `None` if it was dropped unsettled (cancelled, or it
    /// panicked): the twin then claims in the store like any call.
    pub(crate) async fn settled(mut self) -> Option<Settled> {
        match self.settled.wait_for(Option::is_some).await {
            Ok(settled) => settled.clone(),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_twin_gets_what_the_first_call_settles_and_the_entry_goes() {
        let in_flight = Arc::new(InFlight::default());
        let Entered::First(first) = in_flight.enter(1, "k", Some("v")) else {
            panic!("the first call runs")
        };
        assert!(
            matches!(in_flight.enter(2, "k", None), Entered::First(_)),
            "another handle's id is another call"
        );
        let Entered::Twin(twin) = in_flight.enter(1, "k", Some("w")) else {
            panic!("the second call is a twin")
        };
        assert_eq!(twin.validation.as_deref(), Some("v"));
        assert!(first.awaited());
        first.settle(Settled::Value("1".into()));
        assert_eq!(in_flight.len(), 0, "settling removes the entry");
        assert!(matches!(twin.settled().await, Some(Settled::Value(v)) if &*v == "1"));
        assert!(matches!(in_flight.enter(1, "k", None), Entered::First(_)));
    }

    #[tokio::test]
    async fn a_dropped_call_releases_its_twins_unsettled() {
        let in_flight = Arc::new(InFlight::default());
        let first = in_flight.enter(1, "k", None);
        let Entered::Twin(twin) = in_flight.enter(1, "k", None) else {
            panic!("a twin")
        };
        drop(first);
        assert!(twin.settled().await.is_none());
        assert_eq!(in_flight.len(), 0);
    }

    #[test]
    fn an_old_guard_never_removes_a_newer_call() {
        let in_flight = Arc::new(InFlight::default());
        let Entered::First(old) = in_flight.enter(1, "k", None) else {
            panic!()
        };
        // The old call's entry replaced by hand, as if it had gone and a new one came.
        in_flight.calls.lock().unwrap().remove(&(1, "k".to_owned()));
        let newer = in_flight.enter(1, "k", None);
        assert!(!old.awaited());
        drop(old);
        assert_eq!(in_flight.len(), 1, "the newer call's entry stays");
        drop(newer);
        assert_eq!(in_flight.len(), 0);
    }
}

//! Twins: two records of one batch invocation with one stored id, most often a producer's
//! re-send landing in the same SQS batch as the original. The later call waits for the
//! earlier one and answers with its result. Claiming in the store instead would find the
//! earlier call's claim and hand the message back to SQS: a whole visibility timeout and
//! a receive for a result this invocation is about to have.
//!
//! The batch scopes the registry to its invocation ([`InFlight::for_batch`], in its call
//! context): calls outside a batch, or in another invocation, meet in the store as any two
//! workers do.

use super::invocation::Invocation;
use super::record_scope::RecordScope;
use crate::clock::Clock;
use crate::error::{Error, ExecuteError, FailureKind, report};
use crate::operation::outcome::Outcome;
use crate::record::{decode, lease};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How the earlier call ended, as its twins see it.
#[derive(Debug, Clone)]
pub(crate) enum Settled {
    /// Its result, as JSON (stored, replayed, or computed and not stored).
    Value(Arc<str>),
    /// Another worker held the key: the twin is in progress elsewhere too.
    InProgress(std::time::SystemTime),
    /// It failed, panicked or was dropped: the twin answers with the same failure, of the
    /// same class, and never runs the function itself (the call may have paid for it).
    Failed {
        reason: Arc<str>,
        retryable: bool,
        kind: FailureKind,
    },
}

impl Settled {
    /// How a call that ended with `result` settles its twins; `None` for a function's own
    /// failure, whose class only the batch that called it can tell (see [`Running::end`]).
    fn of<T: Serialize, E>(result: &Result<(T, Outcome), ExecuteError<E>>) -> Option<Self> {
        Some(match result {
            Ok((value, _)) => match serde_json::to_string(value) {
                Ok(data) => Settled::Value(data.into()),
                Err(e) => Settled::Failed {
                    reason: format!("its result does not serialize: {e}").into(),
                    retryable: false,
                    kind: FailureKind::Rejected,
                },
            },
            Err(ExecuteError::Idempotency(Error::AlreadyInProgress { lease_expires, .. })) => {
                Settled::InProgress(*lease_expires)
            }
            Err(ExecuteError::Idempotency(e)) => Settled::Failed {
                reason: report(e).into(),
                retryable: e.is_retryable(),
                kind: e.failure_kind(),
            },
            Err(ExecuteError::Function(_)) => return None,
        })
    }

    /// A function's own failure, as twins see it: a later delivery may succeed.
    pub(crate) fn function_failed(reason: Arc<str>, kind: FailureKind) -> Self {
        Settled::Failed {
            retryable: !kind.is_permanent(),
            reason,
            kind,
        }
    }
}

/// The calls running now, by handle and stored id (and, in a batch, those that failed).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    calls: Mutex<HashMap<(usize, String), Call>>,
    /// Whether a failed call's entry stays for the registry's life (a batch invocation's).
    keeps_failures: bool,
}

#[derive(Debug)]
struct Call {
    /// Which call this is, so a later call with the same id never removes another's entry.
    serial: u64,
    validation: Option<String>,
    settled: watch::Sender<Option<Settled>>,
    /// The batch records whose calls wait for this one.
    waiting_records: Vec<usize>,
}

/// What [`InFlight::enter`] found.
pub(crate) enum Entered {
    /// No twin is running: run, and settle the guard.
    First(Running),
    /// A twin is running: wait for it.
    Twin(Twin),
}

/// The running call's entry. Dropped before it ended (the call panicked or was
/// cancelled), it settles its twins with that failure: they never run a function whose
/// call may already have been paid for.
pub(crate) struct Running {
    in_flight: Arc<InFlight>,
    id: (usize, String),
    serial: u64,
    settled: watch::Sender<Option<Settled>>,
    /// Whether the call ended with an answer (settled, or nobody waits for it).
    ended: bool,
}

/// A waiting twin.
pub(crate) struct Twin {
    /// The running call's validation hash: a twin whose payload differs is a mismatch.
    pub(crate) validation: Option<String>,
    settled: watch::Receiver<Option<Settled>>,
}

impl InFlight {
    /// A batch invocation's registry, which keeps the failures of the calls that ended: a
    /// twin later in the batch (in a FIFO group, a shard) answers with its sibling's
    /// failure instead of running the function again. (An HTTP layer's registry outlives
    /// invocations and keeps none.)
    pub(crate) fn for_batch() -> Self {
        InFlight {
            keeps_failures: true,
            ..InFlight::default()
        }
    }

    /// Enters the call to `id` of the handle `handle` (its address: two handles over two
    /// stores may use the same ids), made in `record`'s attempt if any.
    pub(crate) fn enter(
        self: &Arc<Self>,
        handle: usize,
        id: &str,
        validation: Option<&str>,
        record: Option<&RecordScope>,
    ) -> Entered {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let key = (handle, id.to_owned());
        let scope = record;
        let record = record.map(RecordScope::id);
        if let Some(scope) = scope {
            // The handler goes on after a call's function failed: that failure was not
            // its record's answer, so its twins need not wait for the record's class (and
            // two records that each wait for the other's next call never stall).
            scope.settle_failures(None);
        }
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(call) = calls.get_mut(&key) {
            if let Some(record) = record {
                call.waiting_records.push(record);
            }
            // (A call of this record that failed earlier was settled just above: it is
            // never waited for here.)
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
                waiting_records: Vec::new(),
            },
        );
        Entered::First(Running {
            in_flight: Arc::clone(self),
            id: key,
            serial,
            settled,
            ended: false,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl Running {
    /// Whether a twin waits for this call (so its result is worth a second serialization).
    fn awaited(&self) -> bool {
        self.settled.receiver_count() > 0
    }

    /// Hands how the call ended to its twins. A function's own failure waits for the class
    /// its batch record (`record`) gives it: the twin of a `PermanentError` is permanent
    /// too. Outside a batch it is a failure a later attempt may fix.
    pub(crate) fn end<T: Serialize, E: fmt::Display>(
        mut self,
        result: &Result<(T, Outcome), ExecuteError<E>>,
        record: Option<&RecordScope>,
    ) {
        match Settled::of(result) {
            Some(settled @ Settled::Failed { .. }) => self.settle(settled),
            Some(settled) if self.awaited() => self.settle(settled),
            // Nobody waits: a twin that comes later asks the store, which has the answer.
            Some(_) => self.ended = true,
            None => {
                let reason: Arc<str> = match result {
                    Err(ExecuteError::Function(e)) => format!("{e:#}").into(),
                    _ => unreachable!("only a function's failure has no settled form"),
                };
                let Some(record) = record else {
                    return self.settle(Settled::function_failed(reason, FailureKind::Error));
                };
                // A twin in the same record's handler would wait for its own record: it
                // fails now, as a failure a redelivery may fix.
                let mut waits_in_record = false;
                self.entry(|call| waits_in_record = call.waiting_records.contains(&record.id()));
                if waits_in_record {
                    self.settle(Settled::function_failed(reason, FailureKind::Error));
                } else {
                    record.defer_failure(self, reason);
                }
            }
        }
    }

    /// Hands `settled` to every waiting twin.
    pub(crate) fn settle(mut self, settled: Settled) {
        self.settled.send_replace(Some(settled));
        self.ended = true;
    }

    fn entry(&self, f: impl FnOnce(&mut Call)) {
        let mut calls = self
            .in_flight
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(call) = calls.get_mut(&self.id).filter(|c| c.serial == self.serial) {
            f(call);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended {
            let (reason, kind) = if std::thread::panicking() {
                ("it panicked", FailureKind::Panicked)
            } else {
                ("it was cancelled before it finished", FailureKind::Error)
            };
            self.settled
                .send_replace(Some(Settled::function_failed(reason.into(), kind)));
        }
        let failed = matches!(*self.settled.borrow(), Some(Settled::Failed { .. }));
        let mut calls = self
            .in_flight
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let ours = calls.get(&self.id).is_some_and(|c| c.serial == self.serial);
        if ours && !(failed && self.in_flight.keeps_failures) {
            calls.remove(&self.id);
        }
    }
}

impl Twin {
    /// How the running call ended, or `None` if it ended with an answer it did not hand
    /// over (nobody waited when it ended): the twin then asks the store like any call.
    pub(crate) async fn settled(mut self) -> Option<Settled> {
        match self.settled.wait_for(Option::is_some).await {
            Ok(settled) => settled.clone(),
            Err(_) => None,
        }
    }
}

impl Twin {
    /// Waits for the running call to `id` and answers with its result, or `None` when it
    /// was dropped unsettled (the caller then claims in the store). Waits no longer than
    /// `invocation`'s batch answers, nor past `wait_until`.
    pub(crate) async fn join<T, E>(
        self,
        id: &str,
        invocation: Option<Invocation>,
        wait_until: Option<std::time::SystemTime>,
        clock: &dyn Clock,
    ) -> Option<Result<(T, Outcome), ExecuteError<E>>>
    where
        T: DeserializeOwned,
    {
        let twin = self;
        tracing::info!("a twin of this record is running in this batch: waiting for its result");
        // Waits no longer than the batch does: a twin still waiting when the batch answers
        // is in progress, not unfinished. Nor longer than the registry allows (an HTTP
        // caller's patience).
        let now = clock.now();
        let batch_left = invocation.map(|invocation| {
            crate::clock::until(now, invocation.answer_by)
                .saturating_sub(lease::COMPLETION_HEADROOM / 2)
        });
        let caller_left = wait_until.map(|until| crate::clock::until(now, until));
        let left = match (batch_left, caller_left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let settled = match left {
            Some(left) => match tokio::time::timeout(left, twin.settled()).await {
                Ok(settled) => settled,
                // The twin's lease is not known here: its invocation's end, or a second.
                Err(_) => Some(Settled::InProgress(invocation.map_or_else(
                    || crate::clock::add(clock.now(), std::time::Duration::from_secs(1)),
                    |i| i.deadline,
                ))),
            },
            None => twin.settled().await,
        };
        let key = || id.to_owned();
        Some(match settled? {
            Settled::Value(data) => decode(id, Some(&data))
                .map(|value| (value, Outcome::Joined))
                .map_err(ExecuteError::Idempotency),
            Settled::InProgress(lease_expires) => {
                Err(ExecuteError::Idempotency(Error::AlreadyInProgress {
                    key: key(),
                    lease_expires,
                    retry_after: lease::retry_after(
                        clock.now(),
                        Some(lease_expires),
                        lease_expires,
                    ),
                }))
            }
            Settled::Failed {
                reason,
                retryable,
                kind,
            } => Err(ExecuteError::Idempotency(Error::TwinFailed {
                key: key(),
                reason: reason.to_string(),
                retryable,
                kind,
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_twin_gets_what_the_first_call_settles_and_the_entry_goes() {
        let in_flight = Arc::new(InFlight::default());
        let Entered::First(first) = in_flight.enter(1, "k", Some("v"), None) else {
            panic!("the first call runs")
        };
        assert!(
            matches!(in_flight.enter(2, "k", None, None), Entered::First(_)),
            "another handle's id is another call"
        );
        let Entered::Twin(twin) = in_flight.enter(1, "k", Some("w"), None) else {
            panic!("the second call is a twin")
        };
        assert_eq!(twin.validation.as_deref(), Some("v"));
        assert!(first.awaited());
        first.settle(Settled::Value("1".into()));
        assert_eq!(in_flight.len(), 0, "settling removes the entry");
        assert!(matches!(twin.settled().await, Some(Settled::Value(v)) if &*v == "1"));
        assert!(matches!(
            in_flight.enter(1, "k", None, None),
            Entered::First(_)
        ));
    }

    #[tokio::test]
    async fn a_dropped_call_fails_its_twins_and_a_batch_keeps_the_failure() {
        for keeps_failures in [false, true] {
            let in_flight = Arc::new(InFlight {
                keeps_failures,
                ..InFlight::default()
            });
            let first = in_flight.enter(1, "k", None, None);
            let Entered::Twin(twin) = in_flight.enter(1, "k", None, None) else {
                panic!("a twin")
            };
            drop(first);
            assert!(
                matches!(twin.settled().await, Some(Settled::Failed { kind: FailureKind::Error, retryable: true, ref reason }) if reason.contains("cancelled")),
                "a cancelled call's twin never runs it again"
            );
            assert_eq!(in_flight.len(), usize::from(keeps_failures));
            if keeps_failures {
                let Entered::Twin(later) = in_flight.enter(1, "k", None, None) else {
                    panic!("a later twin in the batch meets the failure")
                };
                assert!(matches!(
                    later.settled().await,
                    Some(Settled::Failed { .. })
                ));
            }
        }
    }

    #[tokio::test]
    async fn an_answer_nobody_waits_for_leaves_later_calls_to_the_store() {
        let in_flight = Arc::new(InFlight {
            keeps_failures: true,
            ..InFlight::default()
        });
        let Entered::First(first) = in_flight.enter(1, "k", None, None) else {
            panic!()
        };
        first.end::<u8, String>(&Ok((1, Outcome::Executed)), None);
        assert_eq!(
            in_flight.len(),
            0,
            "a success is not kept: the store has it"
        );
    }

    #[test]
    fn an_old_guard_never_removes_a_newer_call() {
        let in_flight = Arc::new(InFlight::default());
        let Entered::First(old) = in_flight.enter(1, "k", None, None) else {
            panic!()
        };
        // The old call's entry replaced by hand, as if it had gone and a new one came.
        in_flight.calls.lock().unwrap().remove(&(1, "k".to_owned()));
        let newer = in_flight.enter(1, "k", None, None);
        assert!(!old.awaited());
        drop(old);
        assert_eq!(in_flight.len(), 1, "the newer call's entry stays");
        drop(newer);
        assert_eq!(in_flight.len(), 0);
    }
}

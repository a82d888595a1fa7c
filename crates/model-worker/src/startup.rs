//! Start-up: what each phase of init cost ([`Phases`], one log line at the end of init),
//! and the store's check that runs beside the rest of start-up ([`StoreCheck`]).
//!
//! Init is billed on every cold start, and Lambda's own report gives only its total
//! (`Init Duration`): the line says where it went, in CloudWatch as in a benchmark
//! (`crates/benchmarks/src/bin/bench-startup.rs` reads it, from this worker and from the
//! bare worker it is measured against).

use lambda_runtime::Error;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The tracing target of the start-up lines (`RUST_LOG=warn,startup=info` keeps them alone).
pub const TARGET: &str = "startup";

/// What starts the line logged at the end of init; `key=value` pairs follow.
pub const PHASES_LINE: &str = "start-up phases:";

/// What starts the line logged when a store check that ran beside start-up passed
/// ([`StoreCheck::start`]), with `store_check_ms`: its time from its start.
pub const CHECK_LINE: &str = "store check passed:";

/// How long each phase of start-up took, from `main` to the runtime's loop, logged as one
/// line ([`Phases::log`]):
///
/// ```text
/// start-up phases: main_unix_us=1796309221258776 configuration_ms=0.014 store_client_ms=3.770 worker_ms=2.174 metrics_ms=0.015 table_check_ms=0.862 init_ms=6.958
/// ```
///
/// Phases that ran side by side (the secret and the store) each show their own time;
/// `init_ms` is the wall time from `main` to the line. `main_unix_us` is when `main` began
/// (Unix time, microseconds): what came before it (`exec`, the binary's loading, the tokio
/// runtime) is that minus the process's start, which a launcher knows and Lambda does not
/// report.
#[derive(Debug)]
pub struct Phases {
    started: Instant,
    started_unix: SystemTime,
    done: Mutex<Vec<(&'static str, Duration)>>,
}

impl Phases {
    /// Starts the clock: call it first thing in `main`.
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            started_unix: SystemTime::now(),
            done: Mutex::new(Vec::new()),
        }
    }

    /// Records that `phase` took `took`.
    pub fn record(&self, phase: &'static str, took: Duration) {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((phase, took));
    }

    /// Runs `f`, recording its time as `phase`.
    pub fn time<T>(&self, phase: &'static str, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.record(phase, started.elapsed());
        out
    }

    /// Awaits `future`, recording its time as `phase`.
    pub async fn time_async<T>(&self, phase: &'static str, future: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = future.await;
        self.record(phase, started.elapsed());
        out
    }

    /// The phases so far, as the line [`Phases::log`] writes: the phases in the order they
    /// ended, then `init_ms`, the time since [`Phases::start`].
    pub fn line(&self) -> String {
        let main_unix_us = self
            .started_unix
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let mut line = format!("{PHASES_LINE} main_unix_us={main_unix_us}");
        for (phase, took) in self.done.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            line.push_str(&format!(" {phase}_ms={:.3}", millis(*took)));
        }
        line.push_str(&format!(" init_ms={:.3}", millis(self.started.elapsed())));
        line
    }

    /// Logs [`Phases::line`] at INFO (target [`TARGET`]).
    pub fn log(&self) {
        tracing::info!(target: TARGET, "{}", self.line());
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whether the store passed its start-up check: every claim waits for it
/// ([`StoreCheck::wait`]), so no message is ever processed against a store that was not
/// checked. Cheap to clone.
///
/// Most checks are done before the handle exists (a Redis or PostgreSQL connection, the
/// settings of a DynamoDB table's key); the one that reads the DynamoDB table is
/// [started](StoreCheck::start) in a task of its own, so its round trip (and the
/// connection it opens, which the first claim then reuses) runs beside the runtime's
/// first `/next`, off the billed init.
#[derive(Clone, Debug, Default)]
pub struct StoreCheck(Option<Arc<Pending>>);

#[derive(Debug)]
struct Pending {
    /// Set once the check passed: after that, [`StoreCheck::wait`] is this one load.
    passed: AtomicBool,
    /// `Some` once the check ended: its outcome, a failure as its report.
    outcome: watch::Receiver<Option<Result<(), String>>>,
}

impl StoreCheck {
    /// A store with nothing left to check.
    pub fn passed() -> Self {
        Self(None)
    }

    /// Starts `check`. Its first poll runs here, so whatever it finds without waiting
    /// (settings that cannot work on any table) comes back now, as this call's error; the
    /// rest runs in a task of its own. If it fails there, `on_failure` gets its error
    /// first (the binaries log it and exit with status 2), then every
    /// [`StoreCheck::wait`] returns it. When it passes, a line starting with
    /// [`CHECK_LINE`] gives its time.
    pub async fn start(
        check: impl Future<Output = Result<(), Error>> + Send + 'static,
        on_failure: impl FnOnce(&Error) + Send + 'static,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let mut check = Box::pin(check);
        match std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx))).await {
            Poll::Ready(Ok(())) => return Ok(Self::passed()),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => {}
        }
        let (publish, outcome) = watch::channel(None);
        let pending = Arc::new(Pending {
            passed: AtomicBool::new(false),
            outcome,
        });
        let shared = pending.clone();
        tokio::spawn(async move {
            match check.await {
                Ok(()) => {
                    shared.passed.store(true, Ordering::Release);
                    let _ = publish.send(Some(Ok(())));
                    tracing::info!(
                        target: TARGET,
                        "{CHECK_LINE} store_check_ms={:.3}",
                        millis(started.elapsed())
                    );
                }
                Err(e) => {
                    on_failure(&e);
                    let _ = publish.send(Some(Err(lambda_idempotency::report(&*e))));
                }
            }
        });
        Ok(Self(Some(pending)))
    }

    /// Returns once the check passed (at once, one atomic load, ever after), or with its
    /// failure.
    pub async fn wait(&self) -> Result<(), Error> {
        let Some(pending) = &self.0 else {
            return Ok(());
        };
        if pending.passed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut outcome = pending.outcome.clone();
        let ended = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| "the store's start-up check ended without an outcome")?;
        match &*ended {
            Some(Err(report)) => Err(format!("the store's start-up check failed: {report}").into()),
            _ => Ok(()),
        }
    }
}

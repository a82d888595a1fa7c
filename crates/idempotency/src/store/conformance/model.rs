//! A model-based test of the engine over any store: seeded random histories of
//! deliveries, store faults, crashes, function errors, concurrent duplicates and clock
//! steps, checked against the protocol's invariants after every step.
//!
//! The invariants:
//! - (a) no execution of a key starts while an earlier execution's lease is live;
//! - (b) a key runs again only after its previous execution ended without a stored
//!   result (a crash whose lease then ended, a function error, a result lost to the
//!   store) or its completed record expired;
//! - (c) a call never returns a result computed for a different payload;
//! - (d) once faults stop and leases end, every key completes: no history strands a key;
//! - (e) every call that is not killed returns within its invocation's deadline;
//! - (f) a delivery is told "in progress" only while another delivery of its key could
//!   hold a live claim: one that was killed, hit a store fault or lost its result within
//!   the last invocation, or a concurrent duplicate. A claim must recognise itself.
//!
//! A failing history panics with its seed and its steps; [`run_seed`] replays it.

use super::op_name;
use crate::clock::{Clock, TestClock};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::key::KeyStrategy;
use crate::operation::{Operation, Outcome};
use crate::store::IdempotencyStore;
use crate::store::StoreOp;
use crate::store::faulty::{Fault, FaultyStore};
use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Every invocation's length: the lease, since the engine takes the deadline as lease.
pub const INVOCATION: Duration = Duration::from_secs(10);

/// Steps after which the window of keys moves on by one.
const KEY_WINDOW_STEPS: usize = 6;

/// Time given, once faults stop, for every lease to end.
const CLAIM_SLACK: Duration = Duration::from_secs(2);

/// The store attempt timeout the histories run with.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(200);

/// How long a killed delivery runs before it is dropped, as when Lambda's sandbox dies.
const KILL_AFTER: Duration = Duration::from_millis(50);

/// One step of a history.
#[derive(Debug, Clone)]
pub enum Step {
    /// One delivery of `key` with payload `variant`; the function does `act`; the store
    /// suffers `fault` on its next `op` request, if any.
    Deliver {
        /// Which key (0..keys).
        key: u8,
        /// Which payload for that key: a different variant is a different request that
        /// reuses the key (a producer bug), refused by validation.
        variant: u8,
        /// What the function does.
        act: Act,
        /// A fault for the store's next request of one kind.
        fault: Option<(StoreOp, Fault)>,
    },
    /// `copies` deliveries of one key at once (SQS duplicates on several workers).
    Race {
        /// Which key.
        key: u8,
        /// How many at once.
        copies: u8,
    },
    /// Time passes.
    Advance(Duration),
}

/// What the function does in one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Returns its result.
    Succeed,
    /// Returns an error (the claim is released).
    Fail,
    /// The worker dies while the function runs: its claim stays until its lease ends.
    Crash,
}

/// A seeded random history of `len` steps. Keys come from a window of `keys` that slides
/// every few steps, so fresh keys keep meeting crashes, faults and lease ends (a key,
/// once completed, only replays).
pub fn history(seed: u64, keys: u8, len: usize) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len)
        .map(|i| (i, (i / KEY_WINDOW_STEPS) as u8))
        .map(|(_, base)| match rng.u8(0..20) {
            0..=11 => Step::Deliver {
                key: base + rng.u8(0..keys),
                variant: u8::from(rng.u8(0..10) == 0),
                act: match rng.u8(0..10) {
                    0 => Act::Fail,
                    1 | 2 => Act::Crash,
                    _ => Act::Succeed,
                },
                fault: (rng.u8(0..3) == 0).then(|| {
                    let op = [StoreOp::Claim, StoreOp::Complete, StoreOp::Release][rng.usize(0..3)];
                    let fault = match rng.u8(0..6) {
                        0 => Fault::Unavailable,
                        1 => Fault::Rejected,
                        2 => Fault::AnswerLost,
                        3 => Fault::Hang,
                        4 => Fault::LateApply(Duration::from_millis(rng.u64(1..600))),
                        _ => Fault::Slow(Duration::from_millis(rng.u64(1..100))),
                    };
                    (op, fault)
                }),
            },
            12..=14 => Step::Race {
                key: base + rng.u8(0..keys),
                copies: rng.u8(2..5),
            },
            15 | 16 => Step::Advance(Duration::from_millis(rng.u64(100..2_000))),
            // Around a lease's end: the window where a takeover is wrong, then right.
            17 | 18 => Step::Advance(INVOCATION - Duration::from_millis(rng.u64(0..3_000))),
            _ => Step::Advance(INVOCATION + Duration::from_millis(rng.u64(0..3_000))),
        })
        .collect()
}

/// The seeds to run: `MODEL_SEED=s` replays one history, `MODEL_SEEDS=n` runs `0..n`,
/// otherwise `0..default`.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("MODEL_SEED") {
        return vec![seed.parse().expect("MODEL_SEED is a number")];
    }
    let n = std::env::var("MODEL_SEEDS")
        .ok()
        .map(|n| n.parse().expect("MODEL_SEEDS is a number"))
        .unwrap_or(default);
    (0..n).collect()
}

/// How the engine may be set up for a history.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// Record expiry: shorter than [`INVOCATION`] plays an expiry shorter than a call.
    pub expires_after: Duration,
}

impl Setup {
    /// An expiry of an hour, sized for a queue's redeliveries.
    pub const QUEUE_SIZED_EXPIRY: Setup = Setup {
        expires_after: Duration::from_secs(3_600),
    };
    /// An expiry of 3 s, shorter than a call ([`INVOCATION`]).
    pub const EXPIRY_SHORTER_THAN_A_CALL: Setup = Setup {
        expires_after: Duration::from_secs(3),
    };
    /// Every setup [`run_all`] runs.
    pub const ALL: [Setup; 2] = [Setup::QUEUE_SIZED_EXPIRY, Setup::EXPIRY_SHORTER_THAN_A_CALL];
}

/// Steps in each history [`run_all`] runs.
pub const STEPS: usize = 40;

/// Runs the histories of [`seeds`]`(histories)` (`MODEL_SEEDS`, `MODEL_SEED` override it)
/// of [`STEPS`] steps against `store`, under every [`Setup`]. Part of
/// [`run_whole_contract`](super::run_whole_contract).
pub async fn run_all<S>(store: S, histories: u64)
where
    S: IdempotencyStore + Clone + 'static,
{
    for setup in Setup::ALL {
        for seed in seeds(histories) {
            run_seed(store.clone(), seed, setup, STEPS).await;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Running,
    Completed(SystemTime),
    Released,
    Killed,
    Unstored,
}

#[derive(Debug)]
struct Execution {
    variant: u8,
    started: SystemTime,
    /// The end of its lease: its delivery's deadline (the engine's lease, exactly).
    lease_end: SystemTime,
    ended: Ended,
}

#[derive(Debug, Default)]
struct Log {
    executions: HashMap<u8, Vec<Execution>>,
    /// Lease ends of deliveries that may have left a claim behind.
    may_hold: HashMap<u8, Vec<SystemTime>>,
    violations: Vec<String>,
}

/// Runs the history of `seed` against `store` and checks every invariant, panicking with
/// the seed and the steps on a violation. Time passes on `clock`, which must be the
/// engine's only source of time: under tokio's paused time it moves as timers fire.
pub async fn run_seed<S>(store: S, seed: u64, setup: Setup, steps: usize)
where
    S: IdempotencyStore + Clone + 'static,
{
    let keys = 3;
    let history = history(seed, keys, steps);
    // MODEL_TRACE=1 prints every step and its answer, to read a failing seed.
    let trace = std::env::var_os("MODEL_TRACE").is_some();
    let faulty = FaultyStore::new(store);
    let clock = TestClock::new(SystemTime::now());
    let idempotency = Idempotency::builder(faulty.clone())
        .expires_after(setup.expires_after)
        .store_attempt_timeout(ATTEMPT_TIMEOUT)
        .clock(clock.clone())
        .build();
    let op = Operation::new(op_name(&format!("model-{seed}")), KeyStrategy::field("key"))
        .validate(["variant"]);
    let log = Arc::new(Mutex::new(Log::default()));
    let world = World {
        idempotency,
        op,
        clock,
        log: log.clone(),
        setup,
    };
    for (i, step) in history.iter().enumerate() {
        match step {
            Step::Deliver {
                key,
                variant,
                act,
                fault,
            } => {
                faulty.clear_faults();
                if let Some((op, fault)) = fault {
                    faulty.inject(*op, *fault, 1);
                }
                let outcome = world
                    .deliver(*key, *variant, *act, fault.is_some(), false)
                    .await;
                if trace {
                    eprintln!("{i:3} {step:?} -> {outcome:?}");
                }
                faulty.clear_faults();
            }
            Step::Race { key, copies } => {
                let variant = world.first_variant(*key);
                let calls =
                    (0..*copies).map(|_| world.deliver(*key, variant, Act::Succeed, false, true));
                futures_util::future::join_all(calls).await;
            }
            Step::Advance(by) => {
                world.clock.advance(*by);
                if trace {
                    eprintln!("{i:3} {step:?}");
                }
            }
        }
        let violations = std::mem::take(&mut log.lock().unwrap().violations);
        if !violations.is_empty() {
            panic!(
                "seed {seed}: step {i} ({step:?}) broke the protocol:\n  {}\nhistory:\n{}",
                violations.join("\n  "),
                render(&history)
            );
        }
    }
    // (d) Liveness: faults stop, every lease ends, and one more delivery of each key
    // leaves it completed (with its own result, or another variant's: a mismatch).
    faulty.clear_faults();
    world.clock.advance(INVOCATION + CLAIM_SLACK);
    let all_keys = keys + (steps / KEY_WINDOW_STEPS) as u8;
    for key in 0..all_keys {
        let variant = world.first_variant(key);
        let outcome = world
            .deliver(key, variant, Act::Succeed, false, false)
            .await;
        let payload = json!({"key": format!("k{key}"), "variant": variant});
        let id = world
            .idempotency
            .idempotency_id(&world.op, &payload)
            .unwrap();
        let record = faulty.inner().get(&id).await.expect("get");
        let completed = record
            .as_ref()
            .is_some_and(|r| r.status == crate::record::Status::Completed);
        let log = log.lock().unwrap();
        assert!(
            log.violations.is_empty() && completed,
            "seed {seed}: key {key} is not completed once faults stopped and leases ended: \
             delivery {outcome:?}, record {record:?}, {:?}\nhistory:\n{}",
            log.violations,
            render(&history)
        );
    }
}

struct World {
    idempotency: Idempotency,
    op: Operation,
    clock: TestClock,
    log: Arc<Mutex<Log>>,
    setup: Setup,
}

impl World {
    /// The variant the key's first execution ran with (0 if none ran).
    fn first_variant(&self, key: u8) -> u8 {
        let log = self.log.lock().unwrap();
        log.executions
            .get(&key)
            .and_then(|e| e.first())
            .map_or(0, |e| e.variant)
    }

    async fn deliver(
        &self,
        key: u8,
        variant: u8,
        act: Act,
        faulty: bool,
        racing: bool,
    ) -> Result<Outcome, String> {
        let payload = json!({"key": format!("k{key}"), "variant": variant});
        let start = tokio::time::Instant::now();
        let start_time = self.clock.now();
        let deadline = start_time + INVOCATION;
        let index = Arc::new(Mutex::new(None::<usize>));
        let call = self
            .idempotency
            .execute_until(&self.op, &payload, deadline, || {
                let index = index.clone();
                async move {
                    *index.lock().unwrap() = Some(self.started(key, variant, deadline));
                    match act {
                        Act::Succeed => Ok(format!("k{key}:v{variant}")),
                        Act::Fail => Err("the function failed".to_string()),
                        Act::Crash => std::future::pending().await,
                    }
                }
            });
        let result = if act == Act::Crash {
            match tokio::time::timeout(KILL_AFTER, call).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(i) = *index.lock().unwrap() {
                        self.ended(key, i, Ended::Killed);
                    }
                    self.may_hold(key, deadline);
                    return Err("killed".into());
                }
            }
        } else {
            match tokio::time::timeout(INVOCATION * 2, call).await {
                Ok(result) => result,
                Err(_) => {
                    self.violation(format!(
                        "key {key}: the call did not return within twice its invocation"
                    ));
                    return Err("hung".into());
                }
            }
        };
        let elapsed = start.elapsed();
        let index = *index.lock().unwrap();
        let mut log = self.log.lock().unwrap();
        // (e) Every call answers within its invocation.
        if elapsed > INVOCATION {
            log.violations.push(format!(
                "key {key}: the call took {elapsed:?}, past its {INVOCATION:?} invocation"
            ));
        }
        // (f) "In progress" only while someone else may hold the key.
        if let Err(ExecuteError::Idempotency(Error::AlreadyInProgress { .. })) = &result {
            // A claim is live at this delivery's claim only if its lease ends after the
            // delivery started.
            let held = log
                .may_hold
                .get(&key)
                .is_some_and(|ends| ends.iter().any(|end| *end >= start_time));
            if !held && !racing {
                let first = log
                    .executions
                    .get(&key)
                    .and_then(|e| e.first())
                    .map_or(start_time, |e| e.started);
                let at = start_time.duration_since(first).unwrap_or_default();
                log.violations.push(format!(
                    "key {key}: told in progress at +{at:?} though no other delivery could hold it"
                ));
            }
        }
        let holds = faulty
            || matches!(&result, Ok((_, Outcome::ExecutedUnstored)))
            || matches!(&result, Err(ExecuteError::Idempotency(e))
                if !matches!(e, Error::AlreadyInProgress { .. } | Error::PayloadMismatch { .. }));
        if holds {
            log.may_hold.entry(key).or_default().push(deadline);
        }
        drop(log);
        match result {
            Ok((value, outcome)) => {
                // (c) Never a result computed for another payload.
                if value != format!("k{key}:v{variant}") {
                    self.violation(format!(
                        "key {key} variant {variant} got {value:?} ({outcome:?})"
                    ));
                }
                if let Some(i) = index {
                    let ended = if outcome == Outcome::ExecutedUnstored {
                        Ended::Unstored
                    } else {
                        Ended::Completed(self.clock.now())
                    };
                    self.ended(key, i, ended);
                } else if outcome.ran() {
                    self.violation(format!("key {key}: {outcome:?} without running"));
                }
                Ok(outcome)
            }
            Err(err) => {
                if let ExecuteError::Idempotency(e) = &err
                    && !expected_error(e)
                {
                    self.violation(format!("key {key}: unexpected error {e}"));
                }
                if let Some(i) = index {
                    // A function error releases; a store error after the function ran
                    // (LeaseLost) leaves the record to its lease.
                    let ended = match &err {
                        ExecuteError::Function(_) => Ended::Released,
                        ExecuteError::Idempotency(_) => Ended::Unstored,
                    };
                    self.ended(key, i, ended);
                }
                Err(err.to_string())
            }
        }
    }

    /// Records an execution's start and checks (a) and (b) against the earlier ones.
    fn started(&self, key: u8, variant: u8, lease_end: SystemTime) -> usize {
        let now = self.clock.now();
        let mut log = self.log.lock().unwrap();
        let mut problems = Vec::new();
        let executions = log.executions.entry(key).or_default();
        if let Some(previous) = executions.last() {
            // Claimable only once the clock has passed the lease's last millisecond.
            let lease_over = now > previous.lease_end;
            let justified = match previous.ended {
                // (a) Two executions at once.
                Ended::Running => false,
                Ended::Killed | Ended::Unstored => lease_over,
                Ended::Released => true,
                // Expired (read a little after the completion was written).
                Ended::Completed(at) => {
                    now + Duration::from_secs(1) >= at + self.setup.expires_after
                }
            };
            if !justified {
                problems.push(format!(
                    "key {key}: a second execution started at +{:?} while the previous one (started +{:?}) is {:?}",
                    now.duration_since(executions[0].started).unwrap_or_default(),
                    previous
                        .started
                        .duration_since(executions[0].started)
                        .unwrap_or_default(),
                    previous.ended
                ));
            }
        }
        executions.push(Execution {
            variant,
            started: now,
            lease_end,
            ended: Ended::Running,
        });
        let index = executions.len() - 1;
        log.violations.extend(problems);
        index
    }

    fn may_hold(&self, key: u8, lease_end: SystemTime) {
        let mut log = self.log.lock().unwrap();
        log.may_hold.entry(key).or_default().push(lease_end);
    }

    fn ended(&self, key: u8, index: usize, ended: Ended) {
        let mut log = self.log.lock().unwrap();
        if let Some(e) = log.executions.get_mut(&key).and_then(|e| e.get_mut(index)) {
            e.ended = ended;
        }
    }

    fn violation(&self, what: String) {
        self.log.lock().unwrap().violations.push(what);
    }
}

fn render(history: &[Step]) -> String {
    let mut out = String::new();
    for (i, step) in history.iter().enumerate() {
        let _ = writeln!(out, "  {i:3}: {step:?}");
    }
    out
}

/// The engine's own errors that a delivery may end with in a history; anything else is
/// a defect.
pub fn expected_error(err: &Error) -> bool {
    matches!(
        err,
        Error::AlreadyInProgress { .. }
            | Error::PayloadMismatch { .. }
            | Error::LeaseLost { .. }
            | Error::Store { .. }
            | Error::InconsistentState { .. }
    )
}

//! Time: the one seam through which the library reads it (so lease and expiry cases can be
//! tested deterministically), and the one place where it becomes the record's numbers
//! (epoch seconds and milliseconds, [`Utc`]).

use std::fmt;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the engine reads "now": the claim's condition time, lease ends, expirations and
/// the retry cutoffs all come from here.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock, the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock for tests: it follows tokio's clock (so under `#[tokio::test(start_paused =
/// true)]` it moves only as timers fire, deterministically) and can be moved by hand, to
/// play a lease that ends or a worker whose clock is skewed. Clones share the time.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lambda_idempotency::clock::{Clock, TestClock};
/// use std::time::{Duration, UNIX_EPOCH};
/// let clock = TestClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
/// let before = clock.now();
/// clock.advance(Duration::from_secs(60));
/// assert!(clock.now() >= before + Duration::from_secs(60));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TestClock {
    inner: Arc<Mutex<TestClockState>>,
}

#[derive(Debug)]
struct TestClockState {
    start: SystemTime,
    started: tokio::time::Instant,
    /// Moves by hand, in nanoseconds: positive ahead, negative behind.
    offset_nanos: i128,
}

impl TestClock {
    /// A clock that reads `start` now and moves with tokio's clock from here on. Needs a
    /// tokio runtime with time enabled.
    pub fn new(start: SystemTime) -> Self {
        Self {
            inner: Arc::new(Mutex::new(TestClockState {
                start,
                started: tokio::time::Instant::now(),
                offset_nanos: 0,
            })),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.state().offset_nanos += by.as_nanos() as i128;
    }

    /// Moves the clock back by `by`, as a worker whose clock runs behind would see it.
    pub fn rewind(&self, by: Duration) {
        self.state().offset_nanos -= by.as_nanos() as i128;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TestClockState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        let state = self.state();
        let nanos = state.started.elapsed().as_nanos() as i128 + state.offset_nanos;
        let moved = Duration::from_nanos(nanos.unsigned_abs().min(u64::MAX as u128) as u64);
        if nanos >= 0 {
            add(state.start, moved)
        } else {
            state
                .start
                .checked_sub(moved)
                .unwrap_or(SystemTime::UNIX_EPOCH)
        }
    }
}

/// The latest time the library works with: year 2500, far past any record's life and
/// still representable by every store (epoch milliseconds fit an `i64`).
pub(crate) fn far_future() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(FAR_FUTURE_SECS)
}

/// [`far_future`] in seconds since the epoch.
pub(crate) const FAR_FUTURE_SECS: u64 = 16_725_225_600;

/// `t + d`, capped at [`far_future`] instead of panicking on overflow.
pub(crate) fn add(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d)
        .unwrap_or_else(far_future)
        .min(far_future())
}

/// What is left from `now` until `until`, zero if it has passed.
pub(crate) fn until(now: SystemTime, until: SystemTime) -> Duration {
    until.duration_since(now).unwrap_or_default()
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

/// Epoch seconds, the unit of `expiration` (DynamoDB TTL reads seconds).
pub fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Epoch milliseconds, the unit of `in_progress_expiration` (Powertools' choice).
pub fn epoch_millis(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

/// The inverse of [`epoch_secs`].
/// Values past the year 2500 are capped there, never a panic.
pub fn from_epoch_secs(secs: u64) -> SystemTime {
    add(UNIX_EPOCH, Duration::from_secs(secs))
}

/// The inverse of [`epoch_millis`].
/// Values past the year 2500 are capped there, never a panic.
pub fn from_epoch_millis(millis: u64) -> SystemTime {
    add(UNIX_EPOCH, Duration::from_millis(millis))
}

/// A time as an RFC 3339 UTC timestamp to the millisecond (`2024-05-01T12:00:00.250Z`),
/// for messages an operator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc(pub SystemTime);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = epoch_millis(self.0);
        let (secs, millis) = (ms / 1000, ms % 1000);
        let (days, day_secs) = (secs / 86_400, secs % 86_400);
        // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative).
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            day_secs / 3600,
            day_secs / 60 % 60,
            day_secs % 60
        )
    }
}

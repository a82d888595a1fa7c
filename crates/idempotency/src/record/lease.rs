//! The lease arithmetic, in one place: when a claim's lease ends, when its record
//! expires, when store requests for it stop, when a store may drop its key, and when a
//! record counts no more.
//!
//! The times line up like this, for a claim inside a batch invocation:
//!
//! ```text
//! now ── … ── store cutoff ── answer_by − headroom ── answer_by ── lease end = deadline
//!             (no store retry                          (the batch    (Lambda ends the
//!              starts after)                            answers)      invocation)
//! ```
//!
//! The batch's margin is the user's setting ([`SqsBatch::deadline_margin`]); the cutoff
//! always falls at least [`COMPLETION_HEADROOM`] before the batch answers, whatever that
//! setting is, so a completion that is still being retried is reported as executed (and
//! unstored), never cut off as unfinished.
//!
//! [`SqsBatch::deadline_margin`]: crate::SqsBatch::deadline_margin

use crate::clock;
use crate::clock::{epoch_millis, epoch_secs};
use crate::error::Error;
use crate::record::{Claim, Status};
use std::time::{Duration, SystemTime};

/// The lease when neither an override nor a Lambda deadline is known: Lambda's longest
/// timeout, so no invocation can outlive its claim.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(15 * 60);

/// The shortest lease ever written, so `in_progress_expiration` is never zero or past.
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(1);

/// Store retries stop this long before the lease ends (or a tenth of the lease, if
/// shorter), leaving the handler time to answer before the invocation's deadline.
pub(crate) const COMPLETION_MARGIN: Duration = Duration::from_millis(600);

/// Store retries also stop this long before the enclosing batch answers Lambda (see the
/// module's docs): the margin between a completion's last try and the batch's answer.
pub(crate) const COMPLETION_HEADROOM: Duration = Duration::from_millis(100);

/// Refuses an [at-most-once](crate::Operation::at_most_once) claim whose record would not
/// outlive its lease: its expiry would be raised to the lease's end, so the claim of a run
/// that crashed would expire with its lease and the next delivery would take it over
/// (run it twice), which at most once exists to prevent. Checked when a handle is built
/// against a fixed lease, and for every at-most-once claim against its own lease (the
/// invocation's remaining time when none is fixed, which only the invocation knows: a
/// worker with a 30 s timeout may keep records for 5 minutes).
pub(crate) fn check_at_most_once_expiry(
    expires_after: Duration,
    lease: Duration,
) -> Result<(), Error> {
    if expires_after > lease {
        return Ok(());
    }
    let lease = format!("the lease ({lease:?})");
    Err(Error::InvalidName {
        what: "expires_after",
        name: format!("{expires_after:?}"),
        reason: format!(
            "an at-most-once operation's records must outlive their claims' lease, and this expiry is no longer than {lease}: a crashed run's claim would expire with its lease and the next delivery would run it again. Set expires_after longer than the lease (or a shorter lease), or drop at_most_once"
        ),
    })
}

/// When a claim made at `now` holds its key until: the fixed lease if one is set,
/// otherwise the invocation's deadline, otherwise [`DEFAULT_LEASE`]; never past the
/// deadline (nothing runs after it) and never shorter than [`MIN_LEASE`].
pub(crate) fn lease_until(
    now: SystemTime,
    fixed: Option<Duration>,
    deadline: Option<SystemTime>,
) -> SystemTime {
    let until = match (fixed, deadline) {
        (Some(lease), Some(deadline)) => clock::add(now, lease).min(deadline),
        (Some(lease), None) => clock::add(now, lease),
        (None, Some(deadline)) => deadline.min(clock::far_future()),
        (None, None) => clock::add(now, DEFAULT_LEASE),
    };
    until.max(clock::add(now, MIN_LEASE))
}

/// A record's expiry, `expires_after` from `now`: never before `lease_until`, because an
/// expiry must not end a live lease.
pub(crate) fn expiration(
    now: SystemTime,
    expires_after: Duration,
    lease_until: SystemTime,
) -> SystemTime {
    clock::add(now, expires_after).max(lease_until)
}

/// When store requests for `claim` stop: [`COMPLETION_MARGIN`] before its lease ends (a
/// tenth of the lease if that is shorter), and at least [`COMPLETION_HEADROOM`] before
/// `answer_by`, when the enclosing batch answers Lambda.
pub(crate) fn store_cutoff(claim: &Claim, answer_by: Option<SystemTime>) -> SystemTime {
    let lease = clock::until(claim.now, claim.lease_until);
    let by_lease = claim.lease_until - COMPLETION_MARGIN.min(lease / 10);
    match answer_by {
        Some(answer_by) => by_lease.min(
            answer_by
                .checked_sub(COMPLETION_HEADROOM)
                .unwrap_or(SystemTime::UNIX_EPOCH),
        ),
        None => by_lease,
    }
}

/// When the batch stops waiting and answers: `margin` before the deadline.
pub(crate) fn answer_by(deadline: SystemTime, margin: Duration) -> SystemTime {
    deadline
        .checked_sub(margin)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Whether a record no longer counts at `now`; see
/// [`Record::is_claimable_at`](crate::store::Record::is_claimable_at).
pub(crate) fn is_claimable(
    status: Status,
    expiration: SystemTime,
    lease_end: Option<SystemTime>,
    now: SystemTime,
) -> bool {
    if status == Status::InProgress
        && let Some(lease_end) = lease_end
    {
        // A lease counts in milliseconds, the unit it is stored in.
        return epoch_millis(lease_end) < epoch_millis(now);
    }
    // An expiry counts in seconds, the unit it is stored in.
    epoch_secs(expiration) < epoch_secs(now)
}

/// Whether an in-progress record's lease ended before `now` while the record has not
/// expired: what an [at-most-once](crate::store::Claim::at_most_once) claim never takes
/// over. An expiry still frees the key, as it frees a completed record.
pub(crate) fn is_abandoned(
    status: Status,
    expiration: SystemTime,
    lease_end: Option<SystemTime>,
    now: SystemTime,
) -> bool {
    status == Status::InProgress
        && lease_end.is_some_and(|end| epoch_millis(end) < epoch_millis(now))
        && epoch_secs(expiration) >= epoch_secs(now)
}

/// Whether `expiration` (stored in whole seconds) is in a second after `lease_end`'s:
/// then the expiry was set by the record's `expires_after`, not raised to its lease.
pub(crate) fn epoch_secs_after(expiration: SystemTime, lease_end: SystemTime) -> bool {
    epoch_secs(expiration) > epoch_secs(lease_end)
}

/// When a store with per-key time-to-live may drop a record's key: after the second of
/// `expiration` and after the lease (a record counts through both), plus `grace`. In
/// epoch milliseconds.
#[cfg(feature = "redis")]
pub(crate) fn key_expiry_ms(
    expiration: SystemTime,
    lease_end: Option<SystemTime>,
    grace: Duration,
) -> u64 {
    let expires = epoch_secs(expiration)
        .saturating_add(1)
        .saturating_mul(1000);
    let lease_ends = lease_end.map_or(0, |l| epoch_millis(l).saturating_add(1));
    expires
        .max(lease_ends)
        .saturating_add(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX))
}

/// How long from `now` until an in-progress record can be taken over: just past its
/// lease end (leases count in milliseconds), or, for a record without a lease (Powertools
/// writes those outside Lambda), just past its expiry (expiries count in seconds), which
/// may be days away.
pub(crate) fn retry_after(
    now: SystemTime,
    lease_end: Option<SystemTime>,
    expiration: SystemTime,
) -> Duration {
    match lease_end {
        Some(lease_end) => clock::until(now, clock::add(lease_end, Duration::from_millis(1))),
        None => clock::until(
            now,
            crate::record::from_epoch_secs(epoch_secs(expiration).saturating_add(1)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::from_epoch_millis;

    fn at(ms: u64) -> SystemTime {
        from_epoch_millis(ms)
    }

    fn claim(now: u64, lease_until: u64) -> Claim {
        Claim::new("id", at(now), at(lease_until), "t")
    }

    #[test]
    fn a_lease_ends_at_the_deadline_the_fixed_lease_or_the_default() {
        let now = at(1_000_000);
        let deadline = at(1_030_000);
        assert_eq!(lease_until(now, None, Some(deadline)), deadline);
        assert_eq!(
            lease_until(now, Some(Duration::from_secs(5)), Some(deadline)),
            at(1_005_000)
        );
        assert_eq!(
            lease_until(now, Some(Duration::from_secs(60)), Some(deadline)),
            deadline,
            "never past the deadline"
        );
        assert_eq!(
            lease_until(now, Some(Duration::from_secs(60)), None),
            at(1_060_000)
        );
        assert_eq!(
            lease_until(now, None, None),
            at(1_900_000),
            "Lambda's longest timeout, 15 minutes"
        );
        assert_eq!(
            lease_until(now, Some(Duration::ZERO), None),
            at(1_001_000),
            "never shorter than MIN_LEASE"
        );
        assert_eq!(
            lease_until(now, None, Some(at(999_000))),
            at(1_001_000),
            "a passed deadline still leaves MIN_LEASE"
        );
    }

    #[test]
    fn an_expiry_never_falls_before_the_lease_end() {
        let now = at(1_000_000);
        assert_eq!(
            expiration(now, Duration::from_secs(1), at(1_030_000)),
            at(1_030_000)
        );
        assert_eq!(
            expiration(now, Duration::from_secs(60), at(1_030_000)),
            at(1_060_000)
        );
    }

    #[test]
    fn store_requests_stop_before_the_lease_ends_and_before_the_batch_answers() {
        // A 30 s lease: the full margin.
        assert_eq!(
            store_cutoff(&claim(1_000_000, 1_030_000), None),
            at(1_029_400)
        );
        // A 2 s lease: a tenth of it.
        assert_eq!(
            store_cutoff(&claim(1_000_000, 1_002_000), None),
            at(1_001_800)
        );
        // The batch answers 2 s before the deadline: the cutoff moves before that.
        assert_eq!(
            store_cutoff(&claim(1_000_000, 1_030_000), Some(at(1_028_000))),
            at(1_027_900)
        );
        // The batch answers late: the lease's margin still holds.
        assert_eq!(
            store_cutoff(&claim(1_000_000, 1_030_000), Some(at(1_029_900))),
            at(1_029_400)
        );
        assert_eq!(
            answer_by(at(1_030_000), Duration::from_secs(2)),
            at(1_028_000)
        );
    }

    #[test]
    fn retry_after_is_when_the_record_becomes_claimable() {
        let now = at(1_000_500);
        let expiration = crate::record::from_epoch_secs(1_010);
        let lease = at(1_002_000);
        let after = retry_after(now, Some(lease), expiration);
        assert_eq!(after, Duration::from_millis(1_501));
        let then = clock::add(now, after);
        assert!(is_claimable(
            Status::InProgress,
            expiration,
            Some(lease),
            then
        ));
        assert!(!is_claimable(
            Status::InProgress,
            expiration,
            Some(lease),
            then - Duration::from_millis(1)
        ));
        // No lease: held until the expiry's second has passed.
        let after = retry_after(now, None, expiration);
        assert_eq!(after, Duration::from_millis(10_500));
        assert!(is_claimable(
            Status::InProgress,
            expiration,
            None,
            clock::add(now, after)
        ));
        assert_eq!(
            retry_after(at(2_000_000), Some(lease), expiration),
            Duration::ZERO
        );
    }

    #[test]
    fn a_record_counts_until_its_lease_or_its_expiry_ends() {
        let now = at(1_000_500);
        let claimable = |status, exp_s: u64, lease: Option<u64>| {
            is_claimable(
                status,
                crate::record::from_epoch_secs(exp_s),
                lease.map(at),
                now,
            )
        };
        assert!(claimable(Status::Completed, 999, None));
        assert!(!claimable(Status::Completed, 1_000, None), "same second");
        assert!(claimable(Status::InProgress, 2_000, Some(1_000_499)));
        assert!(
            !claimable(Status::InProgress, 2_000, Some(1_000_500)),
            "same ms"
        );
        assert!(
            !claimable(Status::InProgress, 999, Some(1_000_500)),
            "expired, lease live"
        );
        assert!(
            !claimable(Status::InProgress, 2_000, None),
            "no lease: until expiry"
        );
        assert!(claimable(Status::InProgress, 999, None));
    }
}

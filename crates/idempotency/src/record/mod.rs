//! The idempotency record: its status, its claim, and whether a claim may take it
//! (its lease arithmetic in `lease`).

pub(crate) mod lease;

pub use crate::clock::{Utc, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs};

use crate::error::Error;
use serde::de::DeserializeOwned;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// The state of an idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Claimed by a worker whose lease runs until `in_progress_expiration`.
    InProgress,
    /// Done; `data` holds the result to replay.
    Completed,
}

impl Status {
    /// The stored form, Powertools-compatible.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "INPROGRESS",
            Status::Completed => "COMPLETED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "INPROGRESS" => Ok(Status::InProgress),
            "COMPLETED" => Ok(Status::Completed),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// A stored status that is neither `INPROGRESS` nor `COMPLETED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown idempotency status {:?}", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

/// What a record completed with refused writes holds as its data: a text no result's
/// JSON starts with, then the refusal's reason.
const REFUSAL_MARK: &str = "!writes-refused: ";

/// The longest reason kept in a record: it names a write, never its values.
const MAX_KEPT_REASON: usize = 1024;

/// The data of a record whose function's writes were refused for `reason`.
pub(crate) fn refusal_data(reason: &str) -> String {
    let mut end = reason.len().min(MAX_KEPT_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{REFUSAL_MARK}{}", &reason[..end])
}

/// The refusal's reason, if `data` is a kept refusal.
pub(crate) fn refusal_in(data: &str) -> Option<&str> {
    data.strip_prefix(REFUSAL_MARK)
}

/// One idempotency record, as every store keeps it.
///
/// | field | stored as (DynamoDB default name) |
/// |---|---|
/// | `id` | `id`, string, partition key |
/// | `expiration` | `expiration`, number, epoch **seconds** (the table's TTL attribute) |
/// | `in_progress_expiration` | `in_progress_expiration`, number, epoch **milliseconds** |
/// | `status` | `status`, `INPROGRESS` or `COMPLETED` |
/// | `data` | `data`, the result as a JSON string |
/// | `validation` | `validation`, SHA-256 hex of the validated payload fields |
/// | `lease_token` | `lease_token`, the fencing token of the claim |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The stored idempotency id (prefix and key).
    pub id: String,
    /// Where the record is in its life.
    pub status: Status,
    /// When the record stops counting, whatever its status (TTL may delete it later).
    pub expiration: SystemTime,
    /// When the claiming worker's lease ends. Always set on an in-progress record.
    pub in_progress_expiration: Option<SystemTime>,
    /// The stored result, JSON.
    pub data: Option<String>,
    /// Hash of the validated payload fields.
    pub validation: Option<String>,
    /// Unique per claim: completion and release are conditioned on it.
    pub lease_token: Option<String>,
}

impl Record {
    /// The reason the function's writes were refused, when the record holds a kept
    /// refusal as its answer ([`Error::WritesRefused`](crate::Error::WritesRefused)), not
    /// a result: later deliveries answer it without running.
    pub fn writes_refused(&self) -> Option<&str> {
        self.data.as_deref().and_then(refusal_in)
    }

    /// A record with only its id, status and expiration set; set the other fields after.
    pub fn new(id: impl Into<String>, status: Status, expiration: SystemTime) -> Self {
        Self {
            id: id.into(),
            status,
            expiration,
            in_progress_expiration: None,
            data: None,
            validation: None,
            lease_token: None,
        }
    }

    /// Whether the record no longer counts at `now`: a claim may take it over.
    ///
    /// - in progress with a lease that ended before `now` (by milliseconds): yes;
    /// - expired (`expiration` before `now`, by whole seconds): yes, **unless** it is in
    ///   progress with a live lease. An expiry never ends a live lease, even one written
    ///   by another library with an expiry shorter than its call;
    /// - an in-progress record without a lease (Powertools writes those outside Lambda) is
    ///   held until it expires.
    pub fn is_claimable_at(&self, now: SystemTime) -> bool {
        crate::record::lease::is_claimable(
            self.status,
            self.expiration,
            self.in_progress_expiration,
            now,
        )
    }

    /// Whether this stored record is still `read`: the same status, expiration (whole
    /// seconds), lease end (milliseconds) and lease token, which every claim, completion
    /// and takeover changes. What [`forget`](crate::store::IdempotencyStore::forget)
    /// conditions its delete on.
    pub fn is_as_read(&self, read: &Record) -> bool {
        self.id == read.id
            && self.status == read.status
            && epoch_secs(self.expiration) == epoch_secs(read.expiration)
            && self.in_progress_expiration.map(epoch_millis)
                == read.in_progress_expiration.map(epoch_millis)
            && self.lease_token == read.lease_token
    }

    /// Whether `claim` may replace this record: it no longer counts at the claim's time,
    /// or it is the claim's own in-progress record, written by an earlier attempt of the
    /// same claim whose answer was lost.
    ///
    /// An [at-most-once](Claim::at_most_once) claim never takes over an in-progress
    /// record whose lease ended ([`is_abandoned_at`](Self::is_abandoned_at)): only a free,
    /// expired or own record.
    pub fn is_claimable_by(&self, claim: &Claim) -> bool {
        let own = self.status == Status::InProgress
            && self.lease_token.as_deref() == Some(claim.lease_token.as_str());
        own || (self.is_claimable_at(claim.now)
            && !(claim.at_most_once && self.is_abandoned_at(claim.now)))
    }

    /// Whether the record is a claim whose lease ended at `now` but which has not
    /// expired: its worker crashed or timed out, and whether its run took effect is
    /// unknown. A claim takes it over, unless it is [at-most-once](Claim::at_most_once).
    pub fn is_abandoned_at(&self, now: SystemTime) -> bool {
        crate::record::lease::is_abandoned(
            self.status,
            self.expiration,
            self.in_progress_expiration,
            now,
        )
    }
}

/// A claim: the record a worker writes before it runs the function. Made by the engine;
/// a store reads it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// The stored idempotency id.
    pub id: String,
    /// The time the claim's condition is evaluated against.
    pub now: SystemTime,
    /// Record expiry.
    pub expiration: SystemTime,
    /// Lease end.
    pub lease_until: SystemTime,
    /// Fencing token.
    pub lease_token: String,
    /// Validation hash of the payload.
    pub validation: Option<String>,
    /// Never take over an in-progress record whose lease ended
    /// ([`Record::is_abandoned_at`]): the operation runs at most once per key, and a
    /// crashed run is left for an operator.
    pub at_most_once: bool,
}

impl Claim {
    /// A claim on `id` made at `now`, holding the key until `lease_until` under
    /// `lease_token`; it expires when its lease ends (see [`expires_at`](Self::expires_at))
    /// and has no validation hash (see [`validation`](Self::validation)).
    ///
    /// The engine makes the claims a store sees; this is for a store's own tests.
    pub fn new(
        id: impl Into<String>,
        now: SystemTime,
        lease_until: SystemTime,
        lease_token: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            now,
            expiration: lease_until,
            lease_until,
            lease_token: lease_token.into(),
            validation: None,
            at_most_once: false,
        }
    }

    /// A claim that never takes over an in-progress record whose lease ended
    /// ([`at_most_once`](Self::at_most_once)'s field).
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The record's expiry (`expiration`).
    pub fn expires_at(mut self, expiration: SystemTime) -> Self {
        self.expiration = expiration;
        self
    }

    /// The payload's validation hash.
    pub fn validation(mut self, validation: impl Into<String>) -> Self {
        self.validation = Some(validation.into());
        self
    }

    /// The record a successful claim leaves.
    pub fn to_record(&self) -> Record {
        Record {
            id: self.id.clone(),
            status: Status::InProgress,
            expiration: self.expiration,
            in_progress_expiration: Some(self.lease_until),
            data: None,
            validation: self.validation.clone(),
            lease_token: Some(self.lease_token.clone()),
        }
    }
}

/// The length of every lease token [`new_lease_token`] makes.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) const LEASE_TOKEN_LEN: usize = 40;

/// A token unique to this claim: 64 random bits, this process's start time and a counter.
pub(crate) fn new_lease_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = *PROCESS.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        nanos ^ (u64::from(std::process::id()) << 32) ^ fastrand::u64(..)
    });
    lease_token(
        fastrand::u64(..),
        process,
        COUNTER.fetch_add(1, Ordering::Relaxed) as u32,
    )
}

/// `random`, `process` and `counter` in fixed-width lowercase hex, written digit by
/// digit: one allocation and no formatting machinery, since every claim makes one.
fn lease_token(random: u64, process: u64, counter: u32) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut token = String::with_capacity(LEASE_TOKEN_LEN);
    for (value, digits) in [(random, 16), (process, 16), (u64::from(counter), 8)] {
        for shift in (0..digits).rev() {
            token.push(char::from(HEX[((value >> (shift * 4)) & 0xf) as usize]));
        }
    }
    token
}

/// The stored `data` of the record `id` as `T`: a kept refusal is its `WritesRefused`,
/// no data a result too large to store.
pub(crate) fn decode<T: DeserializeOwned>(id: &str, data: Option<&str>) -> Result<T, Error> {
    if let Some(reason) = data.and_then(refusal_in) {
        return Err(Error::WritesRefused {
            key: id.to_owned(),
            reason: reason.to_owned(),
            retryable: false,
        });
    }
    match data {
        Some(data) => {
            serde_json::from_str(data).map_err(|source| Error::StoredResultIncompatible {
                key: id.to_owned(),
                source,
            })
        }
        // Completed without data: the result was too large to store.
        None => Err(Error::ResultNotStored { key: id.to_owned() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lease_token_has_the_length_the_http_layer_counts() {
        for _ in 0..100 {
            assert_eq!(new_lease_token().len(), LEASE_TOKEN_LEN);
        }
    }

    #[test]
    fn a_lease_token_is_its_three_parts_in_fixed_width_hex() {
        for (random, process, counter) in [
            (0, 0, 0),
            (u64::MAX, u64::MAX, u32::MAX),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210, 0x00c0_ffee),
            (1, 1 << 63, 1 << 31),
        ] {
            assert_eq!(
                lease_token(random, process, counter),
                format!("{random:016x}{process:016x}{counter:08x}")
            );
        }
        assert_ne!(new_lease_token(), new_lease_token());
    }

    fn record(status: Status, exp_s: u64, lease_ms: Option<u64>) -> Record {
        Record {
            id: "k".into(),
            status,
            expiration: from_epoch_secs(exp_s),
            in_progress_expiration: lease_ms.map(from_epoch_millis),
            data: None,
            validation: None,
            lease_token: None,
        }
    }

    #[test]
    fn status_round_trips_through_its_stored_form() {
        for s in [Status::InProgress, Status::Completed] {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
            assert_eq!(s.to_string(), s.as_str());
        }
        assert!("IN_PROGRESS".parse::<Status>().is_err());
    }

    #[test]
    fn claimable_when_expired_or_lease_passed() {
        let now = from_epoch_millis(1_000_500);
        assert!(record(Status::Completed, 999, None).is_claimable_at(now));
        assert!(!record(Status::Completed, 1_000, None).is_claimable_at(now));
        assert!(record(Status::InProgress, 2_000, Some(1_000_499)).is_claimable_at(now));
        assert!(!record(Status::InProgress, 2_000, Some(1_000_500)).is_claimable_at(now));
        assert!(
            !record(Status::InProgress, 2_000, None).is_claimable_at(now),
            "no lease: held until expiry"
        );
        assert!(record(Status::InProgress, 999, None).is_claimable_at(now));
    }

    #[test]
    fn an_expiry_never_ends_a_live_lease() {
        let now = from_epoch_millis(1_000_500);
        // Expired by seconds, lease still live: held.
        assert!(!record(Status::InProgress, 999, Some(1_000_500)).is_claimable_at(now));
        assert!(!record(Status::InProgress, 10, Some(2_000_000)).is_claimable_at(now));
        // Expired and the lease ended: free.
        assert!(record(Status::InProgress, 999, Some(1_000_499)).is_claimable_at(now));
        // Expiry boundary by whole seconds: 1000 is not before 1000.5 in seconds.
        assert!(!record(Status::Completed, 1_000, None).is_claimable_at(now));
        assert!(record(Status::Completed, 999, None).is_claimable_at(now));
    }

    #[test]
    fn a_claim_recognises_its_own_in_progress_record() {
        let now = from_epoch_millis(1_000_500);
        let claim = Claim {
            id: "k".into(),
            now,
            expiration: from_epoch_secs(2_000),
            lease_until: from_epoch_millis(1_030_500),
            lease_token: "mine".into(),
            validation: None,
            at_most_once: false,
        };
        let mut own = claim.to_record();
        assert!(
            own.is_claimable_by(&claim),
            "a retried claim finds its own record"
        );
        own.lease_token = Some("theirs".into());
        assert!(
            !own.is_claimable_by(&claim),
            "another worker's live lease holds"
        );
        let mut done = claim.to_record();
        done.status = Status::Completed;
        assert!(
            !done.is_claimable_by(&claim),
            "a late retry never reopens its own completed record"
        );
    }

    #[test]
    fn times_print_as_rfc_3339_utc() {
        let utc = |ms| Utc(from_epoch_millis(ms)).to_string();
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_250), "2000-02-29T00:00:00.250Z");
        assert_eq!(utc(1_714_564_800_000), "2024-05-01T12:00:00.000Z");
        assert_eq!(utc(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn an_at_most_once_claim_takes_a_free_expired_or_own_record_but_no_lapsed_lease() {
        let now = from_epoch_millis(1_000_500);
        let claim = Claim::new("k", now, from_epoch_millis(1_030_500), "mine").at_most_once();
        let lapsed = record(Status::InProgress, 2_000, Some(1_000_499));
        assert!(lapsed.is_abandoned_at(now));
        assert!(
            !lapsed.is_claimable_by(&claim),
            "a lapsed lease is not taken over"
        );
        let takeover = Claim::new("k", now, from_epoch_millis(1_030_500), "mine");
        assert!(
            lapsed.is_claimable_by(&takeover),
            "the default takes it over"
        );
        let mut own = lapsed.clone();
        own.lease_token = Some("mine".into());
        assert!(
            own.is_claimable_by(&claim),
            "its own record, after a lost answer"
        );
        let expired = record(Status::InProgress, 999, Some(1_000_499));
        assert!(!expired.is_abandoned_at(now));
        assert!(expired.is_claimable_by(&claim), "an expired claim is free");
        assert!(record(Status::Completed, 999, None).is_claimable_by(&claim));
        let live = record(Status::InProgress, 2_000, Some(1_000_500));
        assert!(!live.is_abandoned_at(now) && !live.is_claimable_by(&claim));
        let no_lease = record(Status::InProgress, 2_000, None);
        assert!(
            !no_lease.is_abandoned_at(now),
            "held until expiry, not abandoned"
        );
        assert!(!record(Status::Completed, 2_000, None).is_abandoned_at(now));
    }
}

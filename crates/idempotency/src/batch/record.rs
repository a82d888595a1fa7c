//! One record: its handler run with panics caught, its failure named; and a group of
//! records run in order, stopping where a retry could fix the failure.

use super::report::{FailureKind, InvalidBody, PermanentError, RecordFailure, RecordReport};
use crate::clock::Clock;
use crate::error::{BoxError, Error, report};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

/// What the shared machinery needs of one source's record.
pub(super) trait BatchRecord {
    /// The batch item failure's identifier (message id, sequence number), if it has one.
    fn item_id(&self) -> Option<String>;
}

/// How a group of records (a FIFO message group, a stream shard) keeps its order.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupRule {
    /// What a group is, for the reason given to the records not run.
    pub(super) noun: &'static str,
    /// Stop at a permanent failure too, not only at one a retry can fix.
    pub(super) stop_at_permanent: bool,
    /// Wait for a key in progress elsewhere when its lease ends before the batch must
    /// answer, and run the record then, instead of reporting it: a stream's shard is
    /// blocked by it anyway, and every report costs one of its bounded retries.
    pub(super) wait_for_in_progress: bool,
}

/// How many times a record waits for a key in progress elsewhere before it is reported.
const MAX_WAITS: u32 = 3;

/// Time kept after a wait to run the record again before the batch answers.
const TIME_TO_RUN_AFTER_A_WAIT: Duration = Duration::from_millis(200);

impl GroupRule {
    /// Whether the group's later records wait for a redelivery after this failure: a
    /// failure a retry can fix must come again before them, in order; a permanent one
    /// never succeeds, so holding them back would only lose them with it.
    fn stops_at(self, kind: FailureKind) -> bool {
        !kind.is_permanent() || self.stop_at_permanent
    }
}

pub(super) async fn run_group<R, T, E, F, Fut>(
    group: Vec<(usize, R)>,
    handler: &F,
    rule: GroupRule,
    clock: &dyn Clock,
    slots: &Mutex<Vec<Option<RecordReport<T>>>>,
) where
    R: BatchRecord + Clone,
    F: Fn(R) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    let mut stopped_at: Option<String> = None;
    for (index, record) in group {
        let item_id = record.item_id();
        let id_text = item_id.clone().unwrap_or_default();
        let result = match &stopped_at {
            Some(earlier) => {
                let noun = rule.noun;
                let reason = format!(
                    "not run: earlier record {earlier} of its {noun} failed and comes again first"
                );
                warn!(item_id = %id_text, "{reason}");
                Err(RecordFailure {
                    kind: FailureKind::SkippedAfterGroupFailure,
                    reason,
                    error: None,
                })
            }
            None => {
                let span = info_span!("batch_record", item_id = %id_text);
                let mut result = run_record(record.clone(), handler)
                    .instrument(span.clone())
                    .await;
                let mut waits = 0;
                while rule.wait_for_in_progress && waits < MAX_WAITS {
                    let Some(wait) = result.as_ref().err().and_then(|f| wait_for(f, clock)) else {
                        break;
                    };
                    info!(item_id = %id_text, ?wait, "key in progress elsewhere: waiting for its lease, then running the record again");
                    tokio::time::sleep(wait).await;
                    result = run_record(record.clone(), handler)
                        .instrument(span.clone())
                        .await;
                    waits += 1;
                }
                result
            }
        };
        if let Err(failure) = &result
            && stopped_at.is_none()
            && rule.stops_at(failure.kind)
        {
            stopped_at = Some(id_text);
        }
        let report = RecordReport { item_id, result };
        slots.lock().unwrap_or_else(|p| p.into_inner())[index] = Some(report);
    }
}

/// How long to wait before running again a record whose key is in progress elsewhere:
/// until its lease ends, when that is before the batch must answer (less the time to run).
fn wait_for(failure: &RecordFailure, clock: &dyn Clock) -> Option<Duration> {
    if failure.kind != FailureKind::InProgress {
        return None;
    }
    let mut layer: Option<&(dyn std::error::Error + 'static)> = Some(failure.error.as_deref()?);
    let lease_expires = loop {
        let e = layer?;
        if let Some(Error::AlreadyInProgress { lease_expires, .. }) = e.downcast_ref::<Error>() {
            break *lease_expires;
        }
        layer = e.source();
    };
    let claimable = lease_expires + Duration::from_millis(1);
    let answer_by = crate::invocation::current()?.answer_by;
    (claimable + TIME_TO_RUN_AFTER_A_WAIT <= answer_by)
        .then(|| crate::clock::until(clock.now(), claimable))
}

async fn run_record<R, T, E, F, Fut>(record: R, handler: &F) -> Result<T, RecordFailure>
where
    F: Fn(R) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    match AssertUnwindSafe(async move { handler(record).await })
        .catch_unwind()
        .await
    {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => {
            let error: BoxError = err.into();
            let kind = failure_kind(error.as_ref());
            let reason = report(error.as_ref());
            match kind {
                FailureKind::InProgress => info!(%reason, "handed back for redelivery"),
                _ if kind.is_permanent() => {
                    warn!(%reason, ?kind, "record failed for good: no redelivery can fix it, it will reach the dead-letter queue or on-failure destination")
                }
                _ => warn!(%reason, ?kind, "record failed"),
            }
            Err(RecordFailure {
                kind,
                reason,
                error: Some(error),
            })
        }
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            warn!(%reason, "record handler panicked");
            Err(RecordFailure {
                kind: FailureKind::Panicked,
                reason: format!("the handler panicked: {reason}"),
                error: None,
            })
        }
    }
}

/// The kind of the first error in the chain that this crate knows: a handler's error type
/// may wrap an [`Error`], an [`InvalidBody`] or a [`PermanentError`].
fn failure_kind(error: &(dyn std::error::Error + 'static)) -> FailureKind {
    let mut layer = Some(error);
    while let Some(e) = layer {
        if e.is::<PermanentError>() {
            return FailureKind::Permanent;
        }
        if let Some(e) = e.downcast_ref::<Error>() {
            return match e {
                Error::AlreadyInProgress { .. } => FailureKind::InProgress,
                e if e.is_permanent() => FailureKind::Rejected,
                _ => FailureKind::Error,
            };
        }
        if e.is::<InvalidBody>() {
            return FailureKind::MalformedBody;
        }
        layer = e.source();
    }
    FailureKind::Error
}

pub(super) fn unfinished<T>(item_id: Option<String>) -> RecordReport<T> {
    let reason = "not finished before the invocation's deadline; its claim stays until its lease ends, then a redelivery takes it over".to_owned();
    warn!(item_id = item_id.as_deref().unwrap_or_default(), "{reason}");
    RecordReport {
        item_id,
        result: Err(RecordFailure {
            kind: FailureKind::Unfinished,
            reason,
            error: None,
        }),
    }
}

/// Parses `bytes` as JSON into `B`; an error names the record. Bytes that are not UTF-8
/// do not parse either.
pub(super) fn json_from_slice<B: DeserializeOwned>(
    item_id: Option<&str>,
    bytes: &[u8],
) -> Result<B, InvalidBody> {
    serde_json::from_slice(bytes).map_err(|e| InvalidBody {
        item_id: item_id.unwrap_or("<no item id>").to_owned(),
        reason: e.to_string(),
    })
}

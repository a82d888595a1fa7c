//! Waiting for a twin elsewhere: reading its record, with backoff, until it completes, is
//! released, loses its lease, or the caller's patience ends.

use super::stored::StoredResponse;
use crate::clock;
use crate::engine::check_validation;
use crate::error::Error;
use crate::handle::Idempotency;
use crate::key::validation_hash;
use crate::operation::Operation;
use crate::record::Status;
use crate::record::decode;
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tracing::debug;

/// The first pause; each next one doubles, up to [`MAX_PAUSE`].
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two reads.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What the reads found.
#[derive(Debug)]
pub(crate) enum Polled {
    /// The twin completed: its response.
    Completed(StoredResponse),
    /// The record is gone or may be taken over: claim it.
    Claimable,
    /// Still in progress when the wait ended: retry after this long.
    InProgress(Duration),
    /// The record cannot be answered from (another request's key, unreadable data, a
    /// store failure).
    Failed(Error),
}

/// Reads `id`'s record until it settles or `give_up_at` comes. `lease_left` is how long
/// the twin's lease ran when the wait began: no pause goes past its end.
pub(crate) async fn poll(
    idempotency: &Idempotency,
    id: &str,
    payload: &Value,
    operation: &Operation,
    give_up_at: SystemTime,
    lease_left: Duration,
) -> Polled {
    let engine = &idempotency.engine;
    let validation = operation
        .validation
        .as_deref()
        .map(|fields| validation_hash(payload, fields));
    let mut pause = FIRST_PAUSE;
    let mut lease_ends = clock::add(engine.now(), lease_left);
    loop {
        let now = engine.now();
        let left = clock::until(now, give_up_at);
        if left.is_zero() {
            return Polled::InProgress(clock::until(now, lease_ends));
        }
        // Never sleeps past the lease's end: the record may be taken over then.
        let until_lease = clock::until(now, lease_ends).max(Duration::from_millis(1));
        tokio::time::sleep(pause.min(left).min(until_lease)).await;
        pause = (pause * 2).min(MAX_PAUSE);
        let started = std::time::Instant::now();
        let bound = engine.config.store_attempt_timeout;
        let read = tokio::time::timeout(
            bound,
            crate::store::attempt_bound::within(bound, engine.store.get(id)),
        )
        .await;
        let label = match &read {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        engine.store_keys.request("get", label, started.elapsed());
        let record = match read {
            Ok(Ok(record)) => record,
            Ok(Err(e)) => return Polled::Failed(e),
            Err(_) => {
                return Polled::Failed(Error::store(
                    engine.store.name(),
                    true,
                    "a read of the record timed out",
                ));
            }
        };
        let now = engine.now();
        let Some(record) = record.filter(|r| !r.is_claimable_at(now)) else {
            debug!("the twin's record is gone or claimable");
            return Polled::Claimable;
        };
        if let Err(e) = check_validation(id, record.validation.as_deref(), validation.as_deref()) {
            return Polled::Failed(e);
        }
        match record.status {
            Status::Completed => {
                return match decode(id, record.data.as_deref()) {
                    Ok(stored) => Polled::Completed(stored),
                    Err(e) => Polled::Failed(e),
                };
            }
            Status::InProgress => {
                lease_ends = record.in_progress_expiration.unwrap_or(record.expiration);
            }
        }
    }
}

//! The state machine: claim, run, complete or release.

use crate::cache::Cached;
use crate::clock;
use crate::config;
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::operation::Outcome;
use crate::record::{Claim, Record, Status, new_lease_token};
use crate::retry::store_cutoff;
use crate::store::ClaimOutcome;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::SystemTime;
use tracing::{debug, error, info, warn};

impl Idempotency {
    pub(crate) async fn claim<T: DeserializeOwned>(
        &self,
        id: &str,
        validation: Option<String>,
        deadline: Option<SystemTime>,
    ) -> Result<Claimed<T>, Error> {
        let cached = self
            .inner
            .cache
            .as_ref()
            .and_then(|c| c.get(id, self.now()));
        if let Some(cached) = cached {
            check_validation(id, cached.validation.as_deref(), validation.as_deref())?;
            debug!("replayed from the local cache");
            return decode(id, cached.data.as_deref()).map(Claimed::Cached);
        }
        let attempts = self.inner.config.max_claim_attempts;
        for _ in 0..attempts {
            let now = self.now();
            let lease_until = self.lease_until(now, deadline);
            let claim = Claim {
                id: id.to_owned(),
                now,
                // An expiry never ends a live lease.
                expiration: clock::add(now, self.inner.config.expires_after).max(lease_until),
                lease_until,
                lease_token: new_lease_token(),
                validation: validation.clone(),
            };
            let store = &self.inner.store;
            // The same claim (same token) on every attempt: a retry after an answer was
            // lost finds its own record and succeeds.
            let outcome = self
                .retry(
                    store_cutoff(&claim),
                    self.inner.config.max_store_attempts,
                    || store.claim(&claim),
                )
                .await?;
            match outcome {
                ClaimOutcome::Claimed { previous } => {
                    let own = previous
                        .as_ref()
                        .is_some_and(|p| p.lease_token.as_deref() == Some(&claim.lease_token));
                    match &previous {
                        _ if own => {
                            info!(
                                "found this claim's own record: an earlier attempt was applied but its answer was lost"
                            )
                        }
                        Some(old) if old.status == Status::InProgress => {
                            warn!(lease_ended = ?old.in_progress_expiration, "took over an in-progress record whose lease ended (a worker crashed or timed out)");
                        }
                        Some(_) => info!("took over an expired record"),
                        None => debug!("claimed"),
                    }
                    let took_over = previous.is_some() && !own;
                    return Ok(Claimed::Run { claim, took_over });
                }
                ClaimOutcome::Exists(record) => {
                    if record.is_claimable_by(&claim) {
                        // The store saw it live, we see it claimable: it changed between
                        // the write and the read. Claim again.
                        debug!("record changed between write and read; claiming again");
                        continue;
                    }
                    check_validation(id, record.validation.as_deref(), validation.as_deref())?;
                    return self.answer_existing(record);
                }
                ClaimOutcome::Vanished => {
                    debug!("record vanished between write and read; claiming again");
                    continue;
                }
            }
        }
        Err(Error::InconsistentState {
            key: id.to_owned(),
            attempts,
        })
    }

    fn answer_existing<T: DeserializeOwned>(&self, record: Record) -> Result<Claimed<T>, Error> {
        match record.status {
            Status::InProgress => {
                let lease_expires = record.in_progress_expiration.unwrap_or(record.expiration);
                info!(?lease_expires, "already in progress in another worker");
                Err(Error::AlreadyInProgress {
                    key: record.id,
                    lease_expires,
                })
            }
            Status::Completed => {
                let value = decode(&record.id, record.data.as_deref())?;
                info!("replayed the stored result");
                if let Some(cache) = &self.inner.cache {
                    cache.insert(
                        record.id,
                        Cached {
                            data: record.data,
                            validation: record.validation,
                            expiration: record.expiration,
                        },
                    );
                }
                Ok(Claimed::Stored(value))
            }
        }
    }

    pub(crate) async fn finish<T, E>(
        &self,
        claim: &Claim,
        result: Result<T, E>,
        took_over: bool,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize,
        E: fmt::Display,
    {
        let value = match result {
            Ok(value) => value,
            Err(err) => {
                self.release(claim, &format!("the function failed: {err}"))
                    .await;
                return Err(ExecuteError::Function(err));
            }
        };
        let data = match serde_json::to_string(&value) {
            Ok(data) => data,
            Err(source) => {
                self.release(claim, "its result does not serialize").await;
                return Err(ExecuteError::Idempotency(Error::Serialization {
                    key: claim.id.clone(),
                    source,
                }));
            }
        };
        let limits = self.inner.store.limits();
        let size = limits.record_overhead_bytes
            + claim.id.len()
            + data.len()
            + claim.lease_token.len()
            + claim.validation.as_ref().map_or(0, String::len);
        let max = limits.max_record_bytes;
        let too_large = size > max;
        if too_large {
            error!(
                size,
                max,
                "the result is too large to store; marking the record completed without it so the function never runs twice"
            );
        }
        let expiration = clock::add(self.now(), self.inner.config.expires_after);
        let stored = (!too_large).then_some(data.as_str());
        let store = &self.inner.store;
        // The result is already paid for: retry for as long as the lease allows. A retry
        // after a lost answer finds the record completed with its own token and succeeds.
        let completed = self
            .retry(store_cutoff(claim), u32::MAX, || {
                store.complete(claim, stored, expiration)
            })
            .await;
        match completed {
            Ok(()) if too_large => Err(ExecuteError::Idempotency(Error::ResultTooLarge {
                key: claim.id.clone(),
                size,
                max,
            })),
            Ok(()) => {
                debug!("completed");
                if let Some(cache) = &self.inner.cache {
                    cache.insert(
                        claim.id.clone(),
                        Cached {
                            data: Some(data),
                            validation: claim.validation.clone(),
                            expiration,
                        },
                    );
                }
                Ok((
                    value,
                    if took_over {
                        Outcome::TookOver
                    } else {
                        Outcome::Executed
                    },
                ))
            }
            Err(Error::LeaseLost { key }) => {
                warn!("lease lost before completion: another worker took the record over");
                Err(ExecuteError::Idempotency(Error::LeaseLost { key }))
            }
            Err(err) => {
                error!(error = %crate::error::report(&err), lease_until = ?claim.lease_until, "RESULT LOST: the function ran but its result could not be stored; the record stays in progress until its lease ends, and a later delivery will run the function again");
                Ok((value, Outcome::ExecutedUnstored))
            }
        }
    }

    async fn release(&self, claim: &Claim, why: &str) {
        let store = &self.inner.store;
        let released = self
            .retry(
                store_cutoff(claim),
                self.inner.config.max_store_attempts,
                || store.release(claim),
            )
            .await;
        match released {
            Ok(()) => info!(reason = why, "released the claim"),
            Err(err) => {
                warn!(reason = why, error = %crate::error::report(&err), "could not release the claim; it will be taken over when its lease ends")
            }
        }
    }

    pub(crate) fn now(&self) -> SystemTime {
        self.inner.config.clock.now()
    }

    fn lease_until(&self, now: SystemTime, deadline: Option<SystemTime>) -> SystemTime {
        // A lease never outlives its invocation: nothing runs past the deadline, and the
        // store retries stop at the lease's cutoff.
        let until = match (self.inner.config.lease, deadline) {
            (Some(lease), Some(deadline)) => clock::add(now, lease).min(deadline),
            (Some(lease), None) => clock::add(now, lease),
            (None, Some(deadline)) => deadline.min(clock::far_future()),
            (None, None) => clock::add(now, config::DEFAULT_LEASE),
        };
        until.max(clock::add(now, config::MIN_LEASE))
    }
}

/// What a claim found: run the function, or answer with a stored result.
pub(crate) enum Claimed<T> {
    Run { claim: Claim, took_over: bool },
    Stored(T),
    Cached(T),
}

pub(crate) fn check_validation(
    id: &str,
    stored: Option<&str>,
    ours: Option<&str>,
) -> Result<(), Error> {
    match (stored, ours) {
        (Some(stored), Some(ours)) if stored != ours => {
            warn!("payload mismatch: the key was used with a different payload");
            Err(Error::PayloadMismatch { key: id.to_owned() })
        }
        _ => Ok(()),
    }
}

pub(crate) fn decode<T: DeserializeOwned>(id: &str, data: Option<&str>) -> Result<T, Error> {
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

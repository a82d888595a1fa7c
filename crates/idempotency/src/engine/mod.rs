//! The state machine: claim, run, complete or release. [`Engine`] holds what it needs
//! (the store, the settings, the clock, the cache); [`Idempotency`](crate::Idempotency)
//! is its public face.

pub(crate) mod cache;
mod retry;

pub(crate) use retry::MIN_ATTEMPT_TIMEOUT;

use crate::clock::{self, Clock};
use crate::config::Config;
use crate::context::invocation::Invocation;
use crate::context::owner::Owner;
use crate::error::{Error, ExecuteError};
use crate::operation::replay::{self, Replay, ReplayHook};
use crate::operation::{Operation, Outcome};
use crate::record::lease;
use crate::record::{Claim, Record, Status, new_lease_token};
use crate::store::writes::Writes;
use crate::store::{ClaimOutcome, IdempotencyStore};
use cache::{Cached, CompletedCache};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;
use tracing::{debug, error, info, warn};

/// The engine: one per [`Idempotency`](crate::Idempotency) handle, shared by its clones.
pub(crate) struct Engine {
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) config: Config,
    /// Where every time the engine works with comes from.
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) cache: Option<CompletedCache>,
    /// The store's request metrics, their keys built once.
    pub(crate) store_keys: crate::metrics::StoreKeys,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Claims `id` for `op`, or answers from the cache or the store. `invocation` bounds
    /// the lease and the store requests; `op`'s lease, if set, replaces the handle's. An
    /// `owner` claims with its own token and lease (its whole life, past this
    /// invocation): it re-enters its own claim in progress, even at most once.
    pub(crate) async fn claim<T: DeserializeOwned>(
        &self,
        id: &str,
        validation: Option<String>,
        invocation: Option<Invocation>,
        owner: Option<&Owner>,
        op: &Operation,
    ) -> Result<Claimed<T>, Error> {
        let at_most_once = op.at_most_once || self.config.at_most_once;
        let cached = self.cache.as_ref().and_then(|c| c.get(id, self.now()));
        if let Some(cached) = cached {
            check_validation(id, cached.validation.as_deref(), validation.as_deref())?;
            debug!("replayed from the local cache");
            let replay = || Replay {
                id: id.to_owned(),
                expiration: cached.expiration,
                from_cache: true,
            };
            return replay::decode(op.on_replay.as_ref(), id, replay, cached.data.as_deref())
                .map(Claimed::Cached);
        }
        let attempts = self.config.max_claim_attempts;
        let deadline = invocation.map(|i| i.deadline);
        let answer_by = invocation.map(|i| i.answer_by);
        for _ in 0..attempts {
            let now = self.now();
            let lease_until = match owner {
                Some(owner) => lease::lease_until(now, Some(owner.lease), None),
                None => lease::lease_until(now, op.lease.or(self.config.lease), deadline),
            };
            if at_most_once {
                // The claim's own lease: the invocation's remaining time unless fixed,
                // which no setting knows before the invocation does.
                lease::check_at_most_once_expiry(
                    self.config.expires_after,
                    crate::clock::until(now, lease_until),
                )?;
            }
            let claim = Claim {
                id: id.to_owned(),
                now,
                expiration: lease::expiration(now, self.config.expires_after, lease_until),
                lease_until,
                lease_token: owner.map_or_else(new_lease_token, |o| o.token.to_string()),
                validation: validation.clone(),
                at_most_once,
            };
            let cutoff = lease::store_cutoff(&claim, answer_by);
            let store = &self.store;
            // The same claim (same token) on every attempt: a retry after an answer was
            // lost finds its own record and succeeds.
            let mut sent = 0u32;
            let outcome = self
                .retry(cutoff, self.config.max_store_attempts, "claim", || {
                    sent += 1;
                    store.claim(&claim)
                })
                .await;
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(err) => {
                    // An attempt may have been applied (its answer lost, or it timed out)
                    // unless the only one was refused outright: release what may be this
                    // claim's own record, so that it is not left behind to be taken over
                    // after its lease or, at most once, refused as abandoned although
                    // nothing ran. Fenced by the claim's token: it never frees another's.
                    if sent > 1 || err.is_retryable_store_error() {
                        self.release_within(
                            &claim,
                            cutoff,
                            self.config.max_store_attempts,
                            "the claim's answer was lost, and nothing ran",
                        )
                        .await;
                    }
                    return Err(err);
                }
            };
            match outcome {
                ClaimOutcome::Claimed { previous } => {
                    let own = previous
                        .as_ref()
                        .is_some_and(|p| p.lease_token.as_deref() == Some(&claim.lease_token));
                    match &previous {
                        _ if own && owner.is_some() => {
                            debug!("re-entered its owner's claim (a durable execution resumed)")
                        }
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
                    return Ok(Claimed::Run {
                        claim,
                        cutoff,
                        took_over,
                    });
                }
                ClaimOutcome::Exists(record) => {
                    if record.is_claimable_by(&claim) {
                        // The store saw it live, we see it claimable: it changed between
                        // the write and the read. Claim again.
                        debug!("record changed between write and read; claiming again");
                        continue;
                    }
                    check_validation(id, record.validation.as_deref(), validation.as_deref())?;
                    if claim.at_most_once && record.is_abandoned_at(now) {
                        return Err(self.abandoned(record));
                    }
                    return self.answer_existing(record, op.on_replay.as_ref());
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

    /// The error for an abandoned claim an at-most-once claim found: the earlier run's
    /// outcome is unknown, and an operator resolves it.
    fn abandoned(&self, record: Record) -> Error {
        let lease_ended = record.in_progress_expiration.unwrap_or(record.expiration);
        // The claim set its expiry to `expires_after` from its time, unless its lease
        // ended later (then the expiry says nothing of the claim's time).
        let claimed_at = record
            .expiration
            .checked_sub(self.config.expires_after)
            .filter(|_| lease::epoch_secs_after(record.expiration, lease_ended));
        error!(
            ?lease_ended,
            ?claimed_at,
            "CLAIM ABANDONED: an at-most-once operation's earlier run ended without an outcome; not running it again until an operator forgets the record"
        );
        Error::ClaimAbandoned {
            key: record.id,
            lease_ended,
            claimed_at,
        }
    }

    fn answer_existing<T: DeserializeOwned>(
        &self,
        record: Record,
        on_replay: Option<&ReplayHook>,
    ) -> Result<Claimed<T>, Error> {
        match record.status {
            Status::InProgress => {
                let lease_expires = record.in_progress_expiration.unwrap_or(record.expiration);
                info!(?lease_expires, "already in progress in another worker");
                let retry_after = lease::retry_after(
                    self.now(),
                    record.in_progress_expiration,
                    record.expiration,
                );
                Err(Error::AlreadyInProgress {
                    key: record.id,
                    lease_expires,
                    retry_after,
                })
            }
            Status::Completed => {
                let replay = || Replay {
                    id: record.id.clone(),
                    expiration: record.expiration,
                    from_cache: false,
                };
                let value = replay::decode(on_replay, &record.id, replay, record.data.as_deref())?;
                info!("replayed the stored result");
                if let Some(cache) = &self.cache {
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

    /// Stores the function's result for `claim`, or releases the claim when it failed.
    /// Store requests stop at `cutoff`. Writes refused by their own condition are kept in
    /// the record as its answer, unless `refusals_retryable`.
    pub(crate) async fn finish<T, E>(
        &self,
        claim: &Claim,
        cutoff: SystemTime,
        result: Result<(T, Option<Writes>), E>,
        took_over: bool,
        refusals_retryable: bool,
    ) -> Result<(T, Outcome), ExecuteError<E>>
    where
        T: Serialize,
        E: fmt::Display,
    {
        let (value, writes) = match result {
            Ok(answer) => answer,
            Err(err) => {
                self.release(claim, cutoff, &format!("the function failed: {err}"))
                    .await;
                return Err(ExecuteError::Function(err));
            }
        };
        let data = match serde_json::to_string(&value) {
            Ok(data) => data,
            Err(source) => {
                self.release(claim, cutoff, "its result does not serialize")
                    .await;
                return Err(ExecuteError::Idempotency(Error::Serialization {
                    key: claim.id.clone(),
                    source,
                }));
            }
        };
        let size = self.record_size(
            claim.id.len(),
            data.len(),
            claim.lease_token.len(),
            claim.validation.as_ref().map_or(0, String::len),
        );
        let max = self.store.limits().max_record_bytes;
        let too_large = size > max;
        if too_large {
            error!(
                size,
                max,
                "the result is too large to store; marking the record completed without it so the function never runs twice"
            );
        }
        let expiration = clock::add(self.now(), self.config.expires_after);
        let stored = (!too_large).then_some(data.as_str());
        let store = &self.store;
        // The result is already paid for: retry for as long as the lease allows. A retry
        // after a lost answer finds the record completed with its own token and succeeds.
        // With writes, a retry after a lost answer finds the record completed with its own
        // token and applies nothing again: each store's `complete_with` keeps that promise.
        let completed = self
            .retry(cutoff, u32::MAX, "complete", || match &writes {
                Some(writes) => store.complete_with(claim, stored, expiration, writes),
                None => store.complete(claim, stored, expiration),
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
                if let Some(cache) = &self.cache {
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
            Err(Error::WritesRefused {
                key,
                reason,
                retryable: false,
            }) if !refusals_retryable => {
                // Refused by their own condition: no later delivery can change that, and
                // each would pay for the function again. The refusal is the answer.
                let kept = crate::record::refusal_data(&reason);
                let stored = self
                    .retry(cutoff, u32::MAX, "complete", || {
                        store.complete(claim, Some(&kept), expiration)
                    })
                    .await;
                match stored {
                    Ok(()) => {
                        warn!(%reason, "the function's writes were refused by their own condition: the refusal is kept as the record's answer, and later deliveries answer it without running")
                    }
                    // Another worker holds the record now: its outcome is the record's.
                    Err(err @ Error::LeaseLost { .. }) => {
                        warn!(%reason, "the function's writes were refused, and the lease was lost before the refusal was kept");
                        return Err(ExecuteError::Idempotency(err));
                    }
                    Err(err) => {
                        warn!(%reason, error = %crate::error::report(&err), lease_until = ?claim.lease_until, "the function's writes were refused, and the refusal could not be kept in the record: it stays in progress until its lease ends")
                    }
                }
                Err(ExecuteError::Idempotency(Error::WritesRefused {
                    key,
                    reason,
                    retryable: false,
                }))
            }
            Err(Error::WritesRefused { key, reason, .. }) => {
                // The operation or the store says a later delivery may succeed: it runs
                // the function again.
                self.release(claim, cutoff, "its writes were refused").await;
                Err(ExecuteError::Idempotency(Error::WritesRefused {
                    key,
                    reason,
                    retryable: true,
                }))
            }
            Err(err @ (Error::WritesUnsupported { .. } | Error::WritesInvalid { .. })) => {
                // A mistake in the code: nothing was written, and a fixed deployment runs
                // the function.
                self.release(claim, cutoff, "its writes were refused").await;
                Err(ExecuteError::Idempotency(err))
            }
            Err(err) if writes.is_some() => {
                // Its writes are not known to be made: never answer as if they were. The
                // record stays in progress until its lease ends; a later delivery finds it
                // completed (the writes were made) or takes it over and runs again.
                error!(error = %crate::error::report(&err), lease_until = ?claim.lease_until, "the function ran but its writes and result could not be committed: the call fails, and a later delivery finds them committed or takes the claim over after its lease");
                Err(ExecuteError::Idempotency(err))
            }
            Err(err) => {
                error!(error = %crate::error::report(&err), lease_until = ?claim.lease_until, "RESULT LOST: the function ran but its result could not be stored; the record stays in progress until its lease ends, and a delivery after it, if any, runs the function again");
                Ok((value, Outcome::ExecutedUnstored))
            }
        }
    }

    /// Keeps the claim of a function whose outcome is unknown (it made an
    /// [`OutcomeUnknown`](crate::OutcomeUnknown)): neither released nor completed, it
    /// holds its key until its lease ends; then a plain claim takes it over, an
    /// at-most-once one finds it abandoned.
    pub(crate) fn keep(&self, claim: &Claim, why: &str) {
        warn!(
            reason = why,
            lease_until = ?claim.lease_until,
            at_most_once = claim.at_most_once,
            "the function's outcome is unknown: its claim is kept (neither released nor completed) until its lease ends; at most once, a later delivery is then refused until an operator forgets the record"
        );
    }

    /// Releases the claim of a function that panicked.
    pub(crate) async fn release_after_panic(&self, claim: &Claim, cutoff: SystemTime) {
        self.release(claim, cutoff, "the function panicked").await;
    }

    /// Releases the claim of a function that did not take effect. At most once, retried
    /// until `cutoff` as a completion is: a release lost there leaves a claim the next
    /// delivery refuses as abandoned (an operator's work) although nothing took effect.
    /// Otherwise the handle's `max_store_attempts`: a lost release then
    /// costs a wait for the lease, after which the claim is taken over.
    async fn release(&self, claim: &Claim, cutoff: SystemTime, why: &str) {
        let attempts = if claim.at_most_once {
            u32::MAX
        } else {
            self.config.max_store_attempts
        };
        self.release_within(claim, cutoff, attempts, why).await;
    }

    /// Releases `claim` with up to `attempts` attempts, none past `cutoff`.
    async fn release_within(&self, claim: &Claim, cutoff: SystemTime, attempts: u32, why: &str) {
        let store = &self.store;
        let released = self
            .retry(cutoff, attempts, "release", || store.release(claim))
            .await;
        match released {
            Ok(()) => info!(reason = why, "released the claim"),
            // No record holds the claim's token: it was never written (a claim whose
            // answers were lost may not have landed), or it is no longer its own.
            Err(Error::LeaseLost { .. }) => info!(
                reason = why,
                "nothing to release: no record holds the claim's token"
            ),
            Err(err) if claim.at_most_once => {
                warn!(reason = why, error = %crate::error::report(&err), "could not release the claim; at most once, later deliveries are refused as abandoned until an operator forgets the record or it expires")
            }
            Err(err) => {
                warn!(reason = why, error = %crate::error::report(&err), "could not release the claim; a claim after its lease ends may take it over")
            }
        }
    }

    /// The size a record counts against the store's limit, from the lengths of its parts.
    pub(crate) fn record_size(
        &self,
        id: usize,
        data: usize,
        lease_token: usize,
        validation: usize,
    ) -> usize {
        self.store.limits().record_overhead_bytes + id + data + lease_token + validation
    }

    /// The time, from the clock seam.
    pub(crate) fn now(&self) -> SystemTime {
        self.clock.now()
    }
}

/// What a claim found: run the function, or answer with a stored result.
pub(crate) enum Claimed<T> {
    Run {
        claim: Claim,
        /// When store requests for the claim stop.
        cutoff: SystemTime,
        took_over: bool,
    },
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

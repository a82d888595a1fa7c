//! What the checks share: unique ids, the claims they write, and [`Key`], one key's
//! claims with what each must answer.

use crate::error::Error;
use crate::record::{Claim, Record};
use crate::store::{ClaimOutcome, IdempotencyStore};
use std::time::{Duration, SystemTime};

pub(super) fn unique(name: &str) -> String {
    format!("conformance.{}#{:016x}", op_name(name), fastrand::u64(..))
}

/// A unique operation name (no `#`: it ends the stored id's prefix).
pub(super) fn op_name(name: &str) -> String {
    format!("conformance-{name}-{:016x}", fastrand::u64(..))
}

/// A claim on `id` at `now` with a lease of `lease`, token `token`, validation `"v1"` and
/// an expiration an hour after `now`: what the contract's tests write, for a backend's
/// own tests.
pub fn claim_at(id: &str, now: SystemTime, lease: Duration, token: &str) -> Claim {
    Claim {
        id: id.to_owned(),
        now,
        expiration: now + Duration::from_secs(3600),
        lease_until: now + lease,
        lease_token: token.to_owned(),
        validation: Some("v1".into()),
        at_most_once: false,
    }
}

/// The claim a completion or release names: its id and token (the rest is unused).
pub(super) fn lease(id: &str, token: &str) -> Claim {
    claim_at(id, SystemTime::UNIX_EPOCH, Duration::ZERO, token)
}

pub(super) fn now_ms() -> SystemTime {
    // Whole milliseconds, the precision stores keep.
    crate::record::from_epoch_millis(crate::record::epoch_millis(SystemTime::now()))
}

/// One key of a check: its claims, and what each must answer.
pub(super) struct Key<'a> {
    pub(super) store: &'a dyn IdempotencyStore,
    pub(super) id: String,
}

impl<'a> Key<'a> {
    /// A fresh key named after `name`.
    pub(super) fn new(store: &'a dyn IdempotencyStore, name: &str) -> Self {
        Self {
            store,
            id: unique(name),
        }
    }

    /// Claims the key at `at` with a lease of `lease` and token `token`.
    pub(super) async fn claim(&self, at: SystemTime, lease: Duration, token: &str) -> ClaimOutcome {
        self.store
            .claim(&claim_at(&self.id, at, lease, token))
            .await
            .unwrap_or_else(|e| panic!("the claim with {token} must succeed, got {e:?}"))
    }

    /// Claims, and panics with `rule` unless the claim was written; returns `previous`.
    pub(super) async fn claimed(
        &self,
        at: SystemTime,
        lease: Duration,
        token: &str,
        rule: &str,
    ) -> Option<Record> {
        match self.claim(at, lease, token).await {
            ClaimOutcome::Claimed { previous } => previous,
            other => panic!("{rule}, got {other:?}"),
        }
    }

    /// Claims, and panics with `rule` unless a live record refused it; returns that record.
    pub(super) async fn refused(
        &self,
        at: SystemTime,
        lease: Duration,
        token: &str,
        rule: &str,
    ) -> Record {
        match self.claim(at, lease, token).await {
            ClaimOutcome::Exists(record) => record,
            other => panic!("{rule}, got {other:?}"),
        }
    }

    /// Completes the claim of `token` with `data`, expiring at `expiration`.
    pub(super) async fn complete(
        &self,
        token: &str,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        self.store
            .complete(&lease(&self.id, token), data, expiration)
            .await
    }

    /// Releases the claim of `token`.
    pub(super) async fn release(&self, token: &str) -> Result<(), Error> {
        self.store.release(&lease(&self.id, token)).await
    }

    /// The stored record.
    pub(super) async fn get(&self) -> Option<Record> {
        self.store.get(&self.id).await.expect("get")
    }
}

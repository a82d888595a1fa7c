//! The store's four requests, one statement each (the engine retries them).

use super::PostgresStore;
use super::id::stored_id;
use crate::error::Error;
use crate::record::{Claim, Record, epoch_millis, epoch_secs};
use crate::store::ClaimOutcome;
use std::time::SystemTime;
use tokio_postgres::types::Type;

impl PostgresStore {
    pub(super) async fn send_claim(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let (expiration, lease_until) = (secs(claim.expiration), millis(claim.lease_until));
        let (now_s, now_ms) = (secs(claim.now), millis(claim.now));
        let rows = self
            .query(
                if claim.at_most_once {
                    &self.inner.sql.claim_at_most_once
                } else {
                    &self.inner.sql.claim
                },
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&expiration, Type::INT8),
                    (&lease_until, Type::INT8),
                    (&claim.validation, Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                    (&now_s, Type::INT8),
                    (&now_ms, Type::INT8),
                ],
            )
            .await?;
        self.claim_outcome(&rows, claim)
    }

    pub(super) async fn send_completion(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let expiration = secs(expiration);
        let rows = self
            .query(
                &self.inner.sql.complete,
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                    (&data, Type::TEXT),
                    (&expiration, Type::INT8),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::LeaseLost {
                key: claim.id.clone(),
            });
        }
        Ok(())
    }

    pub(super) async fn send_release(&self, claim: &Claim) -> Result<(), Error> {
        let rows = self
            .query(
                &self.inner.sql.release,
                &[
                    (&stored_id(&claim.id), Type::TEXT),
                    (&claim.lease_token, Type::TEXT),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::LeaseLost {
                key: claim.id.clone(),
            });
        }
        Ok(())
    }

    pub(super) async fn read_record(&self, id: &str) -> Result<Option<Record>, Error> {
        let rows = self
            .query(&self.inner.sql.get, &[(&stored_id(id), Type::TEXT)])
            .await?;
        rows.first().map(|row| self.parse(row, 0, id)).transpose()
    }
}

/// Epoch seconds as a `bigint`.
pub(super) fn secs(t: SystemTime) -> i64 {
    i64::try_from(epoch_secs(t)).unwrap_or(i64::MAX)
}

/// Epoch milliseconds as a `bigint`.
pub(super) fn millis(t: SystemTime) -> i64 {
    i64::try_from(epoch_millis(t)).unwrap_or(i64::MAX)
}

//! The store's requests, one statement each (the engine retries them).

use super::PostgresStore;
use super::id::{listed_id, stored_id, stored_prefixes};
use crate::error::Error;
use crate::record::{Claim, Record, epoch_millis, epoch_secs};
use crate::store::{ClaimOutcome, Forgotten, ListRequest, RecordPage};
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

    pub(super) async fn send_forget(&self, read: &Record) -> Result<Forgotten, Error> {
        let (status, expiration) = (read.status.as_str(), secs(read.expiration));
        let lease_end = read.in_progress_expiration.map(millis);
        let rows = self
            .query(
                &self.inner.sql.forget,
                &[
                    (&stored_id(&read.id), Type::TEXT),
                    (&status, Type::TEXT),
                    (&expiration, Type::INT8),
                    (&lease_end, Type::INT8),
                    (&read.lease_token, Type::TEXT),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| self.malformed("forget returned no row"))?;
        let deleted: bool = row.try_get(0).map_err(|e| self.pg_error(e))?;
        let existed: bool = row.try_get(1).map_err(|e| self.pg_error(e))?;
        Ok(match (deleted, existed) {
            (true, _) => Forgotten::Deleted,
            (false, true) => Forgotten::Changed,
            (false, false) => Forgotten::Absent,
        })
    }

    /// In id order; the cursor is the page's last stored id.
    pub(super) async fn send_list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        // Ids with a NUL are stored escaped: under the prefix's escaped form.
        let (plain, escaped) = stored_prefixes(&request.prefix);
        let rows = self
            .query(
                &self.inner.sql.list,
                &[
                    (&plain, Type::TEXT),
                    (&request.cursor, Type::TEXT),
                    (&limit, Type::INT8),
                    (&escaped, Type::TEXT),
                ],
            )
            .await?;
        let mut page = RecordPage::new(Vec::with_capacity(rows.len()), None);
        page.examined = rows.len();
        let mut last = None;
        for row in &rows {
            let stored: String = row.try_get(0).map_err(|e| self.pg_error(e))?;
            match listed_id(stored.clone()).map(|id| self.parse(row, 0, &id)) {
                Some(Ok(record)) => page.records.push(record),
                Some(Err(err)) => page
                    .unreadable
                    .push((stored.clone(), crate::error::report(&err))),
                None => page.unreadable.push((
                    stored.clone(),
                    "stored hashed (an id over 2048 bytes): read it by its payload".into(),
                )),
            }
            last = Some(stored);
        }
        // A full page may have more after it: go on from its last stored id.
        page.next = last.filter(|_| rows.len() >= request.limit);
        Ok(page)
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

//! Expired rows: PostgreSQL has no TTL, so they are deleted on a schedule. They never
//! change an answer (an expired row is claimable); they only take space.

use super::PostgresStore;
use super::requests::{millis, secs};
use crate::error::Error;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::Type;

/// How far [`PostgresStore::purge_expired`] stays behind its own clock.
pub const PURGE_GRACE: Duration = Duration::from_secs(60);

impl PostgresStore {
    /// Deletes at most `limit` expired rows (expired by whole seconds, and not in progress
    /// with a live lease: exactly the rows a claim could take over and no live record),
    /// skipping rows another transaction holds, and returns how many it deleted. Call it
    /// until it returns less than `limit`, on a schedule: expired rows never change an
    /// answer, they only take space.
    ///
    /// Records are judged by the clock of the machine that calls it, minus
    /// [`PURGE_GRACE`], so a purger whose clock runs somewhat ahead of the workers' never
    /// deletes a record that still counts for them.
    ///
    /// With `pg_cron`, the same `DELETE` (seconds and milliseconds truncated, as the
    /// library reads them, and the same grace):
    #[doc = concat!(
        "```sql\nSELECT cron.schedule('purge-idempotency', '*/15 * * * *', $$\n",
        include_str!("pg_cron_purge.sql"),
        "$$);\n```"
    )]
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, Error> {
        let now = SystemTime::now()
            .checked_sub(PURGE_GRACE)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.purge_expired_at(now, limit).await
    }

    /// [`purge_expired`](Self::purge_expired) as of `now` exactly (no grace): the rows a
    /// claim at `now` could take over.
    pub async fn purge_expired_at(&self, now: SystemTime, limit: u32) -> Result<u64, Error> {
        let (now_s, now_ms, limit) = (secs(now), millis(now), i64::from(limit));
        let rows = self
            .query(
                &self.inner.sql.purge,
                &[
                    (&now_s, Type::INT8),
                    (&now_ms, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        let deleted: i64 = rows
            .first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(|e| self.pg_error(e))?
            .unwrap_or(0);
        Ok(u64::try_from(deleted).unwrap_or(0))
    }
}

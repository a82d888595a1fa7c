//! Rows into records: a row of [`COLUMNS`](super::sql::COLUMNS), and the claim's rows
//! into its outcome.

use super::PostgresStore;
use crate::error::Error;
use crate::record::{Claim, Record, Status, UnknownStatus, from_epoch_millis, from_epoch_secs};
use crate::store::ClaimOutcome;
use tokio_postgres::Row;

impl PostgresStore {
    /// The record `id` in a row of [`COLUMNS`](super::sql::COLUMNS) starting at column
    /// `at`. Its id is the one asked for (a hashed id is not invertible; the row was found
    /// by `id`'s stored form).
    pub(super) fn parse(&self, row: &Row, at: usize, id: &str) -> Result<Record, Error> {
        let get_err = |e: tokio_postgres::Error| self.malformed(e);
        let id = id.to_owned();
        let status: String = row.try_get(at + 1).map_err(get_err)?;
        let status: Status = status
            .parse()
            .map_err(|e: UnknownStatus| self.malformed(format_args!("{id:?}: {e}")))?;
        let expiration: i64 = row.try_get(at + 2).map_err(get_err)?;
        let lease: Option<i64> = row.try_get(at + 3).map_err(get_err)?;
        let non_negative = |name: &str, n: i64| {
            u64::try_from(n).map_err(|_| self.malformed(format_args!("{id:?}: {name} is {n}")))
        };
        Ok(Record {
            status,
            expiration: from_epoch_secs(non_negative("expiration", expiration)?),
            in_progress_expiration: lease
                .map(|ms| non_negative("in_progress_expiration", ms).map(from_epoch_millis))
                .transpose()?,
            data: row.try_get(at + 4).map_err(get_err)?,
            validation: row.try_get(at + 5).map_err(get_err)?,
            lease_token: row.try_get(at + 6).map_err(get_err)?,
            id,
        })
    }

    /// The outcome of `claim` from the claim statement's rows (`(written, <COLUMNS>)`: the
    /// upsert's row and the old one).
    pub(super) fn claim_outcome(&self, rows: &[Row], claim: &Claim) -> Result<ClaimOutcome, Error> {
        let (mut written, mut old) = (None, None);
        for row in rows {
            let is_written: bool = row.try_get(0).map_err(|e| self.pg_error(e))?;
            if is_written {
                // Our own claim, parsed from what we wrote: never malformed.
                written = Some(row);
            } else {
                old = Some(row);
            }
        }
        let ours = |row: &Row| -> Result<bool, Error> {
            let status: String = row.try_get(2).map_err(|e| self.pg_error(e))?;
            let token: Option<String> = row.try_get(7).map_err(|e| self.pg_error(e))?;
            Ok(status == Status::InProgress.as_str()
                && token.as_deref() == Some(claim.lease_token.as_str()))
        };
        match (written, old) {
            (Some(row), old) if ours(row)? => {
                // The claim is written: an old row we cannot read must not turn it into
                // an error that holds the key until the lease ends.
                let previous = old.and_then(|old| match self.parse(old, 1, &claim.id) {
                    Ok(previous) => Some(previous),
                    Err(err) => {
                        tracing::warn!(error = %crate::error::report(&err), "claimed over a row that is not a valid idempotency record");
                        None
                    }
                });
                Ok(ClaimOutcome::Claimed { previous })
            }
            // A row committed after the statement's snapshot, unchanged: the live record.
            (Some(row), _) => Ok(ClaimOutcome::Exists(self.parse(row, 1, &claim.id)?)),
            (None, Some(old)) => Ok(ClaimOutcome::Exists(self.parse(old, 1, &claim.id)?)),
            // Not reachable (the upsert always writes or finds a row); retry if it is.
            (None, None) => Ok(ClaimOutcome::Vanished),
        }
    }
}

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

    /// In id order; the cursor is the page's last stored id. On a table whose ids sort by
    /// bytes (the DDL's `COLLATE "C"`), a page reads a range of the primary key: the rows
    /// it returns and, when the prefix's escaped ids and plain ones both go on, up to a
    /// page more; otherwise (a table made before with a language's collation, where ids
    /// under a prefix need not be neighbours) it reads a page of rows in the table's order
    /// and keeps those under the prefix. `examined` is the rows the statement read.
    pub(super) async fn send_list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        // Ids with a NUL are stored escaped: under the prefix's escaped form.
        let (plain, escaped) = stored_prefixes(&request.prefix);
        // The first id after the cursor in byte order (`text` holds no NUL).
        let after = request.cursor.as_ref().map(|c| format!("{c}\u{1}"));
        let from = |start: &str| match &after {
            Some(after) if after.as_str() > start => after.clone(),
            _ => start.to_owned(),
        };
        let ranges = match (plain, successor(&escaped)) {
            (Some(_), _) if request.prefix.is_empty() => Ranges::From,
            (Some(plain), Some(escaped_end)) => match successor(plain) {
                Some(plain_end) => Ranges::Two([
                    (escaped.clone(), escaped_end),
                    (plain.to_owned(), plain_end),
                ]),
                None => Ranges::None,
            },
            // No plain id can start with the prefix: an empty range for them.
            (None, Some(escaped_end)) => Ranges::Two([
                (escaped.clone(), escaped_end),
                (String::new(), String::new()),
            ]),
            (_, None) => Ranges::None,
        };
        let byte_ordered = match self.inner.byte_ordered_ids.get() {
            Some(ordered) => *ordered,
            None => {
                self.check_table().await?;
                self.inner.byte_ordered_ids.get().copied().unwrap_or(false)
            }
        };
        let sql = &self.inner.sql;
        let (mut rows, examined) = match (byte_ordered, ranges) {
            (true, Ranges::From) => {
                let start = from("");
                let rows = self
                    .query(
                        &sql.list_from,
                        &[(&start, Type::TEXT), (&limit, Type::INT8)],
                    )
                    .await?;
                let read = rows.len();
                (rows, read)
            }
            (true, Ranges::Two([(a, a_end), (b, b_end)])) => {
                let (a, b) = (from(&a), from(&b));
                let rows = self
                    .query(
                        &sql.list,
                        &[
                            (&a, Type::TEXT),
                            (&a_end, Type::TEXT),
                            (&b, Type::TEXT),
                            (&b_end, Type::TEXT),
                            (&limit, Type::INT8),
                        ],
                    )
                    .await?;
                let read = rows.len();
                (rows, read)
            }
            _ => {
                let start = request.cursor.clone().unwrap_or_default();
                let rows = self
                    .query(
                        &sql.list_scan,
                        &[
                            (&start, Type::TEXT),
                            (&request.cursor, Type::TEXT),
                            (&limit, Type::INT8),
                        ],
                    )
                    .await?;
                let scanned = rows.len();
                // Its last row goes on the cursor even when the prefix leaves it out.
                let last: Option<String> = match rows.last() {
                    Some(row) => Some(row.try_get(0).map_err(|e| self.pg_error(e))?),
                    None => None,
                };
                let mut kept = Vec::with_capacity(rows.len());
                for row in rows {
                    let id: &str = row.try_get(0).map_err(|e| self.pg_error(e))?;
                    if plain.is_some_and(|p| id.starts_with(p)) || id.starts_with(&escaped) {
                        kept.push(row);
                    }
                }
                // The cursor's own row, read and passed over.
                let examined = scanned + usize::from(request.cursor.is_some());
                let next = last.filter(|_| scanned >= request.limit);
                let mut page = self.page(&kept, next)?;
                page.examined = examined.max(page.records.len() + page.unreadable.len());
                return Ok(page);
            }
        };
        // In byte order (the two ranges each come sorted, the escaped ids first), a page.
        let mut keyed = Vec::with_capacity(rows.len());
        for row in rows.drain(..) {
            let id: String = row.try_get(0).map_err(|e| self.pg_error(e))?;
            keyed.push((id, row));
        }
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        keyed.truncate(request.limit);
        let next = (keyed.len() >= request.limit)
            .then(|| keyed.last().map(|(id, _)| id.clone()))
            .flatten();
        let rows: Vec<_> = keyed.into_iter().map(|(_, row)| row).collect();
        let mut page = self.page(&rows, next)?;
        page.examined = examined;
        Ok(page)
    }

    /// The page of `rows` ([`COLUMNS`](super::sql::COLUMNS) each), going on at `next`.
    fn page(
        &self,
        rows: &[tokio_postgres::Row],
        next: Option<String>,
    ) -> Result<RecordPage, Error> {
        let mut page = RecordPage::new(Vec::with_capacity(rows.len()), next);
        for row in rows {
            let stored: String = row.try_get(0).map_err(|e| self.pg_error(e))?;
            match listed_id(stored.clone()).map(|id| self.parse(row, 0, &id)) {
                Some(Ok(record)) => page.records.push(record),
                Some(Err(err)) => page.unreadable.push((stored, crate::error::report(&err))),
                None => page.unreadable.push((
                    stored,
                    "stored hashed (an id over 2048 bytes): read it by its payload".into(),
                )),
            }
        }
        page.examined = rows.len();
        Ok(page)
    }
}

/// Which ranges of the primary key hold a listing's ids, on a table whose ids sort by
/// bytes.
enum Ranges {
    /// Every id: no prefix.
    From,
    /// The escaped ids' range, then the plain ones': `[start, end)` each.
    Two([(String, String); 2]),
    /// None that can be written (a prefix of U+10FFFF alone has no end): read in order.
    None,
}

/// The least string greater than every string starting with `prefix`, in byte (code
/// point) order: its last character that is not U+10FFFF, incremented, the rest cut off.
fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=0x10FFFF).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Epoch seconds as a `bigint`.
pub(super) fn secs(t: SystemTime) -> i64 {
    i64::try_from(epoch_secs(t)).unwrap_or(i64::MAX)
}

/// Epoch milliseconds as a `bigint`.
pub(super) fn millis(t: SystemTime) -> i64 {
    i64::try_from(epoch_millis(t)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::successor;

    #[test]
    fn a_prefix_successor_bounds_every_string_under_it() {
        assert_eq!(successor("f.op#").as_deref(), Some("f.op$"));
        assert_eq!(successor("é").as_deref(), Some("ê"));
        assert_eq!(successor("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(successor("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(successor("\u{10FFFF}"), None);
        assert_eq!(successor(""), None);
        for (prefix, under) in [
            ("f.op#", "f.op#\u{10FFFF}\u{10FFFF}"),
            ("a\u{7F}", "a\u{7F}z"),
        ] {
            let end = successor(prefix).unwrap();
            assert!(under.starts_with(prefix) && under < end.as_str() && prefix < end.as_str());
        }
    }
}

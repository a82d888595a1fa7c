//! Every statement the store sends, built once per table by [`Statements::new`], and the
//! `pg_cron` purge its docs give (`pg_cron_purge.sql`, run as documented by
//! `tests/postgres/purge.rs`).
//!
//! Parameters are numbered as the statements' docs say; the store sends them typed, as
//! unnamed statements (one round trip, nothing prepared).

/// The columns of a record, in the order every statement returns them.
pub(super) const COLUMNS: &str =
    "id, status, expiration, in_progress_expiration, data, validation, lease_token";

/// The columns a claim writes (all but `id`), each `CASE`d on [`CLAIMABLE`].
const CLAIM_SETS: [&str; 6] = [
    "status",
    "expiration",
    "in_progress_expiration",
    "data",
    "validation",
    "lease_token",
];

/// `Record::is_claimable_by` over the stored row `r`, for the claim's `$5` (lease token),
/// `$6` (now, epoch s) and `$7` (now, epoch ms); NULL (no lease) is false.
const CLAIMABLE: &str = "COALESCE(\
    (r.status = 'INPROGRESS' AND r.in_progress_expiration < $7) \
    OR (r.status = 'INPROGRESS' AND r.lease_token = $5) \
    OR (r.expiration < $6 AND NOT (r.status = 'INPROGRESS' AND r.in_progress_expiration IS NOT NULL)), \
    false)";

/// [`CLAIMABLE`] for an at-most-once claim (`Claim::at_most_once`): a lapsed lease frees
/// the key only once the record has expired too. The same parameters, so the statement
/// is otherwise the same.
const CLAIMABLE_AT_MOST_ONCE: &str = "COALESCE(\
    (r.status = 'INPROGRESS' AND r.in_progress_expiration < $7 AND r.expiration < $6) \
    OR (r.status = 'INPROGRESS' AND r.lease_token = $5) \
    OR (r.expiration < $6 AND NOT (r.status = 'INPROGRESS' AND r.in_progress_expiration IS NOT NULL)), \
    false)";

/// Expired, and claimable: not in progress with a live lease. `$1` now (epoch s), `$2`
/// now (epoch ms).
const PURGEABLE: &str = "expiration < $1 \
    AND (status <> 'INPROGRESS' OR in_progress_expiration IS NULL OR in_progress_expiration < $2)";

/// The `DELETE` `PostgresStore::purge_expired`'s docs give for `pg_cron`: the same rows
/// as [`PURGEABLE`], judged by the server's `now()` truncated to seconds and milliseconds
/// (as the library reads them) minus `PURGE_GRACE`, on the table `idempotency`.
#[cfg(test)]
const PG_CRON_PURGE: &str = include_str!("pg_cron_purge.sql");

/// The statements for one table.
pub(super) struct Statements {
    /// The claim (the module docs say why it is exact under races). Rows: `(written, <COLUMNS>)`.
    pub(super) claim: String,
    /// The claim of an at-most-once claim: the same, on [`CLAIMABLE_AT_MOST_ONCE`].
    pub(super) claim_at_most_once: String,
    /// `$1` id, `$2` lease token, `$3` data, `$4` expiration (epoch s). One row if the
    /// lease held.
    pub(super) complete: String,
    /// `$1` id, `$2` lease token. One row if the lease held.
    pub(super) release: String,
    /// `$1` id. Rows: [`COLUMNS`].
    pub(super) get: String,
    /// `$1` id. Rows: `(status, lease_token)`, the row locked until the transaction ends
    /// (the completion with the function's writes).
    pub(super) lock: String,
    /// `$1` now (epoch s), `$2` now (epoch ms), `$3` limit. One row: the count deleted.
    pub(super) purge: String,
    /// `$1` id, `$2` status, `$3` expiration (epoch s), `$4` lease end (epoch ms or
    /// NULL), `$5` lease token (or NULL): deletes the row if it is still as read. One row:
    /// `(deleted, existed)`; the `EXISTS` sees the table as it was before the delete.
    pub(super) forget: String,
    /// A listing under a prefix on a table whose ids sort by bytes: two ranges of the
    /// primary key, each read up to the limit (the ids stored escaped, then the plain
    /// ones), `$1` ≤ id < `$2` and `$3` ≤ id < `$4`, `$5` limit. Rows: [`COLUMNS`], every
    /// row the statement read.
    pub(super) list: String,
    /// A listing of every id from `$1` on (`$1` ≤ id), `$2` limit, on a table whose ids
    /// sort by bytes. Rows: [`COLUMNS`], in id order.
    pub(super) list_from: String,
    /// A listing on a table whose ids do not sort by bytes (a prefix is then no range):
    /// the rows in the table's order after `$2` (or from the start: `$1` `''` and `$2`
    /// NULL; else both the last id of the page before), `$3` limit. Rows: [`COLUMNS`],
    /// the ones under the prefix to be kept by the caller.
    pub(super) list_scan: String,
}

impl Statements {
    /// Whether `sql` is one of these statements itself (the same text at the same
    /// address), not a copy.
    pub(super) fn owns(&self, sql: &str) -> bool {
        let Self {
            claim,
            claim_at_most_once,
            complete,
            release,
            get,
            lock,
            purge,
            forget,
            list,
            list_from,
            list_scan,
        } = self;
        [
            claim,
            claim_at_most_once,
            complete,
            release,
            get,
            lock,
            purge,
            forget,
            list,
            list_from,
            list_scan,
        ]
        .iter()
        .any(|own| std::ptr::eq(own.as_str(), sql))
    }

    /// The statements on the table `t`, quoted.
    pub(super) fn new(t: &str) -> Self {
        Self {
            claim: claim(t, CLAIMABLE),
            claim_at_most_once: claim(t, CLAIMABLE_AT_MOST_ONCE),
            complete: format!(
                "UPDATE {t} SET status = 'COMPLETED', data = $3, expiration = $4 \
                 WHERE id = $1 AND lease_token = $2 RETURNING 1"
            ),
            release: format!("DELETE FROM {t} WHERE id = $1 AND lease_token = $2 RETURNING 1"),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1"),
            lock: format!("SELECT status, lease_token FROM {t} WHERE id = $1 FOR UPDATE"),
            purge: format!(
                "WITH purged AS (\n    \
                    DELETE FROM {t} WHERE {PURGEABLE} AND id IN (\n        \
                        SELECT id FROM {t} WHERE {PURGEABLE} LIMIT $3 FOR UPDATE SKIP LOCKED)\n    \
                    RETURNING 1\n\
                )\n\
                SELECT count(*) FROM purged"
            ),
            forget: format!(
                "WITH gone AS (\n    \
                    DELETE FROM {t} WHERE id = $1 AND status = $2 AND expiration = $3 \
                    AND in_progress_expiration IS NOT DISTINCT FROM $4 \
                    AND lease_token IS NOT DISTINCT FROM $5 RETURNING 1\n\
                )\n\
                SELECT EXISTS (SELECT 1 FROM gone), EXISTS (SELECT 1 FROM {t} WHERE id = $1)"
            ),
            list: format!(
                "(SELECT {COLUMNS} FROM {t} WHERE id >= $1 AND id < $2 ORDER BY id LIMIT $5)\n\
                 UNION ALL\n\
                 (SELECT {COLUMNS} FROM {t} WHERE id >= $3 AND id < $4 ORDER BY id LIMIT $5)"
            ),
            list_from: format!("SELECT {COLUMNS} FROM {t} WHERE id >= $1 ORDER BY id LIMIT $2"),
            list_scan: format!(
                "SELECT {COLUMNS} FROM {t} WHERE id >= $1 AND id IS DISTINCT FROM $2 \
                 ORDER BY id LIMIT $3"
            ),
        }
    }
}

/// The claim statement on `t`: `$1` id, `$2` expiration (epoch s), `$3` lease end (epoch
/// ms), `$4` validation, `$5` lease token, `$6` now (epoch s), `$7` now (epoch ms);
/// `claimable` is [`CLAIMABLE`] or [`CLAIMABLE_AT_MOST_ONCE`].
fn claim(t: &str, claimable: &str) -> String {
    let set = |column: &str| {
        format!("{column} = CASE WHEN {claimable} THEN excluded.{column} ELSE r.{column} END")
    };
    let sets = CLAIM_SETS.map(set).join(",\n        ");
    let returning = COLUMNS
        .split(", ")
        .map(|c| format!("r.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH old AS (\n    \
            SELECT {COLUMNS} FROM {t} WHERE id = $1 FOR UPDATE\n\
        ), claimed AS (\n    \
            INSERT INTO {t} AS r ({COLUMNS})\n    \
            SELECT $1, 'INPROGRESS', $2, $3, NULL, $4, $5 FROM (SELECT count(*) FROM old) AS after_old\n    \
            ON CONFLICT (id) DO UPDATE SET\n        {sets}\n    \
            WHERE {claimable} OR NOT EXISTS (SELECT 1 FROM old)\n    \
            RETURNING {returning}\n\
        )\n\
        SELECT true AS written, {COLUMNS} FROM claimed\n\
        UNION ALL\n\
        SELECT false, {COLUMNS} FROM old"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::PURGE_GRACE;

    #[test]
    fn the_pg_cron_purge_keeps_the_grace() {
        let grace = PURGE_GRACE.as_secs();
        assert!(
            PG_CRON_PURGE.contains(&format!("::bigint - {grace}\n")),
            "{PG_CRON_PURGE}"
        );
        assert!(
            PG_CRON_PURGE.contains(&format!("* 1000)::bigint - {})", grace * 1000)),
            "{PG_CRON_PURGE}"
        );
        assert!(PG_CRON_PURGE.starts_with("  DELETE FROM idempotency\n"));
        // Joined into one line by the test that runs it: no `--` comment may cut it.
        assert!(!PG_CRON_PURGE.contains("--"));
    }

    #[test]
    fn every_claim_column_but_the_id_is_guarded() {
        let written: Vec<_> = COLUMNS.split(", ").skip(1).collect();
        assert_eq!(written, CLAIM_SETS);
        let claim = Statements::new("\"t\"").claim;
        for column in CLAIM_SETS {
            assert!(
                claim.contains(&format!("{column} = CASE WHEN COALESCE(")),
                "{claim}"
            );
        }
    }
}

//! Purging the PostgreSQL store's expired rows: `purge_expired` and the documented
//! pg_cron statement keep every live record.

use super::*;
use lambda_idempotency::store::from_epoch_millis;

#[tokio::test]
async fn purge_deletes_only_expired_rows_in_batches() {
    let table = TestTable::new("purge").await;
    let store = table.store();
    let now = SystemTime::now();
    let (s, ms) = (epoch_secs(now) as i64, epoch_millis(now) as i64);
    let rows: [(&str, &str, i64, Option<i64>); 7] = [
        ("done-expired-1", "COMPLETED", s - 10, None),
        ("done-expired-2", "COMPLETED", s - 1, Some(ms - 5_000)),
        ("done-live", "COMPLETED", s + 100, None),
        ("done-this-second", "COMPLETED", s, None),
        (
            "running-expired-live-lease",
            "INPROGRESS",
            s - 10,
            Some(ms + 60_000),
        ),
        (
            "running-expired-lease-over",
            "INPROGRESS",
            s - 10,
            Some(ms - 1),
        ),
        ("running-expired-no-lease", "INPROGRESS", s - 10, None),
    ];
    for (id, status, exp, lease) in rows {
        table
            .admin
            .execute(
                &format!(
                    "INSERT INTO {} (id, status, expiration, in_progress_expiration, lease_token) \
                     VALUES ($1, $2, $3, $4, 'tok')",
                    table.quoted
                ),
                &[&id, &status, &exp, &lease],
            )
            .await
            .unwrap();
    }
    assert_eq!(
        store.purge_expired_at(now, 0).await.unwrap(),
        0,
        "a limit of 0 deletes nothing"
    );
    // Four expired and claimable: two per batch.
    assert_eq!(store.purge_expired_at(now, 2).await.unwrap(), 2);
    assert_eq!(store.purge_expired_at(now, 2).await.unwrap(), 2);
    assert_eq!(store.purge_expired_at(now, 2).await.unwrap(), 0);
    let mut left: Vec<String> = table
        .admin
        .query(&format!("SELECT id FROM {}", table.quoted), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "done-live",
            "done-this-second",
            "running-expired-live-lease"
        ]
    );
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
    assert_eq!(store.purge_expired(u32::MAX).await.unwrap(), 0);
    table.drop_table().await;
}

/// The pg_cron `DELETE` in `purge_expired`'s docs truncates seconds and milliseconds as
/// `is_claimable_at` does: at 1000.6 s it keeps a record expiring at 1000 (live by whole
/// seconds).
#[tokio::test]
async fn the_documented_pg_cron_purge_keeps_live_records() {
    let table = TestTable::new("cron").await;
    let (store, admin) = (table.store(), &table.admin);
    // A moment with a fraction above one half, in seconds and in milliseconds.
    let at_ms: u64 = 1_900_000_000_000 + 600; // .600 s
    let at = from_epoch_millis(at_ms) + Duration::from_micros(700); // .6007 s: X.7 ms
    let completed_id = "completed-live";
    let leased_id = "leased-live";
    // Completed record expiring in the current second: live at `at` by whole seconds.
    let mut c = claim(completed_id, at, "tc");
    c.expiration = from_epoch_secs(epoch_secs(at));
    c.lease_until = at + Duration::from_secs(1);
    store.claim(&c).await.unwrap();
    store
        .complete(&c, Some("1"), from_epoch_secs(epoch_secs(at)))
        .await
        .unwrap();
    // In progress, expired, the lease ending in this very millisecond: live.
    let mut l = claim(leased_id, at - Duration::from_secs(10), "tl");
    l.expiration = from_epoch_secs(epoch_secs(at) - 5);
    l.lease_until = from_epoch_millis(epoch_millis(at));
    store.claim(&l).await.unwrap();
    for id in [completed_id, leased_id] {
        let r = store.get(id).await.unwrap().unwrap();
        assert!(
            !r.is_claimable_at(at),
            "{id} is live at `at` (reference semantics)"
        );
    }
    // And one that is over: expired a second before, no lease.
    let mut over = claim("completed-over", at, "to");
    over.lease_until = at;
    store.claim(&over).await.unwrap();
    store
        .complete(&over, Some("1"), from_epoch_secs(epoch_secs(at) - 1))
        .await
        .unwrap();
    // The pg_cron DELETE as `purge_expired`'s docs give it (the file they include), with
    // now() pinned to `at` plus the documented grace: the boundary it must get right.
    let documented: String = include_str!("../../src/store/postgres/pg_cron_purge.sql")
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let shifted_ms = at_ms + 60_000;
    let ts = format!(
        "to_timestamp({}.{:06})",
        shifted_ms / 1000,
        (shifted_ms % 1000) * 1000 + 700
    );
    let quoted = format!("\"{}\"", store.table().replacen('.', "\".\"", 1));
    let sql = documented
        .replace("DELETE FROM idempotency", &format!("DELETE FROM {quoted}"))
        .replace("now()", &ts);
    admin.batch_execute(&sql).await.unwrap();
    let mut gone = Vec::new();
    for id in [completed_id, leased_id] {
        if store.get(id).await.unwrap().is_none() {
            gone.push(id);
        }
    }
    assert!(
        gone.is_empty(),
        "the documented pg_cron purge deleted live records: {gone:?}\n{sql}"
    );
    assert!(
        store.get("completed-over").await.unwrap().is_none(),
        "the documented pg_cron purge deletes what is over: {sql}"
    );
    table.drop_table().await;
}

/// `purge_expired_at` keeps them too.
#[tokio::test]
async fn purge_expired_at_keeps_live_records() {
    let table = TestTable::new("purge_ok").await;
    let store = table.store();
    let at = from_epoch_millis(1_900_000_000_600) + Duration::from_micros(700);
    let mut c = claim("c", at, "tc");
    c.expiration = from_epoch_secs(epoch_secs(at));
    store.claim(&c).await.unwrap();
    store
        .complete(&c, Some("1"), from_epoch_secs(epoch_secs(at)))
        .await
        .unwrap();
    assert_eq!(store.purge_expired_at(at, 100).await.unwrap(), 0);
    assert_eq!(
        store.get("c").await.unwrap().unwrap().status,
        Status::Completed
    );
    table.drop_table().await;
}

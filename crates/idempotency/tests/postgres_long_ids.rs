#![cfg(feature = "postgres")]
//! An id the engine accepts (at most 2048 bytes) that holds a NUL is stored escaped, `\`
//! doubled: up to ~4 KB, past PostgreSQL's 2704-byte limit for an index entry, so such an
//! id is stored hashed. Found by the second hostile review: every claim failed with a
//! non-retryable error, and the message went to the DLQ unprocessed.

use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::{ClaimOutcome, IdempotencyStore};
use lambda_idempotency::{Error, ExecuteError, Idempotency, KeyStrategy, Operation, Outcome};
use serde_json::json;
use std::time::{Duration, SystemTime};

mod common;
use common::{postgres_schema, postgres_url};

/// A key: a NUL, then printable ASCII with about a third backslashes (a Windows path, a
/// regex, escaped JSON kept as text), `len` bytes in all.
fn key(len: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut k = String::from("\0");
    while k.len() < len {
        if rng.f64() < 0.36 {
            k.push('\\');
        } else {
            loop {
                let c = rng.u8(0x21..=0x7e) as char;
                if c != '\\' {
                    k.push(c);
                    break;
                }
            }
        }
    }
    k
}

/// A table of its own, and an admin connection to drop it.
async fn table(test: &str) -> (PostgresStore, tokio_postgres::Client, String) {
    let (admin, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\"",
            postgres_schema()
        ))
        .await
        .ok();
    let name = format!("idem_{test}_{:012x}", fastrand::u64(..) >> 16);
    let store =
        PostgresStore::from_url(&postgres_url(), format!("{}.{name}", postgres_schema())).unwrap();
    store.create_table().await.unwrap();
    (store, admin, name)
}

#[tokio::test]
async fn an_id_within_the_engines_limit_with_a_nul_is_claimed() {
    let (admin, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{}\"",
            postgres_schema()
        ))
        .await
        .ok();
    let name = format!("idem_long_id_{:012x}", fastrand::u64(..) >> 16);
    let store =
        PostgresStore::from_url(&postgres_url(), format!("{}.{name}", postgres_schema())).unwrap();
    store.create_table().await.unwrap();

    // The id as the engine builds it, exactly at its limit: accepted.
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("request_id"));
    let prefix_len = "fn.op#".len();
    let id = idempotency
        .idempotency_id(&op, &json!({ "request_id": key(2048 - prefix_len) }))
        .expect("the engine accepts the id");
    assert!(id.len() <= 2048, "{}", id.len());

    let now = SystemTime::now();
    let claim =
        lambda_idempotency::store::conformance::claim_at(&id, now, Duration::from_secs(60), "t1");
    let outcome = store.claim(&claim).await;
    admin
        .batch_execute(&format!("DROP TABLE \"{}\".\"{name}\"", postgres_schema()))
        .await
        .ok();
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "a {}-byte id (the engine's limit is 2048) with a NUL and backslashes must be claimable, got {outcome:?}",
        id.len()
    );
}

/// An id stored hashed reads back as the id the caller used: `get`, a duplicate's claim,
/// the engine's errors and its local cache all name it. Was: the record's id was the
/// stored form, `"\u{2}<sha256>"`, a key that exists nowhere, and the local cache, keyed
/// by it, never answered.
#[tokio::test]
async fn a_hashed_id_reads_back_as_the_id_the_caller_used() {
    let (store, admin, name) = table("hashed_id").await;
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("request_id"));
    let payload = json!({ "request_id": key(2048 - "fn.op#".len()) });
    let id = idempotency.idempotency_id(&op, &payload).unwrap();

    // In progress elsewhere: the claim's answer, `get` and the engine's error name `id`.
    let now = SystemTime::now();
    let held =
        lambda_idempotency::store::conformance::claim_at(&id, now, Duration::from_secs(60), "t1");
    assert!(matches!(
        store.claim(&held).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let other =
        lambda_idempotency::store::conformance::claim_at(&id, now, Duration::from_secs(60), "t2");
    let existing = match store.claim(&other).await.unwrap() {
        ClaimOutcome::Exists(record) => record,
        outcome => panic!("{outcome:?}"),
    };
    let got = store.get(&id).await.unwrap().expect("the record");
    let busy = idempotency
        .execute(&op, &payload, || async { Ok::<_, Error>(1) })
        .await;
    store.release(&held).await.unwrap();

    // Completed by one worker, replayed by another with a local cache, then answered
    // from that cache without a store request.
    let (_, first) = idempotency
        .execute(&op, &payload, || async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let counted = FaultyStore::new(store.clone());
    let cached = Idempotency::builder(counted.clone())
        .function_name("fn")
        .local_cache(16)
        .build();
    let (_, replayed) = cached
        .execute(&op, &payload, || async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    let requests = counted.total_requests();
    let (_, again) = cached
        .execute(&op, &payload, || async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    admin
        .batch_execute(&format!("DROP TABLE \"{}\".\"{name}\"", postgres_schema()))
        .await
        .ok();

    let shown = |s: &str| format!("{:?}…", &s[..s.len().min(12)]);
    assert!(
        existing.id == id,
        "a duplicate's claim answers {}",
        shown(&existing.id)
    );
    assert!(got.id == id, "get answers {}", shown(&got.id));
    match busy {
        Err(ExecuteError::Idempotency(Error::AlreadyInProgress { key, .. })) => {
            assert!(key == id, "the error names {}", shown(&key))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (first, replayed, again),
        (
            Outcome::Executed,
            Outcome::Replayed,
            Outcome::ReplayedFromCache
        )
    );
    assert_eq!(
        counted.total_requests(),
        requests,
        "the second duplicate is answered by the local cache"
    );
}

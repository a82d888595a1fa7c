#![cfg(feature = "postgres")]
//! An id the engine accepts (at most 2048 bytes) that holds a NUL is stored escaped, `\`
//! doubled: up to ~4 KB, past PostgreSQL's 2704-byte limit for an index entry, so such an
//! id is stored hashed. Found by the second hostile review: every claim failed with a
//! non-retryable error, and the message went to the DLQ unprocessed.

use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::{ClaimOutcome, IdempotencyStore};
use lambda_idempotency::{Idempotency, KeyStrategy, Operation};
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
        PostgresStore::connect(&postgres_url(), format!("{}.{name}", postgres_schema())).unwrap();
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

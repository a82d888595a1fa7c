//! The client's instructions per message, library against raw, counted by callgrind
//! (repeatable on a shared machine, where seconds are not). One connection, a
//! current-thread runtime, `N` messages of one kind:
//!
//! - `redis-replay` / `redis-replay-raw`: a claim of a completed key (a duplicate), through
//!   the library or as the bare claim script on the redis crate;
//! - `redis` / `redis-raw`: a first delivery (claim, completion), the same two ways;
//! - `postgres` / `postgres-raw`: a first delivery (claim, completion), through the library
//!   or as the store's two statements on the store's own connection.
//!
//! The raw loops do what a bare handler must do besides the store requests, as the library
//! does: take the key out of the message's JSON payload, serialize the result it stores,
//! and decode the stored result it answers a duplicate with. Nothing else: no lease token,
//! no deadline, no metrics, no validation of the record it reads.
//!
//! ```sh
//! cargo build --release -p benchmarks --example client-instructions
//! for n in 2000 4000; do
//!   valgrind --tool=callgrind target/release/examples/client-instructions redis-replay $n
//! done   # (total at 4000 − total at 2000) / 2000 = instructions per message
//! ```
//! (`CARGO_PROFILE_RELEASE_STRIP=false` keeps the symbols for `callgrind_annotate`.) With
//! `AWS_LAMBDA_LOG_LEVEL` set, the loop runs under Lambda's default subscriber
//! (`lambda_runtime::tracing::init_default_subscriber`) at that level, as a deployed
//! function does; unset, with no subscriber.)

use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::{Idempotency, KeyStrategy, Operation};
use serde_json::json;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use test_support::servers::{postgres_url, redis_url};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn main() {
    // As a deployed function starts: Lambda's own subscriber, at the level its logging
    // settings give (`AWS_LAMBDA_LOG_LEVEL=WARN` measures a function that logs warnings
    // only). Unset, no subscriber at all.
    if std::env::var_os("AWS_LAMBDA_LOG_LEVEL").is_some() {
        lambda_runtime::tracing::init_default_subscriber();
    }
    let mode = std::env::args().nth(1).unwrap_or_default();
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            run(&mode, n).await;
            // No records left behind in the Redis the tests share.
            if mode.starts_with("redis") {
                benchmarks::purge_redis(&redis_url(), &["instructions:*", "instructions-raw:*"])
                    .await
                    .expect("delete the benchmark's keys");
            }
        });
}

async fn run(mode: &str, n: u64) {
    let op = Operation::new("scale", KeyStrategy::field("id"));
    let run = std::process::id();
    match mode {
        "redis-replay" | "redis" => {
            let store = RedisStore::connect(&redis_url()).await.unwrap();
            let idempotency = Idempotency::builder(Arc::new(store.namespace("instructions:")))
                .function_name("bench")
                .build();
            for i in 0..n {
                let id = if mode == "redis" {
                    format!("{run}-{i}")
                } else {
                    format!("hot-{run}")
                };
                idempotency
                    .execute(&op, &json!({ "id": id }), || async { Ok::<_, String>(1u8) })
                    .await
                    .unwrap();
            }
        }
        "redis-replay-raw" | "redis-raw" => {
            let client = redis::Client::open(redis_url()).unwrap();
            let mut connection = client.get_multiplexed_async_connection().await.unwrap();
            let claim = redis::Script::new(include_str!(
                "../../idempotency/src/store/redis/scripts/claim.lua"
            ));
            let complete = redis::Script::new(include_str!(
                "../../idempotency/src/store/redis/scripts/complete.lua"
            ));
            for i in 0..n {
                // What a bare handler does too: take the key from the message's payload.
                let id = if mode == "redis-raw" {
                    format!("{run}-{i}")
                } else {
                    format!("hot-{run}")
                };
                let payload = json!({ "id": id });
                let key = format!(
                    "instructions-raw:{}",
                    payload["id"].as_str().expect("an id")
                );
                let now = now_ms() as u64;
                let reply: redis::Value = claim
                    .key(&key)
                    .arg(now)
                    .arg(now / 1000)
                    .arg(now / 1000 + 3600)
                    .arg(now + 60_000)
                    .arg("bench-token")
                    .arg("0")
                    .arg("")
                    .arg(now + 3_600_000)
                    .invoke_async(&mut connection)
                    .await
                    .unwrap();
                // ... and answer a duplicate with the stored result, decoded.
                if let Some(stored) = stored_data(&reply) {
                    std::hint::black_box(serde_json::from_str::<u8>(stored).unwrap());
                }
                if i == 0 || mode == "redis-raw" {
                    let data = serde_json::to_string(&1u8).unwrap();
                    let _: redis::Value = complete
                        .key(&key)
                        .arg("bench-token")
                        .arg(now / 1000 + 3600)
                        .arg(now + 3_600_000)
                        .arg("1")
                        .arg(data)
                        .invoke_async(&mut connection)
                        .await
                        .unwrap();
                }
                std::hint::black_box(reply);
            }
        }
        "postgres" | "postgres-raw" => {
            let store = PostgresStore::from_url(&postgres_url(), "bench_scale.records").unwrap();
            // A fresh server has no schema of ours yet.
            let setup = store.connection().await.unwrap();
            setup
                .batch_execute("CREATE SCHEMA IF NOT EXISTS bench_scale")
                .await
                .unwrap();
            drop(setup);
            store.create_table().await.unwrap();
            if mode == "postgres" {
                let idempotency = Idempotency::builder(Arc::new(store))
                    .function_name("bench")
                    .build();
                for i in 0..n {
                    idempotency
                        .execute(&op, &json!({"id": format!("{run}-{i}")}), || async {
                            Ok::<_, String>(1u8)
                        })
                        .await
                        .unwrap();
                }
                return;
            }
            let client = store.connection().await.unwrap();
            let claim = client.prepare(store.claim_sql()).await.unwrap();
            let complete = client.prepare(store.complete_sql()).await.unwrap();
            let no_validation: Option<String> = None;
            for i in 0..n {
                let now = now_ms();
                let payload = json!({ "id": format!("raw-{run}-{i}") });
                let id = format!("bench.scale#{}", payload["id"].as_str().expect("an id"));
                let expiration = now / 1000 + 3600;
                client
                    .query(
                        &claim,
                        &[
                            &id,
                            &expiration,
                            &(now + 60_000),
                            &no_validation,
                            &"bench-token",
                            &(now / 1000),
                            &now,
                        ],
                    )
                    .await
                    .unwrap();
                let data = serde_json::to_string(&1u8).unwrap();
                client
                    .query(&complete, &[&id, &"bench-token", &data, &expiration])
                    .await
                    .unwrap();
            }
        }
        _ => panic!("modes: redis-replay(-raw), redis(-raw), postgres(-raw)"),
    }
}

/// The stored result in the claim script's refusal (`{0, {field, value, ...}}`), as a bare
/// handler reads it to answer a duplicate.
fn stored_data(reply: &redis::Value) -> Option<&str> {
    let redis::Value::Array(parts) = reply else {
        return None;
    };
    let [redis::Value::Int(0), redis::Value::Array(old)] = parts.as_slice() else {
        return None;
    };
    old.chunks(2).find_map(|pair| match pair {
        [redis::Value::BulkString(k), redis::Value::BulkString(v)] if k == b"data" => {
            std::str::from_utf8(v).ok()
        }
        _ => None,
    })
}

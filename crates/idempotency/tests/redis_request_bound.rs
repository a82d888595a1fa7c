#![cfg(feature = "redis")]
//! `RedisStore::query` (for health checks) and `IdempotencyStore::get`, called outside the
//! engine, are bounded by the store's request timeout: a server that stops answering (a
//! frozen node, a half-open connection after a Lambda freeze) never hangs the caller.
//! Found by the second hostile review, after the driver's own reply timeout was removed.

use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::redis::RedisStore;
use std::time::Duration;

mod common;
use common::{private_redis, signal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_on_a_server_that_stopped_answering_returns() {
    let (_server, addr) = private_redis().await;
    let store = RedisStore::connect(&format!("redis://{addr}"))
        .await
        .unwrap()
        .request_timeout(Duration::from_millis(500));
    let info = store.query(redis::cmd("INFO").arg("server")).await.unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    // The node freezes: the TCP connection stays up, nothing answers.
    signal(&pid, "-STOP");
    let health =
        tokio::time::timeout(Duration::from_secs(10), store.query(&redis::cmd("PING"))).await;
    let get = tokio::time::timeout(Duration::from_secs(2), store.get("k")).await;
    signal(&pid, "-CONT");
    assert!(
        matches!(health, Ok(Err(_))),
        "a health check against a frozen Redis must end in an error, got {health:?} (still waiting after 10 s)"
    );
    assert!(
        matches!(get, Ok(Err(_))),
        "get() against a frozen Redis must end in an error, got {get:?}"
    );
}

#![cfg(feature = "redis")]
//! A Redis Cluster with one node frozen (SIGSTOP): messages whose keys live on the two
//! healthy nodes still go through. Found by the second hostile review: a request cut off
//! by the engine threw the whole cluster connection away, and its rebuild (a connect to
//! every node, the frozen one taking its timeout twice) outlasted the engine's attempt
//! timeout, so every shard failed while one was frozen.

use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::{Error, Idempotency, KeyStrategy, Operation};
use serde_json::json;
use std::time::Duration;

mod common;
use common::{Child, private_redis_with, signal};

async fn node() -> (Child, std::net::SocketAddr) {
    private_redis_with(|port, dir| {
        vec![
            "--port".into(),
            port.to_string(),
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            dir.join("nodes.conf").to_string_lossy().into_owned(),
            // No failover and no cluster-wide outage during the test: only the frozen
            // node's own slots are unavailable.
            "--cluster-node-timeout".into(),
            "120000".into(),
            "--cluster-require-full-coverage".into(),
            "no".into(),
        ]
    })
    .await
}

async fn text(store: &RedisStore, cmd: &redis::Cmd) -> String {
    redis::from_redis_value(store.query(cmd).await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frozen_node_does_not_stop_the_healthy_shards() {
    let (_a, a) = node().await;
    let (_b, b) = node().await;
    let (_c, c) = node().await;
    let created = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args([a, b, c].map(|n| n.to_string()))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(created.success(), "redis-cli --cluster create");
    // Every node sees the cluster up.
    let mut admins = Vec::new();
    for n in [a, b, c] {
        admins.push(RedisStore::connect(&format!("redis://{n}")).await.unwrap());
    }
    'wait: for _ in 0..200 {
        for admin in &admins {
            if !text(admin, redis::cmd("CLUSTER").arg("INFO"))
                .await
                .contains("cluster_state:ok")
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue 'wait;
            }
        }
        break;
    }
    let pid_of = |info: String| {
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let frozen_pid = pid_of(text(&admins[2], redis::cmd("INFO").arg("server")).await);

    let store = RedisStore::connect_cluster([a, b, c].map(|n| format!("redis://{n}")))
        .await
        .unwrap()
        .namespace("idem-cluster-frozen:");
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("request_id"));
    // redis-cli gives the third node slots 10923..=16383.
    let slot = |key: String| {
        let admin = &admins[0];
        async move {
            let v = admin
                .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
                .await
                .unwrap();
            redis::from_redis_value::<i64>(v).unwrap()
        }
    };
    let (mut on_frozen, mut on_healthy) = (None, None);
    for i in 0..200 {
        let request = format!("r-{i}");
        let id = idempotency
            .idempotency_id(&op, &json!({ "request_id": request }))
            .unwrap();
        let s = slot(store.key(&id)).await;
        if s >= 10923 && on_frozen.is_none() {
            on_frozen = Some(request);
        } else if s < 10923 && on_healthy.is_none() {
            on_healthy = Some(request);
        }
    }
    let (on_frozen, on_healthy) = (on_frozen.unwrap(), on_healthy.unwrap());
    let run = |request: String| {
        let idempotency = idempotency.clone();
        let op = op.clone();
        async move {
            idempotency
                .execute(&op, &json!({ "request_id": request }), || async {
                    Ok::<_, Error>(1)
                })
                .await
        }
    };
    run("warm".into()).await.expect("the cluster works");

    signal(&frozen_pid, "-STOP");
    // A message on the frozen node: its attempts are cut off (expected, and the store
    // drops the whole cluster connection each time).
    let frozen = run(on_frozen).await;
    // A message on a healthy node, through the engine's default attempts.
    let started = std::time::Instant::now();
    let healthy = run(on_healthy).await;
    let took = started.elapsed();
    signal(&frozen_pid, "-CONT");
    assert!(frozen.is_err(), "the frozen node answered: {frozen:?}");
    assert!(
        healthy.is_ok(),
        "a message whose key is on a healthy node failed after {took:?} because one other node is frozen: {healthy:?}"
    );
}

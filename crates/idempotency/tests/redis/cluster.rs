//! The Redis store on a cluster: the whole contract, and one frozen node.

use super::*;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use test_support::servers::redis_cluster_urls;

/// A store on the test cluster, under a prefix of `test`'s own.
async fn cluster(test: &str) -> RedisStore {
    let urls = redis_cluster_urls();
    RedisStore::connect_cluster(urls.clone())
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis cluster at {urls:?}: {e}; {HOW}"))
        .namespace(redis_prefix(test))
}

/// The whole contract on the cluster. The contract's store failures come from the fault
/// wrapper: the cluster client retries a dropped connection itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_cluster_keeps_the_whole_contract() {
    let store = FaultyStore::new(cluster("conformance").await);
    let faults = store.clone();
    conformance::run_whole_contract(
        store,
        async |op| faults.inject(op, Fault::Unavailable, 1),
        6,
        None,
    )
    .await;
}

/// A private node in cluster mode, not yet in a cluster.
async fn node() -> PrivateRedis {
    PrivateRedis::start_with(|port, dir| {
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

/// A cluster with one node frozen (SIGSTOP): messages whose keys live on the two healthy
/// nodes still go through, though a request cut off by the engine drops the whole cluster
/// connection and its rebuild reaches for the frozen node too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frozen_node_does_not_stop_the_healthy_shards() {
    let nodes = [node().await, node().await, node().await];
    let [a, b, c] = [0, 1, 2].map(|i| nodes[i].addr());
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

    nodes[2].freeze();
    // A message on the frozen node: its attempts are cut off (expected, and the store
    // drops the whole cluster connection each time).
    let frozen = run(on_frozen).await;
    // A message on a healthy node, through the engine's default attempts.
    let started = std::time::Instant::now();
    let healthy = run(on_healthy).await;
    let took = started.elapsed();
    nodes[2].thaw();
    assert!(frozen.is_err(), "the frozen node answered: {frozen:?}");
    assert!(
        healthy.is_ok(),
        "a message whose key is on a healthy node failed after {took:?} because one other node is frozen: {healthy:?}"
    );
}

/// A store on one node of a cluster (a configuration endpoint given as one URL) says so,
/// and its listing refuses rather than list that node's keys alone and call itself
/// complete; a store on the cluster lists them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_through_one_node_of_a_cluster_is_refused() {
    use lambda_idempotency::store::ListRequest;
    let urls = redis_cluster_urls();
    let one = RedisStore::connect(&urls[0]).await.unwrap();
    assert!(one.is_one_node_of_a_cluster().await.unwrap());
    let err = one
        .list(&ListRequest::new("", 10))
        .await
        .expect_err("a listing through one node of a cluster");
    let why = lambda_idempotency::report(&err);
    assert!(why.contains("connect to the cluster"), "{why}");
    let all = cluster("one-node").await;
    assert!(!all.is_one_node_of_a_cluster().await.unwrap());
    assert!(all.list(&ListRequest::new("", 10)).await.is_ok());
    let single = super::node("one-node").await;
    assert!(!single.is_one_node_of_a_cluster().await.unwrap());
}

/// How many `CLUSTER SLOTS` the cluster's nodes have answered, from their `INFO
/// commandstats`.
async fn slot_map_reads(urls: &[String]) -> u64 {
    let mut calls = 0;
    for url in urls {
        let node = RedisStore::connect(url).await.unwrap();
        let stats = text(&node, redis::cmd("INFO").arg("commandstats")).await;
        calls += stats
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_cluster|slots:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap());
    }
    calls
}

/// A listing on the cluster reads its slot map once, not once per page: the primaries
/// left to walk go on in the cursor. Every record is found, on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_on_the_cluster_reads_the_slot_map_once() {
    use lambda_idempotency::store::ListRequest;
    let store = cluster("slots-once").await;
    let now = SystemTime::now();
    for i in 0..30 {
        let claim = Claim::new(format!("f.op#{i}"), now, now + Duration::from_secs(60), "t")
            .expires_at(now + Duration::from_secs(600));
        store.claim(&claim).await.unwrap();
    }
    let urls = redis_cluster_urls();
    let before = slot_map_reads(&urls).await;
    let (mut ids, mut pages) = (Vec::new(), 0);
    let mut request = ListRequest::new("f.op#", 2);
    loop {
        let page = store.list(&request).await.unwrap();
        pages += 1;
        ids.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            Some(next) => request = request.after(Some(next)),
            None => break,
        }
    }
    let reads = slot_map_reads(&urls).await - before;
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 30, "{ids:?}");
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(reads, 1, "{pages} pages read the slot map {reads} times");
}

//! The Redis store against a server in a state of its own: full, or busy with a script.

use super::*;

/// A full Redis under `maxmemory-policy noeviction` (used memory past `maxmemory`) answers
/// `OOM` to a script whose first write adds data: a fresh claim is refused (no call is
/// made), a completion too (the engine retries it within the lease), both retryable and
/// nothing half-written; reads work, and so does a script that deletes first (a release;
/// a claim over a claimable record, which deletes it, then writes). Once memory is freed
/// the same completion succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_refuses_writes_retryably_and_keeps_records_whole() {
    let server = PrivateRedis::start_with(|port, _| {
        [
            "--port",
            &port.to_string(),
            "--maxmemory-policy",
            "noeviction",
        ]
        .map(str::to_owned)
        .to_vec()
    })
    .await;
    let addr = server.addr();
    let store = RedisStore::connect(&format!("redis://{addr}"))
        .await
        .unwrap();
    let maxmemory = |limit: &str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory").arg(limit);
        cmd
    };
    let held = claim("conformance.oom#held", "t1");
    store.claim(&held).await.unwrap();
    store
        .query(redis::cmd("SET").arg("filler").arg(vec![b'x'; 2 << 20]))
        .await
        .unwrap();
    // Full: more in use than allowed.
    store.query(&maxmemory("1mb")).await.unwrap();
    let fresh = store.claim(&claim("conformance.oom#fresh", "t2")).await;
    let completed = store
        .complete(
            &held,
            Some("{\"answer\":1}"),
            SystemTime::now() + Duration::from_secs(60),
        )
        .await;
    let read = store.get(&held.id).await;
    let reclaimed = store.claim(&held).await;
    let released = store.release(&held).await;
    let after_release = store.claim(&held).await;
    store.query(&maxmemory("0")).await.unwrap();
    for (what, result) in [
        ("a fresh claim", fresh.map(drop)),
        ("a completion", completed),
        ("a claim after the release", after_release.map(drop)),
    ] {
        match result {
            Err(err @ Error::Store { .. }) => {
                let text = store_source(&err).to_string();
                assert!(text.contains("OOM"), "{what}: {text}");
                assert!(err.is_retryable(), "{what}: OOM must be retryable: {err:?}");
            }
            other => panic!("{what} on a full Redis: {other:?}"),
        }
    }
    let record = read
        .expect("reads work on a full Redis")
        .expect("the record");
    assert_eq!(record.status, Status::InProgress, "nothing half-written");
    assert_eq!(record.data, None);
    assert!(
        matches!(reclaimed, Ok(ClaimOutcome::Claimed { .. })),
        "the claim script deletes the claimable record first, then writes: {reclaimed:?}"
    );
    assert!(
        released.is_ok(),
        "a release (a DEL) is allowed: {released:?}"
    );
    store
        .claim(&held)
        .await
        .expect("memory freed: the claim succeeds");
    store
        .complete(
            &held,
            Some("1"),
            SystemTime::now() + Duration::from_secs(60),
        )
        .await
        .expect("and the completion");
}

/// A server busy running another client's long script answers `BUSY` to every request:
/// retryable, and the connection is kept (it answers once the script ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_redis_is_retryable() {
    let server = PrivateRedis::start_with(|port, _| {
        ["--port", &port.to_string(), "--busy-reply-threshold", "100"]
            .map(str::to_owned)
            .to_vec()
    })
    .await;
    let addr = server.addr();
    let url = format!("redis://{addr}");
    let store = RedisStore::connect(&url).await.unwrap();
    let c = claim("conformance.busy#k", "t1");
    store.get(&c.id).await.unwrap();
    let looping = RedisStore::connect(&url)
        .await
        .unwrap()
        .request_timeout(Duration::from_secs(30));
    let script = tokio::spawn(async move {
        looping
            .query(redis::cmd("EVAL").arg("while true do end").arg(0))
            .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let busy = store.claim(&c).await;
    let killer = RedisStore::connect(&url).await;
    let killed = match &killer {
        Ok(k) => k.query(redis::cmd("SCRIPT").arg("KILL")).await.map(drop),
        Err(_) => Ok(()),
    };
    let _ = script.await;
    match busy {
        Err(err @ Error::Store { .. }) => {
            let text = store_source(&err).to_string();
            assert!(text.contains("BUSY"), "{text}");
            assert!(err.is_retryable(), "BUSY must be retryable: {err:?}");
        }
        other => panic!("a claim on a busy Redis: {other:?}"),
    }
    killer.expect("SCRIPT KILL may be sent to a busy server");
    killed.expect("SCRIPT KILL");
    store
        .claim(&c)
        .await
        .expect("the script ended: the claim works");
}

//! Listing for operators on a Redis shared with other applications: only a record's own
//! fields are read, and other hashes under the same prefix are passed over.

use super::*;
use lambda_idempotency::store::ListRequest;

/// A hash another application keeps under the namespace (no `status`) is neither a record
/// nor an unreadable one, and its fields are not read: a listing sends `HMGET` of the
/// record's fields, never `HGETALL`, which on a hash of a million fields blocks Redis. A
/// record with a field of someone else's beside its own is listed as the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reads_only_records_and_their_own_fields() {
    // A server of its own: the count of `HGETALL`s below is this test's alone.
    let server = PrivateRedis::start().await;
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let now = SystemTime::now();
    let claim = Claim::new("f.op#mine", now, now + Duration::from_secs(60), "t")
        .expires_at(now + Duration::from_secs(600));
    store.claim(&claim).await.unwrap();
    store
        .query(
            redis::cmd("HSET")
                .arg(store.key("f.op#mine"))
                .arg("theirs")
                .arg("x".repeat(1 << 20)),
        )
        .await
        .unwrap();
    store
        .query(
            redis::cmd("HSET")
                .arg(store.key("f.op#sessions"))
                .arg("user")
                .arg("ada")
                .arg("data")
                .arg("not ours"),
        )
        .await
        .unwrap();
    let calls_before = hgetall_calls(&store).await;

    let mut request = ListRequest::new("f.op#", 1000);
    let (mut records, mut unreadable) = (Vec::new(), Vec::new());
    loop {
        let page = store.list(&request).await.unwrap();
        records.extend(page.records);
        unreadable.extend(page.unreadable);
        match page.next {
            Some(next) => request = request.after(Some(next)),
            None => break,
        }
    }
    assert_eq!(
        unreadable,
        Vec::new(),
        "another application's hash is no record"
    );
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].id, "f.op#mine");
    assert_eq!(records[0].status, Status::InProgress);
    assert_eq!(
        hgetall_calls(&store).await,
        calls_before,
        "a listing never reads a whole hash"
    );
}

/// A prefix that matches a few keys among many is walked in few round trips, whatever the
/// page size: the `SCAN` count per step follows how many keys matched, up to 10 000 (it was
/// the page size: 2 000 round trips for 20 000 keys and pages of 10). A prefix that
/// matches them all still comes back about a page per step, and `examined` adds up to
/// the keyspace walked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_walks_a_big_keyspace_in_few_round_trips() {
    let server = PrivateRedis::start().await;
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .namespace("big:");
    // 20 000 hashes of another application's under the namespace, in one script.
    store
        .query(
            redis::cmd("EVAL")
                .arg("for i = 1, 20000 do redis.call('HSET', 'big:other#' .. i, 'f', 'v') end")
                .arg(0),
        )
        .await
        .unwrap();
    let now = SystemTime::now();
    for i in 0..15 {
        let claim = Claim::new(
            format!("f.mine#{i}"),
            now,
            now + Duration::from_secs(60),
            "t",
        )
        .expires_at(now + Duration::from_secs(600));
        store.claim(&claim).await.unwrap();
    }
    let walk = async |prefix: &str, limit: usize| {
        let (mut ids, mut pages, mut examined, mut most) = (Vec::new(), 0, 0, 0);
        let mut request = ListRequest::new(prefix, limit);
        loop {
            let page = store.list(&request).await.unwrap();
            pages += 1;
            examined += page.examined;
            most = most.max(page.records.len() + page.unreadable.len());
            ids.extend(page.records.into_iter().map(|r| r.id));
            match page.next {
                Some(next) => request = request.after(Some(next)),
                None => break,
            }
        }
        ids.sort();
        ids.dedup();
        (ids, pages, examined, most)
    };
    let (ids, pages, examined, _) = walk("f.mine#", 10).await;
    assert_eq!(ids.len(), 15, "{ids:?}");
    assert!(pages <= 12, "{pages} round trips for 20 015 keys");
    assert!(examined >= 20_015, "examined {examined} of 20 015 keys");

    // Every key matches (the other application's hashes are passed over): pages of about
    // the page size, never ten thousand records at once.
    let (ids, pages, examined, _) = walk("", 1000).await;
    assert_eq!(ids.len(), 15);
    assert!((15..=40).contains(&pages), "{pages} pages of 1000");
    assert!(examined >= 20_015, "examined {examined}");
    let mut request = ListRequest::new("", 100);
    for _ in 0..5 {
        let page = store.list(&request).await.unwrap();
        assert!(
            page.examined <= 300,
            "a page of 100 looked at {}",
            page.examined
        );
        request = request.after(page.next);
    }
}

/// How many `HGETALL`s the server has run, from `INFO commandstats`.
async fn hgetall_calls(store: &RedisStore) -> u64 {
    let reply = store
        .query(redis::cmd("INFO").arg("commandstats"))
        .await
        .unwrap();
    let text: String = redis::from_redis_value(reply).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("cmdstat_hgetall:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A user refused `INFO` (`-@dangerous`, a common least-privilege user) still lists: the
/// question whether the node is one of a cluster's is a guard, and its refusal is "no".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_info_still_lists() {
    let server = PrivateRedis::start().await;
    let admin = RedisStore::connect(&server.url()).await.unwrap();
    admin
        .query(redis::cmd("ACL").arg(
            &[
                "SETUSER",
                "operator",
                "on",
                ">pw",
                "~*",
                "+@all",
                "-@dangerous",
            ][..],
        ))
        .await
        .unwrap();
    let addr = server.addr();
    let store = RedisStore::connect(&format!("redis://operator:pw@{addr}"))
        .await
        .unwrap();
    let refused = store.query(redis::cmd("INFO").arg("cluster")).await;
    assert!(refused.is_err(), "the user is refused INFO: {refused:?}");
    assert!(!store.is_one_node_of_a_cluster().await.unwrap());
    let now = SystemTime::now();
    let claim = Claim::new("f.op#k", now, now + Duration::from_secs(60), "t")
        .expires_at(now + Duration::from_secs(600));
    store.claim(&claim).await.unwrap();
    let page = store.list(&ListRequest::new("f.op#", 100)).await.unwrap();
    assert_eq!(page.records.len(), 1, "{page:?}");
}

/// A server that stops answering mid-listing (a frozen connection): the cluster question
/// and the listing each end within the store's request timeout with a retryable error,
/// never hang; the handle's retry then lists on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_on_a_server_that_stopped_answering_ends_and_is_retried() {
    use test_support::proxy::Proxy;
    use test_support::servers::redis_addr;
    let proxy = Proxy::start(redis_addr(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace(redis_prefix("listing-frozen"))
        .request_timeout(Duration::from_millis(300));
    assert!(!store.is_one_node_of_a_cluster().await.unwrap());
    proxy.freeze();
    let asked = tokio::time::timeout(Duration::from_secs(5), store.is_one_node_of_a_cluster())
        .await
        .expect("the cluster question ends");
    assert!(
        matches!(
            &asked,
            Err(Error::Store {
                retryable: true,
                ..
            })
        ),
        "{asked:?}"
    );
    // A freeze stops the connections open at the time: open a fresh one first.
    store.get("k").await.expect("a fresh connection answers");
    proxy.freeze();
    let listed = tokio::time::timeout(
        Duration::from_secs(5),
        store.list(&ListRequest::new("f.op#", 10)),
    )
    .await
    .expect("the listing ends");
    assert!(
        matches!(
            &listed,
            Err(Error::Store {
                retryable: true,
                ..
            })
        ),
        "{listed:?}"
    );
    // Through the handle, retried: a fresh connection answers.
    let handle = Idempotency::new(store.clone());
    store.get("k").await.expect("a fresh connection answers");
    proxy.freeze();
    let page = tokio::time::timeout(
        Duration::from_secs(10),
        handle.list(&ListRequest::new("f.op#", 10)),
    )
    .await
    .expect("the retried listing ends");
    assert!(page.is_ok(), "{page:?}");
}

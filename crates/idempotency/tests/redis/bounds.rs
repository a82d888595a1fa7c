//! Every store request has a bound that can fire: the engine's attempt timeout, or the
//! store's own request timeout when the request is polled outside the engine's attempt (a
//! request a wrapper shares with another caller, or drives to its end inside the engine's
//! poll). The store sets no timer of its own only while the engine's is the one.

use super::*;
use futures_util::FutureExt;
use futures_util::future::Shared;
use lambda_idempotency::store::{BoxFuture, Record};
use std::sync::Mutex;
use std::time::Instant;
use test_support::proxy::Proxy;
use test_support::servers::redis_addr;

async fn frozen_store(timeout: Duration) -> (Proxy, RedisStore) {
    let proxy = Proxy::start(redis_addr(), Duration::ZERO).await;
    let store = RedisStore::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap()
        .namespace(redis_prefix("bounds"))
        .request_timeout(timeout);
    proxy.freeze();
    (proxy, store)
}

type Get = Shared<BoxFuture<'static, Result<Option<Record>, String>>>;

/// Concurrent `get`s of one id share one request (a coalescing wrapper).
#[derive(Clone)]
struct Coalescing {
    inner: RedisStore,
    pending: Arc<Mutex<Option<Get>>>,
}

impl std::fmt::Debug for Coalescing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Coalescing")
    }
}

impl Coalescing {
    fn shared_get(&self, id: &str) -> Get {
        let mut pending = self.pending.lock().unwrap();
        pending
            .get_or_insert_with(|| {
                let inner = self.inner.clone();
                let id = id.to_owned();
                let fut: BoxFuture<'static, _> =
                    Box::pin(async move { inner.get(&id).await.map_err(|e| e.to_string()) });
                fut.shared()
            })
            .clone()
    }
}

impl IdempotencyStore for Coalescing {
    fn name(&self) -> &'static str {
        "coalescing"
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        self.inner.claim(claim)
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.complete(claim, data, expiration)
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.release(claim)
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        let shared = self.shared_get(id);
        Box::pin(async move {
            shared
                .await
                .map_err(|e| Error::store("coalescing", true, e))
        })
    }
}

/// A request started under the engine, then awaited by a caller outside it (a health
/// check joining the in-flight read): the store's own bound must still hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_outlives_the_engine_attempt_keeps_a_bound() {
    let (_proxy, inner) = frozen_store(Duration::from_secs(2)).await;
    let store = Coalescing {
        inner,
        pending: Arc::default(),
    };
    let idempotency = Idempotency::builder(store.clone())
        .function_name("bounds")
        .store_attempt_timeout(Duration::from_millis(500))
        .max_store_attempts(1)
        .build();
    let engine = idempotency.record_by_id("x").await;
    println!("engine attempt: {engine:?}");
    let started = Instant::now();
    let outside = tokio::time::timeout(Duration::from_secs(6), store.get("x")).await;
    assert!(
        matches!(outside, Ok(Err(_))),
        "the direct get must end in an error within the store's 2 s request timeout, got {outside:?} after {:?}",
        started.elapsed()
    );
}

/// A sync bridge: the inner request driven to completion inside the engine's poll.
#[derive(Clone, Debug)]
struct Bridge(RedisStore);

impl IdempotencyStore for Bridge {
    fn name(&self) -> &'static str {
        "bridge"
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        self.0.claim(claim)
    }
    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.0.complete(claim, data, expiration)
    }
    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        self.0.release(claim)
    }
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(self.0.get(id))
            })
        })
    }
}

#[test]
fn a_request_driven_inside_the_engines_poll_keeps_a_bound() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let finished = rt.block_on(async {
        let (_proxy, inner) = frozen_store(Duration::from_secs(2)).await;
        let idempotency = Idempotency::builder(Bridge(inner))
            .function_name("bounds")
            .store_attempt_timeout(Duration::from_millis(500))
            .max_store_attempts(1)
            .build();
        let call = tokio::spawn(async move { idempotency.record_by_id("x").await.map(|_| ()) });
        let r = tokio::time::timeout(Duration::from_secs(6), call).await;
        matches!(r, Ok(Ok(Err(_))))
    });
    rt.shutdown_background();
    assert!(
        finished,
        "the bridged get must end in an error within the store's 2 s request timeout"
    );
}

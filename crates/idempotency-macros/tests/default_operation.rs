//! The default operation name of `#[idempotent]`, pinned for every shape: `module_path!()`
//! and the function's own name, text the language keeps from one compiler to the next.
//! Two different functions never share stored ids: functions of two modules differ by
//! their module, methods must name their operation (a compile error otherwise, see
//! `tests/ui/fail/method_without_operation.rs`), and a function and its `_with_outcome`
//! companion are one operation.

use lambda_idempotency::{Error, Idempotency, MemoryStore, idempotent};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU32, Ordering};

/// A store and a handle whose stored ids are `fn.{operation}#{key}`.
fn setup() -> (MemoryStore, Idempotency) {
    let store = MemoryStore::new();
    let handle = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    (store, handle)
}

fn payload(id: &str) -> Value {
    json!({"id": id})
}

/// The store holds exactly `ids`.
fn assert_ids(store: &MemoryStore, ids: &[&str]) {
    for id in ids {
        assert!(store.record(id).is_some(), "no record {id}");
    }
    assert_eq!(store.len(), ids.len(), "only {ids:?}");
}

mod orders {
    use super::*;

    #[idempotent(handle = handle, payload = request, key = "id")]
    pub(crate) async fn process(
        handle: &Idempotency,
        request: Value,
        calls: &AtomicU32,
    ) -> Result<String, Error> {
        let _ = request;
        calls.fetch_add(1, Ordering::SeqCst);
        Ok("order".into())
    }

    pub(crate) mod refunds {
        use super::*;

        #[idempotent(handle = handle, payload = request, key = "id")]
        pub(crate) async fn process(
            handle: &Idempotency,
            request: Value,
            calls: &AtomicU32,
        ) -> Result<String, Error> {
            let _ = request;
            calls.fetch_add(1, Ordering::SeqCst);
            Ok("refund".into())
        }
    }
}

#[tokio::test]
async fn a_free_fn_is_named_by_its_module_path_and_its_name() {
    let (store, handle) = setup();
    let calls = AtomicU32::new(0);
    orders::process(&handle, payload("k1"), &calls)
        .await
        .unwrap();
    assert_ids(&store, &["fn.default_operation::orders::process#k1"]);
}

#[tokio::test]
async fn functions_with_the_same_name_in_two_modules_both_run() {
    let (store, handle) = setup();
    let (order_calls, refund_calls) = (AtomicU32::new(0), AtomicU32::new(0));
    for _ in 0..2 {
        let order = orders::process(&handle, payload("k1"), &order_calls);
        assert_eq!(order.await.unwrap(), "order");
        let refund = orders::refunds::process(&handle, payload("k1"), &refund_calls);
        assert_eq!(
            refund.await.unwrap(),
            "refund",
            "not the order's stored result"
        );
    }
    assert_eq!(order_calls.load(Ordering::SeqCst), 1);
    assert_eq!(refund_calls.load(Ordering::SeqCst), 1);
    assert_ids(
        &store,
        &[
            "fn.default_operation::orders::process#k1",
            "fn.default_operation::orders::refunds::process#k1",
        ],
    );
}

#[idempotent(handle = handle, payload = request, key = "id")]
async fn at_the_root(handle: &Idempotency, request: Value) -> Result<u32, Error> {
    let _ = request;
    Ok(1)
}

#[tokio::test]
async fn a_fn_at_the_crate_root_is_named_by_the_crate() {
    let (store, handle) = setup();
    at_the_root(&handle, payload("k1")).await.unwrap();
    assert_ids(&store, &["fn.default_operation::at_the_root#k1"]);
}

#[idempotent(handle = handle, payload = request, key = "id", with_outcome)]
async fn summarise(handle: &Idempotency, request: Value) -> Result<u32, Error> {
    let _ = request;
    Ok(2)
}

#[idempotent(handle = handle, payload = request, key = "id")]
async fn summarise_with_outcome_v2(handle: &Idempotency, request: Value) -> Result<u32, Error> {
    let _ = request;
    Ok(3)
}

#[tokio::test]
async fn a_fn_and_its_companion_are_one_operation() {
    let (store, handle) = setup();
    let (value, outcome) = summarise_with_outcome(&handle, payload("k1"))
        .await
        .unwrap();
    assert_eq!((value, outcome), (2, lambda_idempotency::Outcome::Executed));
    assert_eq!(summarise(&handle, payload("k1")).await.unwrap(), 2);
    assert_ids(&store, &["fn.default_operation::summarise#k1"]);
    // A function whose own name merely contains the suffix keeps its whole name.
    summarise_with_outcome_v2(&handle, payload("k1"))
        .await
        .unwrap();
    assert_ids(
        &store,
        &[
            "fn.default_operation::summarise#k1",
            "fn.default_operation::summarise_with_outcome_v2#k1",
        ],
    );
}

#[idempotent(handle = handle, payload = request, key = "id")]
async fn generic_fn<T: Send + Sync>(
    handle: &Idempotency,
    request: Value,
    tag: T,
) -> Result<u32, Error> {
    let _ = (request, tag);
    Ok(6)
}

#[tokio::test]
async fn a_generic_fn_has_one_name_for_every_type() {
    let (store, handle) = setup();
    generic_fn(&handle, payload("k1"), 1u8).await.unwrap();
    generic_fn(&handle, payload("k1"), "tag").await.unwrap();
    assert_ids(&store, &["fn.default_operation::generic_fn#k1"]);
}

#[idempotent(handle = handle, payload = request, key = "id")]
async fn r#match(handle: &Idempotency, request: Value) -> Result<u32, Error> {
    let _ = request;
    Ok(8)
}

#[tokio::test]
async fn a_raw_identifier_is_named_without_its_prefix() {
    let (store, handle) = setup();
    r#match(&handle, payload("k1")).await.unwrap();
    assert_ids(&store, &["fn.default_operation::match#k1"]);
}

struct Order {
    idempotency: Idempotency,
    calls: AtomicU32,
}

struct Refund {
    idempotency: Idempotency,
    calls: AtomicU32,
}

impl Order {
    #[idempotent(handle = self.idempotency, payload = request, key = "id", operation = "Order::handle")]
    async fn handle(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok("order".into())
    }

    /// Keeps the ids the old default (`std::any::type_name`'s text) gave this method.
    #[idempotent(
        handle = self.idempotency,
        payload = request,
        key = "id",
        operation = "default_operation::Order::legacy"
    )]
    async fn legacy(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        Ok("legacy".into())
    }
}

impl Refund {
    #[idempotent(handle = self.idempotency, payload = request, key = "id", operation = "Refund::handle")]
    async fn handle(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok("refund".into())
    }

    #[idempotent(handle = self.idempotency, payload = request, key = "id", key_prefix = "refunds-v1")]
    async fn by_prefix(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        Ok("prefixed".into())
    }
}

#[tokio::test]
async fn methods_name_their_operation_and_two_types_never_share_ids() {
    let (store, handle) = setup();
    let order = Order {
        idempotency: handle.clone(),
        calls: AtomicU32::new(0),
    };
    let refund = Refund {
        idempotency: handle,
        calls: AtomicU32::new(0),
    };
    assert_eq!(order.handle(payload("k1")).await.unwrap(), "order");
    assert_eq!(
        refund.handle(payload("k1")).await.unwrap(),
        "refund",
        "not the order's stored result"
    );
    assert_eq!(order.calls.load(Ordering::SeqCst), 1);
    assert_eq!(refund.calls.load(Ordering::SeqCst), 1);
    order.legacy(payload("k1")).await.unwrap();
    refund.by_prefix(payload("k1")).await.unwrap();
    assert_ids(
        &store,
        &[
            "fn.Order::handle#k1",
            "fn.Refund::handle#k1",
            "fn.default_operation::Order::legacy#k1",
            "refunds-v1#k1",
        ],
    );
}

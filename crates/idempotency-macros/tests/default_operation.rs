//! The default operation name of `#[idempotent]`: the function's full path, so two
//! functions with the same name (in two modules, or methods of two types) never share
//! stored ids.

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

/// The one stored id is `fn.{operation}#k1`: the operation has no `#` and no closure part.
fn assert_stored_as(store: &MemoryStore, operation: &str) {
    assert!(!operation.contains('#'), "{operation}");
    assert!(!operation.contains("{{closure}}"), "{operation}");
    let id = format!("fn.{operation}#k1");
    assert!(store.record(&id).is_some(), "no record {id}");
    assert_eq!(store.len(), 1, "only {id}");
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
}

mod refunds {
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

#[tokio::test]
async fn functions_with_the_same_name_in_two_modules_both_run() {
    let (store, handle) = setup();
    let (order_calls, refund_calls) = (AtomicU32::new(0), AtomicU32::new(0));
    let order = orders::process(&handle, payload("k1"), &order_calls);
    assert_eq!(order.await.unwrap(), "order");
    let refund = refunds::process(&handle, payload("k1"), &refund_calls);
    assert_eq!(
        refund.await.unwrap(),
        "refund",
        "not the order's stored result"
    );
    assert_eq!(order_calls.load(Ordering::SeqCst), 1);
    assert_eq!(refund_calls.load(Ordering::SeqCst), 1);
    assert!(
        store
            .record("fn.default_operation::orders::process#k1")
            .is_some()
    );
    assert!(
        store
            .record("fn.default_operation::refunds::process#k1")
            .is_some()
    );
    // Each still replays its own result.
    let order = orders::process(&handle, payload("k1"), &order_calls);
    assert_eq!(order.await.unwrap(), "order");
    let refund = refunds::process(&handle, payload("k1"), &refund_calls);
    assert_eq!(refund.await.unwrap(), "refund");
    assert_eq!(order_calls.load(Ordering::SeqCst), 1);
    assert_eq!(refund_calls.load(Ordering::SeqCst), 1);
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
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok("order".into())
    }
}

impl Refund {
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<String, Error> {
        let _ = request;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok("refund".into())
    }
}

#[tokio::test]
async fn methods_with_the_same_name_on_two_types_both_run() {
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
    assert!(
        store
            .record("fn.default_operation::Order::handle#k1")
            .is_some()
    );
    assert!(
        store
            .record("fn.default_operation::Refund::handle#k1")
            .is_some()
    );
}

#[tokio::test]
async fn a_free_fn_is_named_by_its_module_path() {
    let (store, handle) = setup();
    let calls = AtomicU32::new(0);
    orders::process(&handle, payload("k1"), &calls)
        .await
        .unwrap();
    assert_stored_as(&store, "default_operation::orders::process");
}

#[tokio::test]
async fn an_inherent_method_is_named_by_its_type() {
    let (store, handle) = setup();
    let order = Order {
        idempotency: handle,
        calls: AtomicU32::new(0),
    };
    order.handle(payload("k1")).await.unwrap();
    assert_stored_as(&store, "default_operation::Order::handle");
}

struct Queue<T> {
    idempotency: Idempotency,
    item: T,
}

impl<T: Clone + Send + Sync> Queue<T> {
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, Error> {
        let _ = (request, self.item.clone());
        Ok(1)
    }
}

#[tokio::test]
async fn a_method_of_a_generic_impl_is_named_with_placeholders_one_name_for_every_type() {
    let (store, handle) = setup();
    let numbers = Queue {
        idempotency: handle.clone(),
        item: 1u8,
    };
    numbers.handle(payload("k1")).await.unwrap();
    assert_stored_as(&store, "default_operation::Queue<_>::handle");
    // `T` is not part of the name: `Queue<String>` shares the record.
    let strings = Queue {
        idempotency: handle,
        item: String::new(),
    };
    strings.handle(payload("k1")).await.unwrap();
    assert_eq!(store.len(), 1);
}

trait Handler {
    async fn handle(&self, request: Value) -> Result<u32, Error>;
}

impl Handler for Order {
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(2)
    }
}

impl<T: Clone + Send + Sync> Handler for Queue<T> {
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, Error> {
        let _ = (request, self.item.clone());
        Ok(3)
    }
}

#[tokio::test]
async fn a_trait_impl_method_is_named_by_the_type_and_the_trait() {
    let (store, handle) = setup();
    let order = Order {
        idempotency: handle,
        calls: AtomicU32::new(0),
    };
    assert_eq!(Handler::handle(&order, payload("k1")).await.unwrap(), 2);
    assert_stored_as(
        &store,
        "<default_operation::Order as default_operation::Handler>::handle",
    );
    // Apart from the inherent method of the same name.
    assert_eq!(order.handle(payload("k1")).await.unwrap(), "order");
    assert_eq!(store.len(), 2);
}

#[tokio::test]
async fn a_generic_trait_impl_method_is_named_with_placeholders() {
    let (store, handle) = setup();
    let queue = Queue {
        idempotency: handle,
        item: 1u8,
    };
    assert_eq!(Handler::handle(&queue, payload("k1")).await.unwrap(), 3);
    assert_stored_as(
        &store,
        "<default_operation::Queue<_> as default_operation::Handler>::handle",
    );
}

fn nested() -> impl Fn(&Idempotency) -> std::pin::Pin<Box<dyn Future<Output = u32> + '_>> {
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn inner(handle: &Idempotency, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(4)
    }
    |handle| Box::pin(async move { inner(handle, payload("k1")).await.unwrap() })
}

#[tokio::test]
async fn a_fn_nested_in_a_fn_is_named_by_both() {
    let (store, handle) = setup();
    assert_eq!(nested()(&handle).await, 4);
    assert_stored_as(&store, "default_operation::nested::inner");
}

#[tokio::test]
async fn a_fn_nested_in_an_async_fn_has_no_closure_part() {
    // `#[tokio::test]` puts this body in an async block, and the body of an `async fn` is
    // one too: both would add `{{closure}}` to the name.
    #[idempotent(handle = handle, payload = request, key = "id")]
    async fn inner(handle: &Idempotency, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(5)
    }
    let (store, handle) = setup();
    assert_eq!(inner(&handle, payload("k1")).await.unwrap(), 5);
    assert_stored_as(
        &store,
        "default_operation::a_fn_nested_in_an_async_fn_has_no_closure_part::inner",
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
    assert_stored_as(&store, "default_operation::generic_fn");
    generic_fn(&handle, payload("k1"), "tag").await.unwrap();
    assert_eq!(store.len(), 1);
}

struct Marked<const C: char> {
    idempotency: Idempotency,
}

impl Marked<'#'> {
    #[idempotent(handle = self.idempotency, payload = request, key = "id")]
    async fn handle(&self, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(7)
    }
}

#[tokio::test]
async fn a_hash_sign_in_a_type_name_is_escaped() {
    // A `char` const argument is printed as written; `#` separates the key in stored ids.
    let (store, handle) = setup();
    Marked::<'#'> {
        idempotency: handle,
    }
    .handle(payload("k1"))
    .await
    .unwrap();
    assert_stored_as(&store, "default_operation::Marked<'%23'>::handle");
}

#[tokio::test]
async fn an_explicit_operation_wins() {
    #[idempotent(handle = handle, payload = request, key = "id", operation = "named")]
    async fn renamed(handle: &Idempotency, request: Value) -> Result<u32, Error> {
        let _ = request;
        Ok(8)
    }
    let (store, handle) = setup();
    renamed(&handle, payload("k1")).await.unwrap();
    assert_stored_as(&store, "named");
}

//! The `#[idempotent]` attribute. Use it through `lambda_idempotency::idempotent`, whose
//! documentation describes every argument with an example.

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Makes an `async fn` run at most once per idempotency key.
///
/// The first call with a key claims it (one conditional write), runs the body and stores
/// its `Ok` value; later calls with the same key return the stored value without running
/// the body. A call while another holds the key fails with
/// `lambda_idempotency::Error::AlreadyInProgress`; if the body fails, the claim is released
/// and the body's own error is returned.
///
/// The signature stays as written. It must be an `async fn` returning `Result<T, E>`, with
/// `T: Serialize + DeserializeOwned` (stored and replayed) and
/// `E: From<lambda_idempotency::Error> + Display` (`lambda_runtime::Error`,
/// `anyhow::Error` and `lambda_idempotency::Error` all qualify).
///
/// # Arguments
///
/// | argument | meaning |
/// |---|---|
/// | `handle = expr` | **required**: the `Idempotency` (store and settings): a static, a field, an argument |
/// | `key = "field"` or `key = "/json/pointer"` | the key is that value of the payload; a name with a `/` must be a pointer (`"order/id"` is refused: `"/order/id"` for the nested field, `"/order~1id"` for one so named) |
/// | `hash = ["field", ...]` or `hash = Type::FIELDS` | the key is the SHA-256 of those fields' canonical JSON; with `key`, the fallback when the key field is absent |
/// | `payload = arg` | the argument the key is read from; optional when there is one argument |
/// | `validate = ["field", ...]` or `validate = Type::FIELDS` | a later call with the same key and different fields fails with `PayloadMismatch` |
/// | `operation = "name"` | keeps this function's keys apart from others'; default for a module's function: its module path and name (see below); **required** on methods |
/// | `key_prefix = "prefix"` | the stored id's prefix instead of `{function_name}.{operation}`: stable across renames |
/// | `context = arg` | a `lambda_runtime::Context` argument whose deadline ends the lease |
/// | `refused_writes_retryable` | a function returning `WithWrites` whose writes are refused by their own condition releases its claim, and the next delivery runs it again (`Operation::refused_writes_retryable`); without it the refusal is kept as the answer |
/// | `with_outcome` | also generates `<name>_with_outcome`, returning `Result<(T, Outcome), E>`: how the call was answered |
/// | `crate = "path"` | the path of `lambda_idempotency` if it is renamed or re-exported; default `::lambda_idempotency` |
///
/// `hash` and `validate` take the field names written out, or the path of a constant
/// holding them (`[&str; N]`, `&[&str]` or `Vec<&str>`), so one list serves both.
///
/// Without `context`, the lease ends with the invocation set by `SqsBatch` or
/// `with_context`, or after the configured lease.
///
/// # Stored ids: what changes them and what does not
///
/// A stored id is `{function_name}.{operation}#{key}` (or `{key_prefix}#{key}`). The
/// default `operation` of a function declared in a module is `module_path!()` and the
/// function's name, `my_crate::orders::process`: text the language keeps, so a compiler
/// upgrade never changes it, and `orders::process` and `refunds::process` never share ids.
/// A function and its `_with_outcome` companion are one operation.
///
/// - **Changes the ids** (a duplicate of a call made before the deploy runs again):
///   renaming the function, moving it to another module, renaming the crate (or the
///   Lambda function, the `function_name`), changing `operation` or `key_prefix`, and
///   changing the key or hash fields.
/// - **Keeps them**: upgrading Rust, reordering or reformatting code, changing the body,
///   the arguments other than the key, the return type, or `validate` (a changed
///   `validate` list makes old records mismatch instead).
///
/// Methods need `operation = "..."` (or `key_prefix`): a default would include the type's
/// name, which only `std::any::type_name` gives, and its text is no promise from one
/// compiler to the next. So do functions declared inside another function's body (a
/// doctest without its own `fn main` is one) and associated functions without `self`: the
/// macro declares a hidden item `<name>_needs_an_operation_argument_unless_declared_in_a_module`
/// beside the function, and the compiler's error names it (a struct "not supported in
/// `impl`s", "cannot find type … in module `self`", or "mismatched types"). One shape
/// `module_path!()` cannot tell apart is left: a `mod` declared inside a function's body,
/// whose functions share the path of the same `mod` in another function. Pin `operation`
/// (or `key_prefix`) anyway where the function may move.
///
/// # `handle`, `key` and `validate`
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use serde::{Deserialize, Serialize};
/// use std::sync::LazyLock;
///
/// static IDEMPOTENCY: LazyLock<Idempotency> =
///     LazyLock::new(|| Idempotency::new(MemoryStore::new()));
///
/// #[derive(Serialize, Deserialize)]
/// struct Request { request_id: String, prompt: String }
///
/// #[idempotent(handle = IDEMPOTENCY, key = "request_id", validate = ["prompt"])]
/// async fn generate(request: Request) -> Result<String, lambda_runtime::Error> {
///     Ok(format!("generated for {}", request.prompt))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let first = generate(Request { request_id: "r1".into(), prompt: "hi".into() }).await.unwrap();
/// let again = generate(Request { request_id: "r1".into(), prompt: "hi".into() }).await.unwrap();
/// assert_eq!(first, again);
/// // Same key, different prompt: refused, the first result is not returned.
/// assert!(generate(Request { request_id: "r1".into(), prompt: "bye".into() }).await.is_err());
/// # }
/// ```
///
/// # `hash`, with `key` as the first choice
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use serde_json::{Value, json};
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// static CALLS: AtomicU32 = AtomicU32::new(0);
///
/// #[idempotent(handle = handle, payload = body, key = "request_id", hash = ["model", "messages"])]
/// async fn complete(handle: &Idempotency, body: Value) -> Result<u32, lambda_idempotency::Error> {
///     Ok(CALLS.fetch_add(1, Ordering::SeqCst))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let handle = Idempotency::new(MemoryStore::new());
/// // No request_id: the hash of model and messages is the key; `submitted_at` is ignored.
/// complete(&handle, json!({"model": "m", "messages": [], "submitted_at": 1})).await.unwrap();
/// complete(&handle, json!({"model": "m", "messages": [], "submitted_at": 2})).await.unwrap();
/// assert_eq!(CALLS.load(Ordering::SeqCst), 1);
/// # }
/// ```
///
/// # Methods, `operation` and `key_prefix`
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { order_id: u64, amount: u64 }
///
/// struct Payments { idempotency: Idempotency }
///
/// impl Payments {
///     #[idempotent(handle = self.idempotency, payload = order, key = "order_id",
///                  operation = "charge", key_prefix = "payments.charge.v1")]
///     async fn charge_card(&self, order: Order) -> Result<u64, lambda_runtime::Error> {
///         Ok(order.amount)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let payments = Payments { idempotency: Idempotency::new(MemoryStore::new()) };
/// assert_eq!(payments.charge_card(Order { order_id: 7, amount: 30 }).await.unwrap(), 30);
/// # }
/// ```
///
/// # `context`: the lease ends with the invocation
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use lambda_runtime::{Context, LambdaEvent};
/// use serde_json::Value;
/// use std::sync::LazyLock;
///
/// static IDEMPOTENCY: LazyLock<Idempotency> =
///     LazyLock::new(|| Idempotency::new(MemoryStore::new()));
///
/// #[idempotent(handle = IDEMPOTENCY, payload = event, key = "/detail/id", context = ctx)]
/// async fn on_event(event: Value, ctx: Context) -> Result<(), lambda_runtime::Error> {
///     Ok(())
/// }
///
/// // With lambda_runtime:
/// async fn handler(event: LambdaEvent<Value>) -> Result<(), lambda_runtime::Error> {
///     on_event(event.payload, event.context).await
/// }
/// # fn main() { let _ = handler; }
/// ```
///
/// # `with_outcome`: how the call was answered
///
/// The function keeps its signature; `with_outcome` adds a second function, named
/// `<name>_with_outcome`, with the same visibility, receiver and arguments, that returns the
/// value together with the `lambda_idempotency::Outcome`: the body ran (`Executed`, or
/// `TookOver` an abandoned claim), or a stored result was returned (`Replayed`,
/// `ReplayedFromCache`, or `Joined`: a twin running in the same process at the same time). `Outcome::ran` tells the two apart. The body is generated once,
/// in the companion; the function calls it and drops the outcome. Both share stored ids:
/// adding the flag changes no key.
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, Outcome, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { order_id: u64, amount: u64 }
///
/// struct Payments { idempotency: Idempotency }
///
/// impl Payments {
///     #[idempotent(handle = self.idempotency, key = "order_id", operation = "charge", with_outcome)]
///     async fn charge(&self, order: Order) -> Result<u64, lambda_runtime::Error> {
///         Ok(order.amount)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let payments = Payments { idempotency: Idempotency::new(MemoryStore::new()) };
/// let order = || Order { order_id: 7, amount: 30 };
/// let (amount, outcome) = payments.charge_with_outcome(order()).await.unwrap();
/// assert_eq!((amount, outcome), (30, Outcome::Executed));
/// let (_, outcome) = payments.charge_with_outcome(order()).await.unwrap();
/// assert_eq!(outcome, Outcome::Replayed);
/// assert!(!outcome.ran(), "the body did not run again");
/// // The function itself is still there.
/// assert_eq!(payments.charge(order()).await.unwrap(), 30);
/// # }
/// ```
///
/// The arguments are passed on by name, so each must be a plain `name: Type`, not a
/// pattern. A trait impl cannot hold the extra method: call an inherent
/// `with_outcome` method from the trait method instead. In an `impl`, a function that
/// takes no `self` must name `Self` in its signature (for example `this: &Self`): the
/// macro cannot otherwise tell it from a free function, and calls the companion by its
/// bare name (`cannot find function ..._with_outcome`).
///
/// # `hash` and `validate` from one constant
///
/// ```
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct ChatRequest { request_id: Option<String>, model: String, prompt: String }
///
/// impl ChatRequest {
///     /// What makes two requests the same: the key without a `request_id`, and what a
///     /// reused `request_id` must match.
///     const CANONICAL_FIELDS: [&'static str; 2] = ["model", "prompt"];
/// }
///
/// #[idempotent(handle = handle, payload = request, key = "request_id",
///              hash = ChatRequest::CANONICAL_FIELDS, validate = ChatRequest::CANONICAL_FIELDS)]
/// async fn chat(handle: &Idempotency, request: ChatRequest) -> Result<String, lambda_runtime::Error> {
///     Ok(format!("answer to {}", request.prompt))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let handle = Idempotency::new(MemoryStore::new());
/// let request = |id: &str, prompt: &str| ChatRequest {
///     request_id: Some(id.into()), model: "m".into(), prompt: prompt.into(),
/// };
/// chat(&handle, request("r1", "hi")).await.unwrap();
/// assert!(chat(&handle, request("r1", "bye")).await.is_err(), "validated");
/// # }
/// ```
///
/// The constant is read once, when the function is first called: a constant of one of the
/// function's type parameters (`T::FIELDS`) is refused, since every `T` shares the
/// operation.
///
/// # `crate`: a renamed or re-exported dependency
///
/// The generated code names `::lambda_idempotency`. If the dependency has another name
/// (`idem = { package = "lambda-idempotency", ... }` in `Cargo.toml`) or is reached through
/// another crate's re-export, give its path as a string:
///
/// ```
/// mod framework {
///     pub use lambda_idempotency as idempotency;
/// }
/// use framework::idempotency::{Idempotency, MemoryStore, idempotent};
///
/// #[idempotent(crate = "framework::idempotency", handle = handle, payload = request, key = "id")]
/// async fn process(handle: &Idempotency, request: serde_json::Value) -> Result<u32, framework::idempotency::Error> {
///     Ok(1)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let handle = Idempotency::new(MemoryStore::new());
/// assert_eq!(process(&handle, serde_json::json!({"id": 1})).await.unwrap(), 1);
/// # }
/// ```
///
/// With a renamed dependency, `#[idem::idempotent(crate = "idem", ...)]`.
///
/// # In an `#[async_trait]` impl
///
/// Put `#[idempotent]` on the method, inside the `#[async_trait]` impl (or trait, for a
/// default method). `#[async_trait]` expands first and turns the `async fn` into a function
/// returning `Pin<Box<dyn Future<Output = ...> + Send>>`; `#[idempotent]` recognises that
/// shape and wraps the future's body. Above the impl, `#[idempotent]` is an error: it
/// goes on each method.
///
/// ```
/// use async_trait::async_trait;
/// use lambda_idempotency::{Idempotency, MemoryStore, idempotent};
/// use serde_json::{Value, json};
///
/// #[async_trait]
/// trait Handler {
///     async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error>;
/// }
///
/// struct Worker { idempotency: Idempotency }
///
/// #[async_trait]
/// impl Handler for Worker {
///     #[idempotent(handle = self.idempotency, key = "id", operation = "Worker::handle")]
///     async fn handle(&self, request: Value) -> Result<u32, lambda_idempotency::Error> {
///         Ok(1)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let worker: Box<dyn Handler> = Box::new(Worker { idempotency: Idempotency::new(MemoryStore::new()) });
/// assert_eq!(worker.handle(json!({"id": 1})).await.unwrap(), 1);
/// # }
/// ```
///
/// # Next to `#[tracing::instrument]`
///
/// Put `#[idempotent]` first (outermost) so the span covers the claim and the replay too;
/// other attributes and doc comments are kept. With `with_outcome`, every attribute but
/// the doc comment is kept on both functions (the companion gets a doc comment of its
/// own), so each has its span.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let expanded = syn::parse::<attr::Args>(args).and_then(|args| {
        let item = syn::parse::<syn::Item>(item)?;
        expand::expand(args, item)
    });
    match expanded {
        Ok(tokens) => tokens.into(),
        // The function stays as written, so the one error is not followed by others
        // (unused imports, missing function) that the mistake did not cause.
        Err(err) => {
            let err = err.into_compile_error();
            quote::quote!(#err #[allow(unused_variables)] #original).into()
        }
    }
}

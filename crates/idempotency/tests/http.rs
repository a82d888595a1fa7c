//! The HTTP `Idempotency-Key` layer, through lambda_http's own adapter (the code
//! `lambda_http::run` runs) with an event of each kind: REST API, HTTP API, ALB and
//! Function URL. Over the memory store, counted by the fault wrapper; every store over
//! real HTTP is in the workspace's `tests/tests/every_backend/http.rs`.
#![cfg(feature = "lambda-http")]

use lambda_http::request::LambdaRequest;
use lambda_http::tower::{Service, ServiceBuilder};
use lambda_http::{Adapter, Body, Context, LambdaEvent, Request, Response};
use lambda_idempotency::http::{CallerScope, IdempotencyKeyLayer};
use lambda_idempotency::store::StoreOp;
use lambda_idempotency::store::faulty::{Fault, FaultyStore};
use lambda_idempotency::{Idempotency, MemoryStore};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

const REST: &str = include_str!("../../../events/rest-api-request.json");
const HTTP_API: &str = include_str!("../../../events/http-api-request.json");
const ALB: &str = include_str!("../../../events/alb-request.json");
const FUNCTION_URL: &str = include_str!("../../../events/function-url-request.json");

/// A handler that counts its calls and does what the `x-test` header says (a comma-separated
/// list): `status=N`, `binary`, `size=N` (a body of N bytes), `fail`, `panic`, `gate`
/// (waits for a permit first). Headers
/// other than the named ones are not in the fingerprint, so a test can change the
/// handler's answer without changing the request.
#[derive(Clone)]
struct App {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl App {
    fn new() -> Self {
        App {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn handle(self, request: Request) -> Result<Response<Body>, lambda_http::Error> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let tests: Vec<String> = request
            .headers()
            .get("x-test")
            .map(|v| v.to_str().unwrap().split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        let has = |t: &str| tests.iter().any(|x| x == t);
        let value = |prefix: &str| tests.iter().find_map(|x| x.strip_prefix(prefix));
        if has("gate") {
            let _permit = self.gate.acquire().await.unwrap();
        }
        // A gate that lets exactly one call through per permit.
        if has("gate1") {
            self.gate.acquire().await.unwrap().forget();
        }
        if has("panic") {
            panic!("the handler panicked");
        }
        if has("fail") {
            return Err("the handler failed".into());
        }
        let content_type = if has("binary") {
            "application/octet-stream"
        } else {
            "application/json"
        };
        let response = Response::builder()
            .header("content-type", content_type)
            .header("x-call", n.to_string());
        let body = if has("binary") {
            Body::from(vec![0x89, b'P', b'N', b'G', 0x00, 0xff, 0xfe, n as u8])
        } else if let Some(size) = value("size=") {
            Body::from("x".repeat(size.parse().unwrap()))
        } else {
            let echo = String::from_utf8_lossy(request.body()).into_owned();
            Body::from(json!({"call": n, "echo": echo}).to_string())
        };
        if has("context") {
            // What the handler inherits from where the layer was called.
            let context = json!({
                "call": n,
                "tenant": lambda_idempotency::current_tenant().as_deref(),
                "deadline": lambda_idempotency::current_deadline().is_some(),
            });
            return Ok(response.body(Body::from(context.to_string())).unwrap());
        }
        let status = value("status=").map_or(200, |s| s.parse().unwrap());
        Ok(response.status(status).body(body).unwrap())
    }
}

impl Service<Request> for App {
    type Response = Response<Body>;
    type Error = lambda_http::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, lambda_http::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        Box::pin(self.clone().handle(request))
    }
}

/// The layered service, as lambda_http runs it.
type Handler = lambda_idempotency::http::IdempotencyKeyService<App>;

fn layered(app: &App, layer: IdempotencyKeyLayer) -> Handler {
    ServiceBuilder::new().layer(layer).service(app.clone())
}

/// An answer as the runtime sends it back: status, headers (lower case), body bytes.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// Sends `event` (edited by `edit`) through the adapter.
async fn send(service: &Handler, event: &str, edit: impl FnOnce(&mut Value)) -> Answer {
    send_in(service, event, edit, Context::default()).await
}

/// [`send`] with the invocation's context (its deadline).
async fn send_in(
    service: &Handler,
    event: &str,
    edit: impl FnOnce(&mut Value),
    context: Context,
) -> Answer {
    let mut event: Value = serde_json::from_str(event).unwrap();
    edit(&mut event);
    let request: LambdaRequest = serde_json::from_value(event).unwrap();
    let mut adapter = Adapter::from(service.clone());
    std::future::poll_fn(|cx| adapter.poll_ready(cx))
        .await
        .unwrap();
    let response = adapter
        .call(LambdaEvent::new(request, context))
        .await
        .unwrap_or_else(|e| panic!("the invocation failed: {e:?}"));
    let response = serde_json::to_value(response).unwrap();
    let mut headers = HashMap::new();
    for (name, value) in response["headers"].as_object().into_iter().flatten() {
        headers.insert(name.to_lowercase(), value.as_str().unwrap().to_owned());
    }
    for (name, values) in response["multiValueHeaders"]
        .as_object()
        .into_iter()
        .flatten()
    {
        headers.insert(name.to_lowercase(), values[0].as_str().unwrap().to_owned());
    }
    let body = response["body"].as_str().unwrap_or("");
    let body = if response["isBase64Encoded"] == true {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    } else {
        body.as_bytes().to_vec()
    };
    Answer {
        status: response["statusCode"].as_u64().unwrap() as u16,
        headers,
        body,
    }
}

fn set_header(event: &mut Value, name: &str, value: &str) {
    event["headers"][name] = json!(value);
    if event.get("multiValueHeaders").is_some() {
        event["multiValueHeaders"][name] = json!([value]);
    }
}

fn remove_header(event: &mut Value, name: &str) {
    for field in ["headers", "multiValueHeaders"] {
        if let Some(headers) = event[field].as_object_mut() {
            headers.retain(|k, _| !k.eq_ignore_ascii_case(name));
        }
    }
}

fn store() -> FaultyStore<MemoryStore> {
    FaultyStore::new(MemoryStore::new())
}

fn layer(store: &FaultyStore<MemoryStore>) -> lambda_idempotency::http::IdempotencyKeyLayerBuilder {
    IdempotencyKeyLayer::builder(Idempotency::new(store.clone()), "generate")
}

#[tokio::test]
async fn each_event_kind_runs_once_and_replays_with_the_replay_header() {
    for (kind, event) in [
        ("REST API", REST),
        ("HTTP API", HTTP_API),
        ("ALB", ALB),
        ("Function URL", FUNCTION_URL),
    ] {
        let store = store();
        let app = App::new();
        // API Gateway's authorizer, or (ALB has none) the bearer token.
        let scope = CallerScope::lambda_authorizer().or(CallerScope::authorization_header());
        let service = layered(&app, layer(&store).scope(scope).build().unwrap());
        let first = send(&service, event, |_| {}).await;
        let second = send(&service, event, |_| {}).await;
        assert_eq!((first.status, second.status), (200, 200), "{kind}");
        assert_eq!(app.calls(), 1, "{kind}: one handler call for two requests");
        assert_eq!(first.body, second.body, "{kind}: the same body");
        assert!(!first.replayed() && second.replayed(), "{kind}");
        assert_eq!(
            first.header("x-call"),
            Some("1"),
            "{kind}: the handler's own headers"
        );
        assert_eq!(
            second.header("x-call"),
            None,
            "{kind}: only allowed headers replay"
        );
        assert_eq!(second.header("content-type"), Some("application/json"));
        assert_eq!(
            (
                store.requests(StoreOp::Claim),
                store.requests(StoreOp::Complete)
            ),
            (2, 1),
            "{kind}: 2 store requests for the first, 1 for the replay"
        );
    }
}

#[tokio::test]
async fn the_authorizer_keeps_callers_apart() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let ada = send(&service, REST, |_| {}).await;
    let bob = send(&service, REST, |e| {
        e["requestContext"]["authorizer"]["principalId"] = json!("user-bob")
    })
    .await;
    let bob_again = send(&service, REST, |e| {
        e["requestContext"]["authorizer"]["principalId"] = json!("user-bob")
    })
    .await;
    assert_eq!(
        app.calls(),
        2,
        "the same key from two callers is two requests"
    );
    assert_eq!(ada.json()["call"], 1);
    assert_eq!(bob.json()["call"], 2, "bob never sees ada's response");
    assert_eq!(bob_again.json()["call"], 2);
    assert!(bob_again.replayed());
    // JWT subjects of the HTTP API, and IAM callers of a Function URL, likewise.
    let other_sub = send(&service, HTTP_API, |e| {
        e["requestContext"]["authorizer"]["jwt"]["claims"]["sub"] = json!("user-bob")
    })
    .await;
    let ada_jwt = send(&service, HTTP_API, |_| {}).await;
    assert!(!other_sub.replayed() && !ada_jwt.replayed());
    assert_eq!(app.calls(), 4);
}

/// A REST API request signed with IAM credentials (no authorizer principal): `identity`
/// holds the caller's ARN and, for an identity pool's users, their Cognito identity.
fn rest_iam(e: &mut Value, arn: &str, cognito_identity: Option<&str>) {
    e["requestContext"]["authorizer"] = json!({});
    let identity = &mut e["requestContext"]["identity"];
    identity["userArn"] = json!(arn);
    if let Some(id) = cognito_identity {
        identity["cognitoIdentityPoolId"] = json!("us-east-1:pool");
        identity["cognitoIdentityId"] = json!(id);
    }
}

/// A Function URL (or HTTP API) request with AWS_IAM auth, from `arn`, with the Cognito
/// identity an identity pool's user carries.
fn url_iam(e: &mut Value, arn: &str, cognito_identity: Option<&str>) {
    let iam = &mut e["requestContext"]["authorizer"]["iam"];
    iam["userArn"] = json!(arn);
    if let Some(id) = cognito_identity {
        iam["cognitoIdentity"] =
            json!({"amr": ["authenticated"], "identityId": id, "identityPoolId": "us-east-1:pool"});
    }
}

const POOL_SESSION: &str =
    "arn:aws:sts::123456789012:assumed-role/Cognito_PoolAuth_Role/CognitoIdentityCredentials";

#[tokio::test]
async fn every_identity_source_keeps_callers_apart_or_refuses_a_shared_value() {
    // A scope is a value no two callers share. For each source: two callers are two
    // requests; the same caller again is a replay.
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, &str, Edit, Edit)> = vec![
        (
            "REST: identity pool users behind one role session",
            REST,
            Box::new(|e| rest_iam(e, POOL_SESSION, Some("us-east-1:ada"))),
            Box::new(|e| rest_iam(e, POOL_SESSION, Some("us-east-1:bob"))),
        ),
        (
            "REST: IAM users",
            REST,
            Box::new(|e| rest_iam(e, "arn:aws:iam::123456789012:user/ada", None)),
            Box::new(|e| rest_iam(e, "arn:aws:iam::123456789012:user/bob", None)),
        ),
        (
            "REST: assumed-role sessions",
            REST,
            Box::new(|e| rest_iam(e, "arn:aws:sts::123456789012:assumed-role/R/ada", None)),
            Box::new(|e| rest_iam(e, "arn:aws:sts::123456789012:assumed-role/R/bob", None)),
        ),
        (
            "Function URL: identity pool users behind one role session",
            FUNCTION_URL,
            Box::new(|e| url_iam(e, POOL_SESSION, Some("us-east-1:ada"))),
            Box::new(|e| url_iam(e, POOL_SESSION, Some("us-east-1:bob"))),
        ),
        (
            "HTTP API: machine clients' tokens without a subject",
            HTTP_API,
            Box::new(|e| {
                let claims = &mut e["requestContext"]["authorizer"]["jwt"]["claims"];
                claims.as_object_mut().unwrap().remove("sub");
                claims["client_id"] = json!("client-a");
            }),
            Box::new(|e| {
                let claims = &mut e["requestContext"]["authorizer"]["jwt"]["claims"];
                claims.as_object_mut().unwrap().remove("sub");
                claims["client_id"] = json!("client-b");
            }),
        ),
        (
            "HTTP API: mutual TLS client certificates",
            HTTP_API,
            Box::new(|e| mtls(e, "01")),
            Box::new(|e| mtls(e, "02")),
        ),
    ];
    for (what, event, first, second) in cases {
        let store = store();
        let app = App::new();
        let service = layered(&app, layer(&store).build().unwrap());
        let a = send(&service, event, &*first).await;
        let b = send(&service, event, &*second).await;
        let a_again = send(&service, event, &*first).await;
        assert_eq!((a.status, b.status), (200, 200), "{what}: {}", b.json());
        assert!(
            !b.replayed(),
            "{what}: a second caller never sees the first's response"
        );
        assert!(
            a_again.replayed(),
            "{what}: the same caller's retry is replayed"
        );
        assert_eq!(app.calls(), 2, "{what}");
    }

    // Only a value many callers share: refused with the reason, never shared.
    let refused: Vec<(&str, &str, Edit, &str)> = vec![
        (
            "REST: the pool's role session without an identity",
            REST,
            Box::new(|e| rest_iam(e, POOL_SESSION, None)),
            "role session",
        ),
        (
            "Function URL: the pool's role session without an identity",
            FUNCTION_URL,
            Box::new(|e| url_iam(e, POOL_SESSION, None)),
            "role session",
        ),
        (
            "REST: a web identity's default session name",
            REST,
            Box::new(|e| {
                rest_iam(
                    e,
                    "arn:aws:sts::123456789012:assumed-role/WebRole/web-identity",
                    None,
                )
            }),
            "role session",
        ),
        (
            "REST: an API key alone",
            REST,
            Box::new(|e| {
                e["requestContext"]["authorizer"] = json!({});
                e["requestContext"]["identity"]["apiKeyId"] = json!("key-1");
            }),
            "API key",
        ),
    ];
    for (what, event, edit, reason) in refused {
        let store = store();
        let app = App::new();
        let service = layered(&app, layer(&store).build().unwrap());
        let answer = send(&service, event, &*edit).await;
        assert_eq!(answer.status, 401, "{what}");
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(detail.contains(reason), "{what}: {detail}");
        assert_eq!(app.calls(), 0, "{what}");
    }
}

/// An HTTP API request without an authorizer, over mutual TLS with a certificate of
/// serial number `serial`.
fn mtls(e: &mut Value, serial: &str) {
    e["requestContext"]
        .as_object_mut()
        .unwrap()
        .remove("authorizer");
    e["requestContext"]["authentication"] = json!({"clientCert": {
        "clientCertPem": "-----BEGIN CERTIFICATE-----", "issuerDN": "CN=Example CA",
        "serialNumber": serial, "subjectDN": "CN=client",
        "validity": {"notBefore": "Jan 1 00:00:00 2026 GMT", "notAfter": "Jan 1 00:00:00 2027 GMT"}}});
}

#[tokio::test]
async fn without_a_caller_the_default_scope_refuses_with_401() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    // ALB events carry no identity; nor does an HTTP API without an authorizer.
    let alb = send(&service, ALB, |_| {}).await;
    let bare = send(&service, HTTP_API, |e| {
        e["requestContext"]
            .as_object_mut()
            .unwrap()
            .remove("authorizer");
    })
    .await;
    for answer in [&alb, &bare] {
        assert_eq!(answer.status, 401);
        assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert!(
            answer.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("#caller-unidentified")
        );
    }
    assert_eq!(app.calls(), 0);
    assert_eq!(store.total_requests(), 0);
}

#[tokio::test]
async fn a_missing_key_is_400_unless_the_key_is_optional() {
    let store = store();
    let app = App::new();
    let required = layered(&app, layer(&store).build().unwrap());
    let answer = send(&required, HTTP_API, |e| remove_header(e, "idempotency-key")).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json()["status"], 400);
    assert!(
        answer.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("#key-missing")
    );
    assert_eq!(app.calls(), 0);

    let optional = layered(&app, layer(&store).optional().build().unwrap());
    for _ in 0..2 {
        let answer = send(&optional, HTTP_API, |e| remove_header(e, "idempotency-key")).await;
        assert_eq!(answer.status, 200);
        assert!(!answer.replayed());
    }
    assert_eq!(app.calls(), 2, "without a key, each request runs");
    assert_eq!(store.total_requests(), 0);
}

#[tokio::test]
async fn a_malformed_or_oversized_key_is_400_with_its_reason() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    // `k1,k1`: an HTTP API joins a header sent twice with a comma.
    for bad in [
        "\"unterminated",
        "has space",
        &"k".repeat(256),
        "\"\"",
        "k1,k1",
    ] {
        let answer = send(&service, HTTP_API, |e| {
            set_header(e, "idempotency-key", bad)
        })
        .await;
        assert_eq!(answer.status, 400, "{bad:?}");
        assert!(
            answer.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("#key-invalid")
        );
        assert!(
            answer.json()["detail"]
                .as_str()
                .unwrap()
                .contains("idempotency-key")
        );
    }
    assert_eq!(app.calls(), 0);
}

#[tokio::test]
async fn the_quoted_and_the_bare_key_are_one_key_in_any_header_case() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    // The REST event keeps `Idempotency-Key` as the client wrote it.
    let quoted = send(&service, REST, |_| {}).await;
    let bare = send(&service, REST, |e| {
        remove_header(e, "idempotency-key");
        set_header(e, "IDEMPOTENCY-KEY", "5b7c1a52-rest");
    })
    .await;
    assert_eq!(app.calls(), 1);
    assert!(!quoted.replayed() && bare.replayed());
}

#[tokio::test]
async fn a_reused_key_with_another_request_is_422() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .fingerprint_headers(["x-model-version"])
            .build()
            .unwrap(),
    );
    send(&service, HTTP_API, |_| {}).await;
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: [(&str, Edit); 4] = [
        ("body", Box::new(|e| e["body"] = json!("{\"other\":1}"))),
        ("path", Box::new(|e| e["rawPath"] = json!("/generate/v2"))),
        (
            "query",
            Box::new(|e| e["rawQueryString"] = json!("stream=true")),
        ),
        (
            "header",
            Box::new(|e| set_header(e, "x-model-version", "2")),
        ),
    ];
    for (what, edit) in edits {
        let answer = send(&service, HTTP_API, edit).await;
        assert_eq!(answer.status, 422, "another {what}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert!(
            answer.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("#key-reused")
        );
    }
    // A header that is not fingerprinted does not count.
    let answer = send(&service, HTTP_API, |e| set_header(e, "x-other", "1")).await;
    assert!(answer.replayed());
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn a_twin_in_progress_is_409_with_retry_after_then_a_replay() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(twin.status, 409);
    assert!(
        twin.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("#request-in-progress")
    );
    // No deadline here: the lease is the handle's default, 15 minutes; Retry-After is
    // capped at 5 s (a retry costs one store request, and the twin may end in seconds).
    assert_eq!(twin.header("retry-after"), Some("5"));
    app.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    let after = send(&service, HTTP_API, |_| {}).await;
    assert!(after.replayed());
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn retry_after_is_the_time_to_the_twins_lease_end_up_to_its_cap() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .max_retry_after(Duration::from_secs(3600))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = send(&service, HTTP_API, |_| {}).await;
    // The lease: the handle's default 15 minutes, less the moments since the claim.
    let retry_after: u64 = twin.header("retry-after").unwrap().parse().unwrap();
    assert!((899..=900).contains(&retry_after), "{retry_after}");
    app.gate.add_permits(1);
    first.await.unwrap();
}

#[tokio::test]
async fn waiting_for_a_twin_in_this_process_reads_nothing_from_the_store() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    app.gate.add_permits(1);
    let (first, twin) = (first.await.unwrap(), twin.await.unwrap());
    assert_eq!((first.status, twin.status), (200, 200));
    assert_eq!(first.body, twin.body);
    assert!(twin.replayed());
    assert_eq!(app.calls(), 1);
    assert_eq!(
        (store.requests(StoreOp::Claim), store.requests(StoreOp::Get)),
        (1, 0),
        "the twin waited in memory: no claim, no read"
    );
}

#[tokio::test]
async fn waiting_for_a_twin_elsewhere_reads_its_record_with_backoff() {
    let store = store();
    let app = App::new();
    // Two layers over two handles: two Lambda environments on one table.
    let here = layered(&app, layer(&store).build().unwrap());
    let elsewhere = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let here = here.clone();
        async move { send(&here, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = tokio::spawn({
        let elsewhere = elsewhere.clone();
        async move { send(&elsewhere, HTTP_API, |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    app.gate.add_permits(1);
    let (first, twin) = (first.await.unwrap(), twin.await.unwrap());
    assert_eq!(twin.status, 200);
    assert_eq!(first.body, twin.body);
    assert!(twin.replayed());
    assert_eq!(app.calls(), 1);
    let reads = store.requests(StoreOp::Get);
    // Pauses of 50, 100, 200, 400 ms...: about 4 reads in 400 ms, not one per millisecond.
    assert!((2..=6).contains(&reads), "{reads} reads");
}

/// A read that hangs while a request waits for its twin is cut off by the store attempt
/// timeout and answered 503 (retry later), never left waiting, never run unprotected.
#[tokio::test]
async fn a_read_that_hangs_during_a_wait_is_503() {
    let store = store();
    let app = App::new();
    let here = layered(&app, layer(&store).build().unwrap());
    let patient = Idempotency::builder(store.clone())
        .store_attempt_timeout(Duration::from_millis(100))
        .build();
    let elsewhere = layered(
        &app,
        IdempotencyKeyLayer::builder(patient, "generate")
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let here = here.clone();
        async move { send(&here, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.inject(StoreOp::Get, Fault::Hang, 1);
    let started = std::time::Instant::now();
    let twin = send(&elsewhere, HTTP_API, |_| {}).await;
    assert_eq!(twin.status, 503);
    assert!(
        twin.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("#store-unavailable")
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    app.gate.add_permits(1);
    first.await.unwrap();
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn a_wait_that_runs_out_is_409() {
    let store = store();
    let app = App::new();
    let here = layered(&app, layer(&store).build().unwrap());
    let impatient = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let here = here.clone();
        async move { send(&here, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = send(&impatient, HTTP_API, |_| {}).await;
    assert_eq!(twin.status, 409);
    assert!(twin.header("retry-after").is_some());
    app.gate.add_permits(1);
    first.await.unwrap();
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn a_twin_released_while_waited_for_runs_here() {
    let store = store();
    let app = App::new();
    let here = layered(&app, layer(&store).build().unwrap());
    let elsewhere = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    // The first answers 503: not stored, its key released; the waiting twin then runs.
    let first = tokio::spawn({
        let here = here.clone();
        async move {
            send(&here, HTTP_API, |e| {
                set_header(e, "x-test", "gate,status=503")
            })
            .await
        }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = tokio::spawn({
        let elsewhere = elsewhere.clone();
        async move { send(&elsewhere, HTTP_API, |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    app.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 503);
    let twin = twin.await.unwrap();
    assert_eq!(twin.status, 200);
    assert!(!twin.replayed());
    assert_eq!(twin.json()["call"], 2, "the twin ran the handler itself");
}

#[tokio::test]
async fn responses_a_retry_may_change_are_not_stored() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    for status in ["503", "500", "429", "408"] {
        let header = format!("status={status}");
        let first = send(&service, HTTP_API, |e| set_header(e, "x-test", &header)).await;
        assert_eq!(first.status.to_string(), status);
        assert!(
            first.header("x-call").is_some(),
            "the handler's own response"
        );
    }
    assert_eq!(app.calls(), 4, "each released its key, so each retry ran");
    assert_eq!(store.requests(StoreOp::Release), 4);
    // A deterministic client error is stored and replayed.
    let not_found = send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "status=404")
    })
    .await;
    let again = send(&service, HTTP_API, |_| {}).await;
    assert_eq!((not_found.status, again.status), (404, 404));
    assert!(again.replayed());
    assert_eq!(app.calls(), 5);
}

#[tokio::test]
async fn the_store_rule_is_the_users_to_change() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .store_when(|status| status.is_success())
            .build()
            .unwrap(),
    );
    send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "status=404")
    })
    .await;
    send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "status=404")
    })
    .await;
    assert_eq!(app.calls(), 2, "a 404 is not stored under this rule");
}

#[tokio::test]
async fn a_handler_error_releases_the_key_and_reaches_the_runtime() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let mut event: Value = serde_json::from_str(HTTP_API).unwrap();
    set_header(&mut event, "x-test", "fail");
    let request: LambdaRequest = serde_json::from_value(event).unwrap();
    let error = Adapter::from(service.clone())
        .call(LambdaEvent::new(request, Context::default()))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "the handler failed");
    assert_eq!(store.requests(StoreOp::Release), 1);
    let retry = send(&service, HTTP_API, |_| {}).await;
    assert_eq!((retry.status, app.calls()), (200, 2));
}

#[tokio::test]
async fn a_handler_panic_releases_the_key_and_resumes() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let panicked = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "panic")).await }
    })
    .await
    .unwrap_err();
    assert!(panicked.is_panic(), "the panic reaches the caller");
    assert_eq!(
        store.requests(StoreOp::Release),
        1,
        "after the key was released"
    );
    let retry = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(
        (retry.status, app.calls()),
        (200, 2),
        "the retry runs, no 409"
    );
}

#[tokio::test]
async fn a_caller_that_disconnects_does_not_cancel_the_paid_work() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let request = tokio::spawn({
        let service = service.clone();
        async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The caller goes away mid-call (hyper drops the future of a closed connection).
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    app.gate.add_permits(1);
    // The handler finishes on its own task and its response is stored.
    for _ in 0..200 {
        if store.requests(StoreOp::Complete) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retry = send(&service, HTTP_API, |_| {}).await;
    assert!(
        retry.replayed(),
        "the retry replays the work the first request paid for"
    );
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn a_binary_body_replays_byte_for_byte() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let first = send(&service, FUNCTION_URL, |e| {
        set_header(e, "x-test", "binary")
    })
    .await;
    let second = send(&service, FUNCTION_URL, |e| {
        set_header(e, "x-test", "binary")
    })
    .await;
    assert_eq!(first.body, [0x89, b'P', b'N', b'G', 0x00, 0xff, 0xfe, 1]);
    assert_eq!(second.body, first.body);
    assert_eq!(
        second.header("content-type"),
        Some("application/octet-stream")
    );
    assert!(second.replayed());
}

#[tokio::test]
async fn a_response_too_large_to_store_is_returned_and_its_key_released() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    // DynamoDB's 400 KB item is the memory store's limit too.
    let big = send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "size=500000")
    })
    .await;
    assert_eq!(big.status, 200);
    assert_eq!(big.body.len(), 500_000);
    assert_eq!(store.requests(StoreOp::Complete), 0);
    assert_eq!(store.requests(StoreOp::Release), 1);
    let retry = send(&service, HTTP_API, |e| set_header(e, "x-test", "size=10")).await;
    assert_eq!((retry.status, retry.body.len(), app.calls()), (200, 10, 2));
}

/// At most once, a response too large to store still never runs the handler twice: the
/// record is completed without it (as the engine does for a result too large), the first
/// caller gets the handler's response, and a retry is `500` `response-not-stored`.
#[tokio::test]
async fn at_most_once_a_response_too_large_to_store_completes_its_key_and_never_runs_again() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).at_most_once().build().unwrap());
    let big = send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "size=500000")
    })
    .await;
    assert_eq!((big.status, big.body.len()), (200, 500_000));
    assert!(!big.replayed());
    assert_eq!(store.requests(StoreOp::Release), 0, "not released");
    assert_eq!(store.requests(StoreOp::Complete), 1);
    let retry = send(&service, HTTP_API, |e| {
        set_header(e, "x-test", "size=500000")
    })
    .await;
    assert_eq!(app.calls(), 1, "the handler ran once");
    assert_eq!(retry.status, 500);
    assert_eq!(retry.header("retry-after"), None);
    let problem = retry.json();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("#response-not-stored"),
        "{problem}"
    );
}

/// At most once, a handler's `5xx` still releases its key: a `5xx` says the effect did
/// not happen, and the retry runs the handler again (a handler that may have done its
/// effect answers otherwise).
#[tokio::test]
async fn at_most_once_a_handlers_5xx_still_releases_its_key() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).at_most_once().build().unwrap());
    for _ in 0..2 {
        let answer = send(&service, HTTP_API, |e| {
            set_header(e, "x-test", "status=502")
        })
        .await;
        assert_eq!(answer.status, 502);
    }
    assert_eq!(app.calls(), 2);
    assert_eq!(store.requests(StoreOp::Release), 2);
}

/// A response body that can fail mid-read, as a streamed body does.
struct FlakyBody(Option<Result<bytes::Bytes, std::io::Error>>);

impl FlakyBody {
    fn failing() -> Self {
        FlakyBody(Some(Err(std::io::Error::other(
            "the body failed mid-stream",
        ))))
    }
}

impl From<Vec<u8>> for FlakyBody {
    fn from(bytes: Vec<u8>) -> Self {
        FlakyBody(Some(Ok(bytes.into())))
    }
}

impl http_body::Body for FlakyBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|r| r.map(http_body::Frame::data)))
    }
}

/// A handler whose response body fails after it ran (its effect done): without at most
/// once the key is released and the retry runs it again; at most once the claim is kept
/// (neither released nor completed), so the retry is in progress while its lease lasts
/// and `outcome-unknown` after it, never a second run.
#[tokio::test]
async fn a_response_body_that_fails_keeps_its_key_only_at_most_once() {
    use lambda_http::http;
    use lambda_http::tower::ServiceExt;
    use lambda_idempotency::clock::TestClock;
    for at_most_once in [false, true] {
        let store = store();
        let clock = TestClock::new(std::time::SystemTime::now());
        let idempotency = Idempotency::builder(store.clone())
            .clock(clock.clone())
            .build();
        let builder = IdempotencyKeyLayer::builder(idempotency, "generate")
            .scope(CallerScope::unscoped())
            .lease(Duration::from_secs(30));
        let builder = if at_most_once {
            builder.at_most_once()
        } else {
            builder
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let handler = lambda_http::tower::service_fn({
            let calls = calls.clone();
            move |_: http::Request<FlakyBody>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(http::Response::new(FlakyBody::failing())) }
            }
        });
        let service = ServiceBuilder::new()
            .layer(builder.build().unwrap())
            .service(handler);
        let send = || async {
            let request = http::Request::post("/generate")
                .header("idempotency-key", "k-1")
                .body(FlakyBody::from(b"{}".to_vec()))
                .unwrap();
            let response = service.clone().oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            let problem: Value = serde_json::from_slice(&body).unwrap();
            (status, problem["type"].as_str().unwrap().to_owned())
        };
        let (status, problem) = send().await;
        assert_eq!(status, 500);
        assert!(problem.ends_with("#response-unreadable"), "{problem}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        if !at_most_once {
            assert_eq!(store.requests(StoreOp::Release), 1, "released");
            send().await;
            assert_eq!(calls.load(Ordering::SeqCst), 2, "the retry runs again");
            continue;
        }
        assert_eq!(store.requests(StoreOp::Release), 0, "kept");
        assert_eq!(store.requests(StoreOp::Complete), 0);
        let (status, problem) = send().await;
        assert_eq!(status, 409, "{problem}");
        clock.advance(Duration::from_secs(31));
        let (status, problem) = send().await;
        assert_eq!(status, 500);
        assert!(problem.ends_with("#outcome-unknown"), "{problem}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "never run twice");
    }
}

#[tokio::test]
async fn store_failures_are_503_or_500_never_an_unprotected_run() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    store.inject(StoreOp::Claim, Fault::Unavailable, 3);
    let throttled = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(throttled.status, 503);
    assert_eq!(throttled.header("retry-after"), Some("1"));
    assert!(
        throttled.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("#store-unavailable")
    );
    store.inject(StoreOp::Claim, Fault::Rejected, 1);
    let denied = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(denied.status, 500);
    assert!(
        denied.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("#store-failed")
    );
    assert_eq!(app.calls(), 0);
    // A completion that fails after the call: the handler's response still goes out.
    store.inject(StoreOp::Complete, Fault::Rejected, 1);
    let ran = send(&service, HTTP_API, |_| {}).await;
    assert_eq!((ran.status, ran.header("x-call")), (200, Some("1")));
}

#[tokio::test]
async fn with_idempotency_disabled_every_request_runs_and_nothing_is_stored() {
    let store = store();
    let app = App::new();
    let idempotency = Idempotency::builder(store.clone()).disabled(true).build();
    let service = layered(
        &app,
        IdempotencyKeyLayer::builder(idempotency, "generate")
            .build()
            .unwrap(),
    );
    for n in 1..=2 {
        let answer = send(&service, HTTP_API, |_| {}).await;
        assert_eq!(
            (answer.status, answer.json()["call"].clone()),
            (200, json!(n))
        );
        assert!(!answer.replayed());
        assert_eq!(answer.header("x-call"), Some(n.to_string().as_str()));
    }
    assert_eq!(store.total_requests(), 0);
}

#[test]
fn a_layer_shows_its_settings_in_debug() {
    let layer = IdempotencyKeyLayer::builder(Idempotency::new(MemoryStore::new()), "generate")
        .header_name("X-Request-Key")
        .scope(CallerScope::unscoped());
    assert!(format!("{layer:?}").contains("generate"));
    let layer = layer.build().unwrap();
    let shown = format!("{layer:?}");
    for part in ["generate", "x-request-key", "unscoped", "max_retry_after"] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
    let service = ServiceBuilder::new().layer(layer).service(App::new());
    assert!(format!("{service:?}").contains("x-request-key"));
}

#[test]
fn settings_that_cannot_work_fail_at_build() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let build = |b: lambda_idempotency::http::IdempotencyKeyLayerBuilder| {
        b.build().unwrap_err().to_string()
    };
    let layer = || IdempotencyKeyLayer::builder(idempotency.clone(), "generate");
    assert!(build(layer().header_name("bad header")).contains("key header name"));
    assert!(build(layer().fingerprint_headers(["a b"])).contains("fingerprint header"));
    assert!(build(layer().replay_headers(["é"])).contains("replay header"));
    assert!(build(layer().max_key_len(0)).contains("key length"));
    assert!(
        build(IdempotencyKeyLayer::builder(idempotency.clone(), "a#b")).contains("operation name")
    );
}

/// Every length and duration setting of the layer at 0 (where it is allowed) and at its
/// maximum: none panics or wraps on a request.
#[tokio::test]
async fn settings_at_zero_and_at_their_maximum() {
    // The longest key: any key is accepted, however long.
    let long = store();
    let app = App::new();
    let service = layered(&app, layer(&long).max_key_len(usize::MAX).build().unwrap());
    for key in ["k", &"k".repeat(10_000)] {
        let first = send(&service, HTTP_API, |e| {
            set_header(e, "idempotency-key", key)
        })
        .await;
        let again = send(&service, HTTP_API, |e| {
            set_header(e, "idempotency-key", key)
        })
        .await;
        assert_eq!((first.status, again.status), (200, 200), "{}", key.len());
        assert!(!first.replayed() && again.replayed(), "{}", key.len());
    }
    // Retry-After at 0 (at least a second is said) and at its maximum: the twin's lease
    // (15 minutes).
    for (max, expected) in [(Duration::ZERO, 1..=1), (Duration::MAX, 899..=900)] {
        let store = store();
        let app = App::new();
        let service = layered(&app, layer(&store).max_retry_after(max).build().unwrap());
        let first = tokio::spawn({
            let service = service.clone();
            async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
        });
        while app.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let twin = send(&service, HTTP_API, |_| {}).await;
        assert_eq!(twin.status, 409, "{max:?}");
        let retry_after: u64 = twin.header("retry-after").unwrap().parse().unwrap();
        assert!(expected.contains(&retry_after), "{max:?}: {retry_after}");
        app.gate.add_permits(1);
        first.await.unwrap();
    }
    // A wait of 0 answers 409 at once; one of `Duration::MAX` waits for the twin.
    for (wait, status) in [(Duration::ZERO, 409), (Duration::MAX, 200)] {
        let store = store();
        let app = App::new();
        let service = layered(
            &app,
            layer(&store).wait_for_in_progress(wait).build().unwrap(),
        );
        let first = tokio::spawn({
            let service = service.clone();
            async move { send(&service, HTTP_API, |e| set_header(e, "x-test", "gate")).await }
        });
        while app.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let twin = tokio::spawn({
            let service = service.clone();
            async move { send(&service, HTTP_API, |_| {}).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.gate.add_permits(1);
        assert_eq!(first.await.unwrap().status, 200, "{wait:?}");
        let twin = twin.await.unwrap();
        assert_eq!(twin.status, status, "{wait:?}");
        assert_eq!(app.calls(), 1, "{wait:?}");
    }
}

/// The operation name is the stored id's second part, `{function}.{operation}#{key}`:
/// the function name holds no `.`, so the first `.` ends it and an operation may hold `.`
/// (`charge.v2`); only `#`, which ends the prefix, is refused.
#[test]
fn an_operation_name_may_hold_a_period_but_not_a_hash() {
    let idempotency = Idempotency::new(MemoryStore::new());
    let layer = |name: &str| IdempotencyKeyLayer::builder(idempotency.clone(), name).build();
    layer("charge.v2").expect("a period is accepted");
    for bad in ["charge#v2", ""] {
        assert!(
            matches!(
                layer(bad),
                Err(lambda_idempotency::Error::InvalidName {
                    what: "operation name",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
}

/// A REST API (or ALB) retry of the very same request, query and all, must replay; it
/// must never be a 422. lambda_http rebuilds the URI's query from
/// `multiValueQueryStringParameters`, a `HashMap` whose order changes with every event.
#[tokio::test]
async fn a_rest_or_alb_retry_with_several_query_parameters_replays() {
    let store = store();
    let app = App::new();
    let scope = CallerScope::lambda_authorizer().or(CallerScope::authorization_header());
    let service = layered(&app, layer(&store).scope(scope).build().unwrap());
    let with_query = |e: &mut Value| {
        let params = ["stream", "model", "temperature", "user", "region", "trace"];
        let mut single = serde_json::Map::new();
        let mut multi = serde_json::Map::new();
        for (i, name) in params.iter().enumerate() {
            single.insert(name.to_string(), json!(i.to_string()));
            multi.insert(name.to_string(), json!([i.to_string()]));
        }
        e["queryStringParameters"] = Value::Object(single);
        e["multiValueQueryStringParameters"] = Value::Object(multi);
    };
    let mut statuses = Vec::new();
    for (kind, event) in [("REST", REST), ("ALB", ALB)] {
        for _ in 0..10 {
            statuses.push((kind, send(&service, event, with_query).await.status));
        }
    }
    assert!(
        statuses.iter().all(|(_, s)| *s == 200),
        "the same request, sent again, answered: {statuses:?}"
    );
    assert_eq!(app.calls(), 2);
}

/// Two different credentials are two callers. `authorization_header()` reads the value
/// with `from_utf8_lossy`, so two credentials that differ only in non-UTF-8 bytes (legal
/// obs-text in a header, which hyper passes through) become one caller.
#[tokio::test]
async fn two_credentials_that_differ_in_any_byte_are_two_callers() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .scope(CallerScope::authorization_header())
            .build()
            .unwrap(),
    );
    let request = |credential: &[u8]| {
        lambda_http::http::Request::builder()
            .method("POST")
            .uri("/generate")
            .header("idempotency-key", "k-1")
            .header(
                "authorization",
                lambda_http::http::HeaderValue::from_bytes(credential).unwrap(),
            )
            .body(Body::from("{}"))
            .unwrap()
    };
    let mut svc = service.clone();
    let victim = svc.call(request(b"Bearer tok-\xe9")).await.unwrap();
    let other = svc.call(request(b"Bearer tok-\xff")).await.unwrap();
    let _ = victim;
    assert!(
        !other.headers().contains_key("idempotent-replayed"),
        "another credential was given the first caller's stored response"
    );
    assert_eq!(app.calls(), 2);
}

/// A 303 (or a 201 with its Location) is stored by default, but its Location is not
/// replayed by default: the replayed redirect leads nowhere.
#[tokio::test]
async fn a_replayed_redirect_keeps_its_location() {
    #[derive(Clone)]
    struct Redirect;
    impl Service<Request> for Redirect {
        type Response = Response<Body>;
        type Error = lambda_http::Error;
        type Future = std::future::Ready<Result<Response<Body>, lambda_http::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request) -> Self::Future {
            std::future::ready(Ok(Response::builder()
                .status(303)
                .header("location", "/generations/42")
                .body(Body::Empty)
                .unwrap()))
        }
    }
    let store = store();
    let mut service = ServiceBuilder::new()
        .layer(
            layer(&store)
                .scope(CallerScope::unscoped())
                .build()
                .unwrap(),
        )
        .service(Redirect);
    let request = || {
        lambda_http::http::Request::builder()
            .method("POST")
            .uri("/generate")
            .header("idempotency-key", "k-1")
            .body(Body::Empty)
            .unwrap()
    };
    let first = service.call(request()).await.unwrap();
    let replay = service.call(request()).await.unwrap();
    assert_eq!(first.headers()["location"], "/generations/42");
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(replay.status(), 303);
    assert_eq!(
        replay
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap()),
        Some("/generations/42"),
        "the replayed 303 has no Location"
    );
}

/// An HTTP API (payload 2.0) with a Lambda authorizer has no principal: the default scope
/// refuses it (401), and `lambda_authorizer_context` reads the caller from its context.
#[tokio::test]
async fn an_http_api_lambda_authorizer_identifies_its_caller_by_a_context_key() {
    let store = store();
    let app = App::new();
    let lambda_authorizer = |user: &'static str| {
        move |e: &mut Value| e["requestContext"]["authorizer"] = json!({"lambda": {"userId": user}})
    };
    let default = layered(&app, layer(&store).build().unwrap());
    assert_eq!(
        send(&default, HTTP_API, lambda_authorizer("ada"))
            .await
            .status,
        401
    );
    let by_context = layered(
        &app,
        layer(&store)
            .scope(CallerScope::lambda_authorizer_context("userId"))
            .build()
            .unwrap(),
    );
    let ada = send(&by_context, HTTP_API, lambda_authorizer("ada")).await;
    let bob = send(&by_context, HTTP_API, lambda_authorizer("bob")).await;
    let ada_again = send(&by_context, HTTP_API, lambda_authorizer("ada")).await;
    assert_eq!((ada.status, bob.status), (200, 200));
    assert!(!bob.replayed() && ada_again.replayed());
    assert_eq!(app.calls(), 2);
    // A REST API's Lambda authorizer puts its context beside `principalId`; a number is
    // an id too.
    let rest =
        |id: Value| move |e: &mut Value| e["requestContext"]["authorizer"]["userId"] = id.clone();
    let first = send(&by_context, REST, rest(json!(42))).await;
    let again = send(&by_context, REST, rest(json!(42))).await;
    let other = send(&by_context, REST, rest(json!("43"))).await;
    assert_eq!((first.status, again.status, other.status), (200, 200, 200));
    assert!(again.replayed() && !other.replayed());
    assert_eq!(app.calls(), 4);
    let without = send(&by_context, REST, |_| {}).await;
    assert_eq!(without.status, 401, "no such context key: no caller");
}

/// A caller id that ends with `:` (a tenant `acme:`, a sub `user:`) is a caller: only an
/// empty id is none. The check looks at the prefixed string's last byte.
#[tokio::test]
async fn a_caller_id_ending_with_a_colon_is_a_caller() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .scope(CallerScope::from_fn(|_| Some("tenant:".into())))
            .build()
            .unwrap(),
    );
    let answer = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(answer.status, 200, "refused: {:?}", answer.json());
}

/// The wait is "at most `max`": a twin that outlives two running requests in this
/// process (the first answers 503, the next one is slow) waits `max` again for the second.
#[tokio::test]
async fn the_wait_never_runs_past_its_bound() {
    let store = store();
    let app = App::new();
    let wait = Duration::from_millis(1000);
    let service = layered(
        &app,
        layer(&store).wait_for_in_progress(wait).build().unwrap(),
    );
    let first = tokio::spawn({
        let service = service.clone();
        async move {
            send(&service, HTTP_API, |e| {
                set_header(e, "x-test", "gate1,status=503")
            })
            .await
        }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = std::time::Instant::now();
    // Two twins: when the first releases, one of them runs (gated: slow), the other
    // joins it in memory.
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let answer = send(&service, HTTP_API, |e| set_header(e, "x-test", "gate1")).await;
                (answer.status, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A store round trip of 300 ms for the next claims: both twins find the key free
    // before either has claimed it in the store.
    store.inject(StoreOp::Claim, Fault::Slow(Duration::from_millis(300)), 5);
    app.gate.add_permits(1); // the first answers 503 and releases
    tokio::time::sleep(Duration::from_millis(2500)).await;
    app.gate.add_permits(10);
    let mut results = Vec::new();
    for t in twins {
        results.push(t.await.unwrap());
    }
    first.await.unwrap();
    let waited_409: Vec<_> = results.iter().filter(|(s, _)| *s == 409).collect();
    assert!(
        waited_409
            .iter()
            .all(|(_, took)| *took < wait + Duration::from_millis(300)),
        "a 409 came after waiting {results:?}, past the {wait:?} bound"
    );
}

/// With several requests per process (`run_concurrent`, as model-api runs), a twin waiting
/// in memory must answer by the Lambda deadline less a second, as the docs promise; it
/// waits until 50 ms before the deadline instead.
#[tokio::test]
async fn a_twin_waiting_in_memory_answers_a_second_before_the_deadline() {
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    let deadline_in = Duration::from_millis(2500);
    let context = || {
        let mut context = Context::default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        context.deadline = (now + deadline_in).as_millis() as u64;
        context
    };
    let first = tokio::spawn({
        let (service, context) = (service.clone(), context());
        async move {
            send_in(
                &service,
                HTTP_API,
                |e| set_header(e, "x-test", "gate"),
                context,
            )
            .await
        }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = std::time::Instant::now();
    let twin = send_in(&service, HTTP_API, |_| {}, context()).await;
    let took = started.elapsed();
    app.gate.add_permits(1);
    first.await.unwrap();
    assert_eq!(twin.status, 409);
    assert!(
        took <= deadline_in - Duration::from_millis(900),
        "the twin answered after {took:?}, with the deadline {deadline_in:?} away"
    );
}

/// At most once: a request whose key a crashed invocation claimed is `500`
/// `outcome-unknown` with no `Retry-After` (retrying never helps until an operator acts),
/// and the handler does not run again. A lease out of range is refused at build.
#[tokio::test]
async fn an_at_most_once_key_whose_run_crashed_is_500_outcome_unknown() {
    let store = store();
    let app = App::new();
    let once = layer(&store)
        .at_most_once()
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let service = layered(&app, once);
    let crashed = send(&service, HTTP_API, |e| set_header(e, "x-test", "gate"));
    let _ = tokio::time::timeout(Duration::from_millis(50), crashed).await;
    let held = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(held.status, 409, "in progress while its lease lasts");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let answer = send(&service, HTTP_API, |_| {}).await;
    assert_eq!(answer.status, 500);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(answer.header("retry-after"), None);
    let problem = answer.json();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("#outcome-unknown"),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("unknown"),
        "{problem}"
    );
    assert_eq!(app.calls(), 1, "the crashed run only");

    let refused = layer(&store).lease(Duration::ZERO).build().unwrap_err();
    assert!(refused.to_string().contains("lease"), "{refused}");

    // An expiry no longer than a fixed lease would let a crashed run's key expire with
    // its lease, and the retry run again: refused when the layer is built. Without a
    // fixed lease only the invocation knows its lease: each claim checks its own.
    let short = Idempotency::builder(store.clone())
        .expires_after(Duration::from_secs(60))
        .build();
    let refused = IdempotencyKeyLayer::builder(short.clone(), "generate")
        .at_most_once()
        .lease(Duration::from_secs(60))
        .build()
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        text.contains("expires_after") && text.contains("lease"),
        "{text}"
    );
    IdempotencyKeyLayer::builder(short.clone(), "generate")
        .at_most_once()
        .build()
        .unwrap();
    IdempotencyKeyLayer::builder(short, "generate")
        .at_most_once()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
}

/// Lambda's tenant isolation mode: the same caller's same request under two tenants runs
/// once for each, whatever the scope; again under one of them it replays.
#[tokio::test]
async fn two_tenants_never_share_a_response() {
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let mut seen = Vec::new();
    for tenant in [Some("a"), Some("b"), Some("a"), Some("b"), None] {
        let mut context = Context::default();
        context.tenant_id = tenant.map(str::to_owned);
        let answer = send_in(&service, REST, |_| {}, context).await;
        seen.push((
            answer.status,
            answer.json()["call"].clone(),
            answer.replayed(),
        ));
    }
    assert_eq!(
        seen,
        [
            (200, json!(1), false),
            (200, json!(2), false),
            (200, json!(1), true),
            (200, json!(2), true),
            (200, json!(3), false),
        ]
    );
    assert_eq!(app.calls(), 3);
    assert_eq!(
        store.inner().len(),
        3,
        "one record per tenant, one untenanted"
    );
}

/// The layer runs each request on a task of its own: a request without lambda_http's
/// context (a custom adapter, a test) called inside `with_context` keeps that invocation's
/// tenant and deadline there, so two tenants never share a record.
#[tokio::test]
async fn a_request_called_within_a_context_keeps_its_tenant_and_deadline() {
    let store = store();
    let app = App::new();
    let mut service = layered(&app, layer(&store).build().unwrap());
    let mut seen = Vec::new();
    for tenant in ["a", "b", "a"] {
        let mut event: Value = serde_json::from_str(REST).unwrap();
        set_header(&mut event, "x-test", "context");
        let request: LambdaRequest = serde_json::from_value(event).unwrap();
        let request = Request::from(request);
        assert!(request.extensions().get::<Context>().is_none());
        let mut context = Context::default();
        context.tenant_id = Some(tenant.to_owned());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        context.deadline = now.unwrap().as_millis() as u64 + 60_000;
        let response = lambda_idempotency::with_context(&context, service.call(request))
            .await
            .unwrap();
        let body = response.into_body();
        seen.push(serde_json::from_slice::<Value>(&body).unwrap());
    }
    let expected =
        |call: u64, tenant: &str| json!({"call": call, "tenant": tenant, "deadline": true});
    assert_eq!(seen, [expected(1, "a"), expected(2, "b"), expected(1, "a")]);
    assert_eq!(app.calls(), 2);
    assert_eq!(store.inner().len(), 2, "one record per tenant");
}

/// A request without a `Context` extension, called within a context, waits for a twin
/// elsewhere no longer than that invocation's deadline, as one carrying the context does.
#[tokio::test]
async fn a_request_within_a_context_stops_waiting_before_its_deadline() {
    let store = store();
    let app = App::new();
    let here = layered(&app, layer(&store).build().unwrap());
    let mut elsewhere = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let first = tokio::spawn({
        let here = here.clone();
        async move { send(&here, REST, |e| set_header(e, "x-test", "gate")).await }
    });
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let event: Value = serde_json::from_str(REST).unwrap();
    let request: LambdaRequest = serde_json::from_value(event).unwrap();
    let request = Request::from(request);
    assert!(request.extensions().get::<Context>().is_none());
    let mut context = Context::default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    context.deadline = now.unwrap().as_millis() as u64 + 2_000;
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(6),
        lambda_idempotency::with_context(&context, elsewhere.call(request)),
    )
    .await;
    let waited = started.elapsed();
    app.gate.add_permits(1);
    first.await.unwrap();
    assert!(
        waited < Duration::from_secs(2),
        "waited {waited:?}, past the invocation's 2 s deadline: {:?}",
        answer.map(|r| r.map(|r| r.status()))
    );
}

/// The layer's request is an entry point of its own, even inside a batch record: a layer
/// without `wait_for_in_progress` answers `409` at once for a key in progress in another
/// record of the batch, never waiting for it as a batch twin would.
#[tokio::test]
async fn without_a_wait_a_key_in_progress_answers_409_inside_a_batch_too() {
    use aws_lambda_events::event::sqs::SqsEvent;
    use lambda_idempotency::SqsBatch;
    let store = store();
    let app = App::new();
    let service = layered(&app, layer(&store).build().unwrap());
    let event: SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "m1", "body": "gate"},
        {"messageId": "m2", "body": ""},
    ]}))
    .unwrap();
    let statuses = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = std::time::Instant::now();
    let sqs = SqsBatch::new();
    let batch = sqs.run(LambdaEvent::new(event, Context::default()), |message| {
        let (mut service, app, statuses) = (service.clone(), app.clone(), statuses.clone());
        async move {
            let gated = message.body.as_deref() == Some("gate");
            if !gated {
                while app.calls() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            let mut event: Value = serde_json::from_str(REST).unwrap();
            if gated {
                set_header(&mut event, "x-test", "gate");
            }
            let request: LambdaRequest = serde_json::from_value(event).unwrap();
            let response = service.call(Request::from(request)).await.unwrap();
            let status = response.status().as_u16();
            statuses.lock().unwrap().push((
                message.message_id.clone().unwrap(),
                status,
                started.elapsed(),
            ));
            if !gated {
                app.gate.add_permits(1);
            }
            Ok::<_, lambda_http::Error>(())
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(5), batch).await;
    app.gate.add_permits(1);
    let statuses = statuses.lock().unwrap().clone();
    assert!(
        statuses
            .iter()
            .any(|(id, status, _)| id == "m2" && *status == 409),
        "m2 should get 409 at once: {statuses:?}"
    );
}

/// A request waiting (in memory) for a twin whose handler answered a `500` inside a batch
/// record is told when the `500` comes, not when that record's handler returns.
#[tokio::test]
async fn a_failed_request_inside_a_batch_record_frees_its_twins_at_once() {
    use aws_lambda_events::event::sqs::SqsEvent;
    use lambda_idempotency::SqsBatch;
    let store = store();
    let app = App::new();
    let service = layered(
        &app,
        layer(&store)
            .wait_for_in_progress(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let event: SqsEvent =
        serde_json::from_value(json!({"Records": [{"messageId": "m1", "body": ""}]})).unwrap();
    let failed_at = Arc::new(std::sync::Mutex::new(None));
    let sqs = SqsBatch::new();
    let batch = {
        let (service, failed_at) = (service.clone(), failed_at.clone());
        async move {
            sqs.run(LambdaEvent::new(event, Context::default()), |_message| {
                let (mut service, failed_at) = (service.clone(), failed_at.clone());
                async move {
                    let mut event: Value = serde_json::from_str(REST).unwrap();
                    set_header(&mut event, "x-test", "gate,status=500");
                    let request: LambdaRequest = serde_json::from_value(event).unwrap();
                    let response = service.call(Request::from(request)).await.unwrap();
                    assert_eq!(response.status().as_u16(), 500);
                    *failed_at.lock().unwrap() = Some(std::time::Instant::now());
                    // The record's handler goes on with other work.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, lambda_http::Error>(())
                }
            })
            .await
        }
    };
    let batch = tokio::spawn(batch);
    while app.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let twin = tokio::spawn({
        let service = service.clone();
        async move { send(&service, REST, |_| {}).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    app.gate.add_permits(1);
    let twin = twin.await.unwrap();
    let answered = std::time::Instant::now();
    let _ = batch.await;
    let failed = failed_at
        .lock()
        .unwrap()
        .expect("the first request answered 500");
    let late = answered.duration_since(failed);
    assert!(
        late < Duration::from_secs(1),
        "the twin answered {} {late:?} after its twin's 500",
        twin.status
    );
}

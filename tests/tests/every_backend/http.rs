//! The HTTP example (`model-api`) over every store, served over real HTTP by a hyper server
//! and driven by a real client: one provider call per key, the three refusals (400, 422,
//! 409), the replay header, two callers with one key kept apart, a twin in another
//! environment waited for, a provider failure not stored. And the layer alone over a
//! plain tower service, without any Lambda type, as it runs in a container.

use bytes::Bytes;
use http_body_util::Full;
use lambda_http::tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use lambda_idempotency::Idempotency;
use lambda_idempotency::http::{CallerScope, IdempotencyKeyLayer};
use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::store::{IdempotencyStore, StoreOp};
use model_api::{Api, Settings};
use model_worker::ModelClient;
use provider_stub::ProviderStub;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use test_support::http::{Reply, Server, send};
use test_support::stores::{Backend, TestStore};

struct Setup {
    _shared: tokio::sync::RwLockReadGuard<'static, ()>,
    _test_store: TestStore,
    /// The store as the API sees it: its requests are counted.
    store: FaultyStore<Arc<dyn IdempotencyStore>>,
    provider: ProviderStub,
}

async fn setup(backend: Backend, test: &str) -> Setup {
    let shared = super::MACHINE.read().await;
    let test_store = TestStore::open(backend, test).await;
    Setup {
        _shared: shared,
        store: FaultyStore::new(test_store.store.clone()),
        _test_store: test_store,
        provider: ProviderStub::start().await.expect("provider stub"),
    }
}

impl Setup {
    /// The API on a server of its own: one Lambda environment, with its own handle.
    async fn environment(&self, settings: Settings) -> Server {
        let idempotency = Idempotency::builder(self.store.clone())
            .function_name("model-api")
            .build();
        let model = ModelClient::new(&self.provider.base_url(), None).unwrap();
        let api = Api::new(idempotency, model, &settings);
        Server::bind(
            "127.0.0.1:0",
            move |request: test_support::http::Request| {
                let api = api.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let request = lambda_http::Request::from_parts(parts, body.to_vec().into());
                    let response = api.oneshot(request).await.expect("the API answers");
                    let (parts, body) = response.into_parts();
                    hyper::Response::from_parts(parts, Full::new(Bytes::from(body.to_vec())))
                }
            },
        )
        .await
        .unwrap()
    }
}

/// A model request; `content` may carry the provider stand-in's markers.
fn body(content: &str) -> Vec<u8> {
    json!({"model": "stub-model", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

async fn post(server: &Server, key: Option<&str>, caller: &str, body: &[u8]) -> Reply {
    let url = format!("http://{}/generate", server.addr());
    let authorization = format!("Bearer {caller}");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", authorization.as_str()),
    ];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    send("POST", &url, &headers, body).await.unwrap()
}

fn is_problem(reply: &Reply, status: u16, kind: &str) {
    assert_eq!(
        reply.status,
        status,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let problem = reply.json();
    assert_eq!(problem["status"], status);
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with(&format!("#{kind}")),
        "{problem}"
    );
}

async fn a_retried_request_calls_the_provider_once(backend: Backend) {
    let s = setup(backend, "http_retried").await;
    let api = s.environment(Settings::default()).await;
    let request = body("Write a haiku about retries.");
    let first = post(&api, Some("\"key-1\""), "ada", &request).await;
    let claims = s.store.requests(StoreOp::Claim) + s.store.requests(StoreOp::Complete);
    let second = post(&api, Some("key-1"), "ada", &request).await;
    assert_eq!((first.status, second.status), (200, 200));
    assert_eq!(
        s.provider.completion_calls(),
        1,
        "one provider call for two requests"
    );
    assert_eq!(
        first.body, second.body,
        "the replay is the first body, byte for byte"
    );
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.header("content-type"), Some("application/json"));
    assert_eq!(claims, 2, "a first request: a claim and a completion");
    assert_eq!(s.store.total_requests(), 3, "a replay: one claim");
}

async fn missing_reused_and_in_progress_keys_are_400_422_and_409(backend: Backend) {
    let s = setup(backend, "http_refusals").await;
    let api = s.environment(Settings::default()).await;
    is_problem(
        &post(&api, None, "ada", &body("hi")).await,
        400,
        "key-missing",
    );
    assert_eq!(s.store.total_requests(), 0);

    let slow = body("Be slow. [[delay_ms=1500]]");
    let first = tokio::spawn({
        let url = format!("http://{}/generate", api.addr());
        let slow = slow.clone();
        async move {
            let headers = [
                ("authorization", "Bearer ada"),
                ("idempotency-key", "key-2"),
            ];
            send("POST", &url, &headers, &slow).await.unwrap()
        }
    });
    s.provider.wait_for_requests(1).await;
    let before = s.store.total_requests();
    let twin = post(&api, Some("key-2"), "ada", &slow).await;
    is_problem(&twin, 409, "request-in-progress");
    let retry_after: u64 = twin.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry_after), "{retry_after}");
    let changed = post(&api, Some("key-2"), "ada", &body("Another request.")).await;
    is_problem(&changed, 422, "key-reused");
    assert_eq!(s.store.total_requests() - before, 2, "one claim each");

    assert_eq!(first.await.unwrap().status, 200);
    let replay = post(&api, Some("key-2"), "ada", &slow).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    is_problem(
        &post(&api, Some("key-2"), "ada", &body("Another request.")).await,
        422,
        "key-reused",
    );
    assert_eq!(s.provider.completion_calls(), 1);
}

async fn two_callers_with_one_key_are_kept_apart(backend: Backend) {
    let s = setup(backend, "http_callers").await;
    let api = s.environment(Settings::default()).await;
    let request = body("What is my name?");
    let ada = post(&api, Some("shared-key"), "ada", &request).await;
    let bob = post(&api, Some("shared-key"), "bob", &request).await;
    assert_eq!(s.provider.completion_calls(), 2, "one call per caller");
    assert_ne!(ada.body, bob.body, "bob does not get ada's completion");
    let ada_again = post(&api, Some("shared-key"), "ada", &request).await;
    let bob_again = post(&api, Some("shared-key"), "bob", &request).await;
    assert_eq!(
        (ada_again.body == ada.body, bob_again.body == bob.body),
        (true, true)
    );
    assert_eq!(s.provider.completion_calls(), 2);
    // A request without a caller is refused: its key could not be kept apart.
    let url = format!("http://{}/generate", api.addr());
    let anonymous = send("POST", &url, &[("idempotency-key", "k")], &request)
        .await
        .unwrap();
    is_problem(&anonymous, 401, "caller-unidentified");
}

async fn a_twin_in_another_environment_is_waited_for(backend: Backend) {
    let s = setup(backend, "http_wait").await;
    let here = s.environment(Settings::default()).await;
    let patient = Settings {
        wait_for_in_progress: Some(Duration::from_secs(10)),
    };
    let elsewhere = s.environment(patient).await;
    let slow = body("Take a second. [[delay_ms=800]]");
    let first = tokio::spawn({
        let url = format!("http://{}/generate", here.addr());
        let slow = slow.clone();
        async move {
            let headers = [
                ("authorization", "Bearer ada"),
                ("idempotency-key", "key-3"),
            ];
            send("POST", &url, &headers, &slow).await.unwrap()
        }
    });
    s.provider.wait_for_requests(1).await;
    let twin = post(&elsewhere, Some("key-3"), "ada", &slow).await;
    let first = first.await.unwrap();
    assert_eq!((first.status, twin.status), (200, 200));
    assert_eq!(twin.body, first.body);
    assert_eq!(twin.header("idempotent-replayed"), Some("true"));
    assert_eq!(s.provider.completion_calls(), 1);
    let reads = s.store.requests(StoreOp::Get);
    // Reads at 50, 150, 350, 750, 1550 ms at most, for an 800 ms call.
    assert!((1..=6).contains(&reads), "{reads} reads while waiting");
}

async fn a_provider_failure_is_not_stored_and_the_retry_calls_again(backend: Backend) {
    let s = setup(backend, "http_provider_failure").await;
    let api = s.environment(Settings::default()).await;
    let request = body("Fail once. [[status_once=503]]");
    let failed = post(&api, Some("key-4"), "ada", &request).await;
    is_problem(&failed, 502, "provider-failed");
    let retry = post(&api, Some("key-4"), "ada", &request).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.header("idempotent-replayed"), None, "it ran again");
    assert_eq!(s.provider.completion_calls(), 2);
    assert_eq!(s.store.requests(StoreOp::Release), 1);
    // A refusal is the request's own answer: stored, and replayed without a call.
    let refused = body("Refuse. [[status=400]]");
    is_problem(
        &post(&api, Some("key-5"), "ada", &refused).await,
        400,
        "provider-refused",
    );
    let again = post(&api, Some("key-5"), "ada", &refused).await;
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (400, Some("true"))
    );
    assert_eq!(s.provider.completion_calls(), 3);
}

/// The API through lambda_http's own adapter (what `lambda_http::run` runs) with an event
/// of each kind: one provider call for two deliveries of each, the second a replay.
async fn each_lambda_event_kind_calls_the_provider_once(backend: Backend) {
    use lambda_http::request::LambdaRequest;
    use lambda_http::{Adapter, Context, LambdaEvent};
    let s = setup(backend, "http_event_kinds").await;
    let idempotency = Idempotency::builder(s.store.clone())
        .function_name("model-api")
        .build();
    let model = ModelClient::new(&s.provider.base_url(), None).unwrap();
    let api = Api::new(idempotency, model, &Settings::default());
    let events = [
        include_str!("../../../events/rest-api-request.json"),
        include_str!("../../../events/http-api-request.json"),
        include_str!("../../../events/alb-request.json"),
        include_str!("../../../events/function-url-request.json"),
    ];
    for (n, event) in events.into_iter().enumerate() {
        let mut answers = Vec::new();
        for _ in 0..2 {
            let request: LambdaRequest = serde_json::from_str(event).unwrap();
            let response = Adapter::from(api.clone())
                .call(LambdaEvent::new(request, Context::default()))
                .await
                .unwrap();
            answers.push(serde_json::to_value(response).unwrap());
        }
        let header = |a: &serde_json::Value| {
            let single = a["headers"]["idempotent-replayed"].as_str();
            single
                .or(a["multiValueHeaders"]["idempotent-replayed"][0].as_str())
                .map(str::to_owned)
        };
        assert_eq!(answers[0]["statusCode"], 200, "event {n}: {}", answers[0]);
        assert_eq!(answers[0]["body"], answers[1]["body"], "event {n}");
        assert_eq!(
            (header(&answers[0]), header(&answers[1])),
            (None, Some("true".to_owned())),
            "event {n}"
        );
        assert_eq!(
            s.provider.completion_calls(),
            n + 1,
            "event {n}: one call for two deliveries"
        );
    }
}

/// The layer over a tower service that knows nothing of Lambda, with hyper's body type.
async fn a_plain_tower_service_outside_lambda(backend: Backend) {
    let s = setup(backend, "http_plain").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let layer = IdempotencyKeyLayer::builder(Idempotency::new(s.store.clone()), "orders")
        .scope(CallerScope::authorization_header())
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        move |request: hyper::Request<Full<Bytes>>| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let _ = request;
                let response = hyper::Response::builder()
                    .status(201)
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::from(format!("order {n}"))))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        },
    ));
    let server = Server::bind(
        "127.0.0.1:0",
        move |request: test_support::http::Request| {
            let service = service.clone();
            async move { service.oneshot(request.map(Full::new)).await.unwrap() }
        },
    )
    .await
    .unwrap();
    let url = format!("http://{}/orders", server.addr());
    let headers = [("authorization", "Bearer ada"), ("idempotency-key", "o-1")];
    let first = send("POST", &url, &headers, b"{}").await.unwrap();
    let second = send("POST", &url, &headers, b"{}").await.unwrap();
    assert_eq!((first.status, second.status), (201, 201));
    assert_eq!(
        (first.body.as_slice(), second.body.as_slice()),
        (&b"order 1"[..], &b"order 1"[..])
    );
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.header("content-type"), Some("text/plain"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

test_support::every_backend!(
    a_retried_request_calls_the_provider_once,
    missing_reused_and_in_progress_keys_are_400_422_and_409,
    two_callers_with_one_key_are_kept_apart,
    a_twin_in_another_environment_is_waited_for,
    a_provider_failure_is_not_stored_and_the_retry_calls_again,
    a_plain_tower_service_outside_lambda,
    each_lambda_event_kind_calls_the_provider_once,
);

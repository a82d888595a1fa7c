//! A mock Lambda Runtime API, to drive a real Lambda binary as the service does: it hands
//! out events on `GET .../invocation/next` and collects responses.

use crate::http::{self, Method, Request, Response, Server, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, mpsc};

/// The mock's handle: queue events, await responses. Stops when dropped.
#[derive(Debug)]
pub struct RuntimeApi {
    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub address: String,
    events: mpsc::UnboundedSender<(Value, Option<String>)>,
    responses: Mutex<mpsc::UnboundedReceiver<(String, Value)>>,
    shared: Arc<Shared>,
    _server: Server,
}

#[derive(Debug)]
struct Shared {
    /// Each event with its tenant id, if any.
    pending: Mutex<mpsc::UnboundedReceiver<(Value, Option<String>)>>,
    done: mpsc::UnboundedSender<(String, Value)>,
    first_poll: Mutex<Option<Instant>>,
    handed_out: AtomicU64,
}

impl RuntimeApi {
    /// Starts on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let (events, pending) = mpsc::unbounded_channel();
        let (done, responses) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            pending: Mutex::new(pending),
            done,
            first_poll: Mutex::new(None),
            handed_out: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let server = Server::bind("127.0.0.1:0", move |request| {
            answer(serving.clone(), request)
        })
        .await?;
        Ok(Self {
            address: server.addr().to_string(),
            events,
            responses: Mutex::new(responses),
            shared,
            _server: server,
        })
    }

    /// Queues one invocation.
    pub fn invoke(&self, event: Value) {
        let _ = self.events.send((event, None));
    }

    /// Queues one invocation of `tenant`, as Lambda's tenant isolation mode sends it (the
    /// `lambda-runtime-aws-tenant-id` header).
    pub fn invoke_as_tenant(&self, event: Value, tenant: &str) {
        let _ = self.events.send((event, Some(tenant.to_owned())));
    }

    /// The next response (or error report) the function posted.
    pub async fn response(&self) -> (String, Value) {
        self.responses
            .lock()
            .await
            .recv()
            .await
            .expect("runtime API alive")
    }

    /// When the function first asked for an invocation.
    pub async fn first_poll(&self) -> Option<Instant> {
        *self.shared.first_poll.lock().await
    }
}

async fn answer(shared: Arc<Shared>, request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if request.method() != Method::GET || !path.ends_with("/invocation/next") {
        let parsed = serde_json::from_slice(request.body()).unwrap_or(Value::Null);
        let _ = shared.done.send((path, parsed));
        return http::json(StatusCode::ACCEPTED, &json!({}));
    }
    shared
        .first_poll
        .lock()
        .await
        .get_or_insert_with(Instant::now);
    let Some((event, tenant)) = shared.pending.lock().await.recv().await else {
        return http::json(
            StatusCode::GONE,
            &json!({"errorMessage": "the mock stopped"}),
        );
    };
    let n = shared.handed_out.fetch_add(1, Ordering::Relaxed) + 1;
    let deadline = SystemTime::now() + Duration::from_secs(30);
    let deadline_ms = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let mut response = http::json(StatusCode::OK, &event);
    for (name, value) in [
        (
            "lambda-runtime-aws-request-id",
            format!("req-{n}-{deadline_ms}"),
        ),
        ("lambda-runtime-deadline-ms", deadline_ms.to_string()),
        (
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:123456789012:function:bench".to_owned(),
        ),
        (
            "lambda-runtime-trace-id",
            "Root=1-00000000-000000000000000000000000".to_owned(),
        ),
    ] {
        response
            .headers_mut()
            .insert(name, value.parse().expect("a valid header value"));
    }
    if let Some(tenant) = tenant {
        response.headers_mut().insert(
            "lambda-runtime-aws-tenant-id",
            tenant.parse().expect("a valid tenant id"),
        );
    }
    response
}

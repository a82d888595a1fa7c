//! A local stand-in for an OpenAI-compatible model provider, for tests and local runs.
//!
//! It answers `POST /v1/chat/completions` with a completion and **logs every request it
//! receives**: the proof of idempotency is the provider's request log, not result rows.
//! Delays and failures can be set to play a slow or failing provider: for all requests
//! ([`ProviderStub::set_delay`]), or for one, by putting `[[delay_ms=N]]` in the content of
//! its last message. `[[status=N]]` there answers that request with HTTP status N every
//! time (a provider that refuses it: `[[status=400]]`); `[[status_once=N]]` answers N the
//! first time it sees that request, and a completion after (a passing failure).
//!
//! It serves HTTP/1.1 through `test_support::http` (hyper), one request per connection.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use test_support::http::header::{AUTHORIZATION, CONNECTION, HeaderValue};
use test_support::http::{self, Request, Response, Server, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

/// One request as the provider received it.
#[derive(Debug, Clone)]
pub struct LoggedRequest {
    /// `POST`, ...
    pub method: String,
    /// `/v1/chat/completions`, ...
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The body, parsed as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
}

#[derive(Debug, Default)]
struct State {
    log: Mutex<Vec<LoggedRequest>>,
    delay_ms: AtomicU64,
    fail_next: AtomicU32,
    /// The bodies of `[[status_once=N]]` requests already failed once.
    failed_once: Mutex<std::collections::HashSet<String>>,
    served: Notify,
    log_file: Option<PathBuf>,
}

/// A running stand-in provider. Stops when dropped.
#[derive(Debug)]
pub struct ProviderStub {
    server: Server,
    state: Arc<State>,
}

impl ProviderStub {
    /// Starts on 127.0.0.1 on a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0", None).await
    }

    /// Starts on `addr`, appending each request as a JSON line to `log_file` if given.
    pub async fn start_on(addr: &str, log_file: Option<PathBuf>) -> std::io::Result<Self> {
        let state = Arc::new(State {
            log_file,
            ..State::default()
        });
        let serving = state.clone();
        let server = Server::bind(addr, move |request| answer(serving.clone(), request)).await?;
        Ok(Self { server, state })
    }

    /// The base URL, e.g. `http://127.0.0.1:41234` (the worker's `MODEL_BASE_URL`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.state.log.lock().unwrap().clone()
    }

    /// How many chat completion requests were received: the number that matters.
    pub fn completion_calls(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path == "/v1/chat/completions")
            .count()
    }

    /// Answers each later request after `delay`: a slow provider.
    pub fn set_delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Answers the next `n` requests with HTTP 500.
    pub fn fail_next(&self, n: u32) {
        self.state.fail_next.store(n, Ordering::SeqCst);
    }

    /// Waits until at least `n` requests have been received (logged, maybe not answered).
    pub async fn wait_for_requests(&self, n: usize) {
        loop {
            let notified = self.state.served.notified();
            if self.requests().len() >= n {
                return;
            }
            notified.await;
        }
    }
}

async fn answer(state: Arc<State>, request: Request) -> Response {
    let method = request.method().to_string();
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let authorization = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = serde_json::from_slice(request.body()).unwrap_or(Value::Null);
    let number = {
        let mut log = state.log.lock().unwrap();
        log.push(LoggedRequest {
            method: method.clone(),
            path: path.clone(),
            authorization,
            body: body.clone(),
        });
        log.len()
    };
    if let Some(file) = &state.log_file {
        let line =
            json!({"n": number, "method": method, "path": path, "body": body}).to_string() + "\n";
        if let Err(e) = append(file, &line).await {
            let message = format!("cannot write {}: {e}", file.display());
            return respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": {"message": message}}),
            );
        }
    }
    state.served.notify_waiters();

    let delay = marker(&body, "delay_ms").unwrap_or_else(|| state.delay_ms.load(Ordering::SeqCst));
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if method != "POST" || path != "/v1/chat/completions" {
        return respond(
            StatusCode::NOT_FOUND,
            &json!({"error": {"message": format!("no route {method} {path}")}}),
        );
    }
    let failing = state
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    let once = marker(&body, "status_once")
        .filter(|_| state.failed_once.lock().unwrap().insert(body.to_string()));
    if let Some(status) = marker(&body, "status")
        .or(once)
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        && !status.is_success()
    {
        return respond(
            status,
            &json!({"error": {"message": format!("refused with HTTP {status} (asked for by the request)"), "type": "invalid_request_error"}}),
        );
    }
    if failing {
        return respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": {"message": "the model is overloaded (injected by the stub)", "type": "server_error"}}),
        );
    }
    respond(StatusCode::OK, &completion(number, &body))
}

/// A JSON answer, after which the connection closes: each call opens its own, as
/// docs/benchmarks.md measures the worker's provider call.
fn respond(status: StatusCode, body: &Value) -> Response {
    let mut response = http::json(status, body);
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn append(file: &Path, line: &str) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .await?;
    f.write_all(line.as_bytes()).await?;
    // tokio's file hands the write to a blocking thread: flush, so the line is there once
    // the request is answered.
    f.flush().await
}

/// The `[[name=N]]` marker in the last message, if any.
fn marker(request: &Value, name: &str) -> Option<u64> {
    let content = request["messages"].as_array()?.last()?["content"].as_str()?;
    let open = format!("[[{name}=");
    let start = content.find(&open)? + open.len();
    let end = content[start..].find("]]")? + start;
    content[start..end].parse().ok()
}

/// An OpenAI-style chat completion answering the last message.
fn completion(number: usize, request: &Value) -> Value {
    let last = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let content = format!("stub completion #{number} for: {last}");
    json!({
        "id": format!("chatcmpl-stub-{number}"),
        "object": "chat.completion",
        "created": 1_764_460_800u64,
        "model": request["model"],
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": last.len() / 4 + 1, "completion_tokens": 8, "total_tokens": last.len() / 4 + 9}
    })
}

//! A local stand-in for an OpenAI-compatible model provider, for tests and local runs.
//!
//! It answers `POST /v1/chat/completions` with a completion and **logs every request it
//! receives**: the proof of idempotency is the provider's request log, not result rows.
//! Delays and failures can be set to play a slow or failing provider: for all requests
//! ([`ProviderStub::set_delay`]), or for one, by putting `[[delay_ms=N]]` in the content of
//! its last message.
//!
//! It speaks just enough HTTP/1.1 (one request per connection, `Connection: close`).

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
    served: Notify,
    log_file: Option<std::path::PathBuf>,
}

/// A running stand-in provider. Stops when dropped.
#[derive(Debug)]
pub struct ProviderStub {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl ProviderStub {
    /// Starts on 127.0.0.1 on a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0", None).await
    }

    /// Starts on `addr`, appending each request as a JSON line to `log_file` if given.
    pub async fn start_on(
        addr: &str,
        log_file: Option<std::path::PathBuf>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            log_file,
            ..State::default()
        });
        let serving = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = serving.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &state).await;
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// The base URL, e.g. `http://127.0.0.1:41234` (the worker's `MODEL_BASE_URL`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
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

impl Drop for ProviderStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, state: &State) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return respond(&mut stream, 431, &json!({"error": "headers too large"})).await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let mut request_line = lines.next().unwrap_or_default().split_whitespace();
    let method = request_line.next().unwrap_or_default().to_owned();
    let path = request_line.next().unwrap_or_default().to_owned();
    let mut content_length = 0usize;
    let mut authorization = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_owned()),
                _ => {}
            }
        }
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < content_length {
        let mut chunk = vec![0u8; content_length - body.len()];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
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
        let mut f = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .await?;
        f.write_all(line.as_bytes()).await?;
    }
    state.served.notify_waiters();

    let delay = requested_delay(&body).unwrap_or_else(|| state.delay_ms.load(Ordering::SeqCst));
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if method != "POST" || path != "/v1/chat/completions" {
        return respond(
            &mut stream,
            404,
            &json!({"error": {"message": format!("no route {method} {path}")}}),
        )
        .await;
    }
    let failing = state
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return respond(
            &mut stream,
            500,
            &json!({"error": {"message": "the model is overloaded (injected by the stub)", "type": "server_error"}}),
        )
        .await;
    }
    respond(&mut stream, 200, &completion(number, &body)).await
}

/// The `[[delay_ms=N]]` marker in the last message, if any.
fn requested_delay(request: &Value) -> Option<u64> {
    let content = request["messages"].as_array()?.last()?["content"].as_str()?;
    let start = content.find("[[delay_ms=")? + "[[delay_ms=".len();
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

async fn respond(stream: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

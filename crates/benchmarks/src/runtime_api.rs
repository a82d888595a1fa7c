//! A mock Lambda Runtime API, to drive a real Lambda binary as the service does: it hands
//! out events on `GET .../invocation/next` and collects responses.

use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc};

/// The mock's handle: queue events, await responses.
#[derive(Debug)]
pub struct RuntimeApi {
    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub address: String,
    events: mpsc::UnboundedSender<Value>,
    responses: Mutex<mpsc::UnboundedReceiver<(String, Value)>>,
    first_poll: Arc<Mutex<Option<Instant>>>,
}

impl RuntimeApi {
    /// Starts on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (events, pending) = mpsc::unbounded_channel::<Value>();
        let (done, responses) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(pending));
        let first_poll = Arc::new(Mutex::new(None));
        let polled = first_poll.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok((stream, _)) = listener.accept().await {
                n += 1;
                let (pending, done, polled) = (pending.clone(), done.clone(), polled.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, n, &pending, &done, &polled).await;
                });
            }
        });
        Ok(Self {
            address,
            events,
            responses: Mutex::new(responses),
            first_poll,
        })
    }

    /// Queues one invocation.
    pub fn invoke(&self, event: Value) {
        let _ = self.events.send(event);
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
        *self.first_poll.lock().await
    }
}

async fn serve(
    mut stream: TcpStream,
    n: u64,
    pending: &Mutex<mpsc::UnboundedReceiver<Value>>,
    done: &mpsc::UnboundedSender<(String, Value)>,
    first_poll: &Mutex<Option<Instant>>,
) -> std::io::Result<()> {
    loop {
        let Some((method, path, body)) = read_request(&mut stream).await? else {
            return Ok(());
        };
        if method == "GET" && path.ends_with("/invocation/next") {
            first_poll.lock().await.get_or_insert_with(Instant::now);
            let Some(event) = pending.lock().await.recv().await else {
                return Ok(());
            };
            let deadline = SystemTime::now() + Duration::from_secs(30);
            let deadline_ms = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis();
            let body = event.to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Lambda-Runtime-Aws-Request-Id: req-{n}-{deadline_ms}\r\nLambda-Runtime-Deadline-Ms: {deadline_ms}\r\n\
                 Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:123456789012:function:bench\r\n\
                 Lambda-Runtime-Trace-Id: Root=1-00000000-000000000000000000000000\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        } else {
            let parsed = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let _ = done.send((path, parsed));
            stream
                .write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
                .await?;
        }
    }
}

/// One HTTP/1.1 request on a keep-alive connection, or `None` at its end.
async fn read_request(
    stream: &mut TcpStream,
) -> std::io::Result<Option<(String, String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            return Ok(None);
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut parts = head.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    Ok(Some((method, path, body)))
}

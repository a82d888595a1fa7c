//! One small HTTP/1.1 server and client on hyper: the server under the provider stand-in and
//! the Lambda Runtime API mock, the client for the test server's control API.
//!
//! Bodies are read whole before a handler sees them: these are test stand-ins, not proxies.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

pub use hyper::{Method, StatusCode, header};

/// A request as a handler sees it: the whole body read.
pub type Request = hyper::Request<Bytes>;
/// A handler's answer.
pub type Response = hyper::Response<Full<Bytes>>;

/// Serves HTTP/1.1 (with keep-alive) on `listener`, answering every request with `handler`,
/// until this future is dropped, which also closes every connection it accepted. Ends when
/// accepting fails.
pub async fn serve<H, F>(listener: TcpListener, handler: H)
where
    H: Fn(Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut connections = JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        let handler = handler.clone();
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let handler = handler.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, hyper::Error>(handler(Request::from_parts(parts, body)).await)
            }
        });
        connections.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A server on a task of its own ([`serve`]); stops, connections and all, when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Listens on `addr` (`127.0.0.1:0` for a free port) and serves with `handler`.
    pub async fn bind<H, F>(addr: &str, handler: H) -> std::io::Result<Server>
    where
        H: Fn(Request) -> F + Send + Sync + 'static,
        F: Future<Output = Response> + Send + 'static,
    {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, handler));
        Ok(Server { addr, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A JSON answer with `status`.
pub fn json(status: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Full::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Sends one request (JSON `body`, if any) on a connection of its own to an `http://` URL and
/// returns the status and the body.
pub async fn request(method: &str, url: &str, body: Option<&str>) -> Result<(u16, String), String> {
    request_with(
        method,
        url,
        &[(CONTENT_TYPE.as_str(), "application/json")],
        body,
    )
    .await
}

/// [`request`] with the headers given (a content type among them, if the body needs one).
pub async fn request_with(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let reply = send(method, url, headers, body.unwrap_or_default().as_bytes()).await?;
    Ok((
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    ))
}

/// A whole answer: status, headers (names lower case, in order) and body bytes.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Every header, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics, with the body, if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends one request on a connection of its own to an `http://` URL and returns the whole
/// answer.
pub async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{method} {url}: {e}");
    let uri: hyper::Uri = url.parse().map_err(|e| fail(&e))?;
    let (Some("http"), Some(host)) = (uri.scheme_str(), uri.authority()) else {
        return Err(fail(&"only http:// URLs"));
    };
    let stream = TcpStream::connect(host.as_str())
        .await
        .map_err(|e| fail(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(&e))?;
    tokio::spawn(connection);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, host.as_str());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::copy_from_slice(body)))
        .map_err(|e| fail(&e))?;
    let response = sender.send_request(request).await.map_err(|e| fail(&e))?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| fail(&e))?
        .to_bytes()
        .to_vec();
    Ok(Reply {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_request_reaches_the_handler_and_its_answer_comes_back() {
        let server = Server::bind("127.0.0.1:0", |request: Request| async move {
            let body: Value = serde_json::from_slice(request.body()).unwrap_or(Value::Null);
            json(
                StatusCode::CREATED,
                &json!({
                    "method": request.method().as_str(),
                    "path": request.uri().to_string(),
                    "body": body,
                }),
            )
        })
        .await
        .unwrap();
        let url = format!("http://{}/a/b?c=d", server.addr());
        let (status, body) = request("POST", &url, Some(r#"{"x":1}"#)).await.unwrap();
        assert_eq!(status, 201);
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body,
            json!({"method": "POST", "path": "/a/b?c=d", "body": {"x": 1}})
        );
    }

    #[tokio::test]
    async fn a_dropped_server_accepts_no_more_requests() {
        let server = Server::bind("127.0.0.1:0", |_| async {
            json(StatusCode::OK, &json!({}))
        })
        .await
        .unwrap();
        let url = format!("http://{}/", server.addr());
        assert_eq!(request("GET", &url, None).await.unwrap().0, 200);
        drop(server);
        tokio::task::yield_now().await;
        assert!(request("GET", &url, None).await.is_err());
    }

    #[tokio::test]
    async fn only_http_urls() {
        let error = request("GET", "https://example.com/", None)
            .await
            .unwrap_err();
        assert!(error.contains("only http://"), "{error}");
    }
}

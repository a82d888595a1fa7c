//! A minimal HTTP/1.1 client for the test servers' control endpoints (one request per
//! connection), so the tests need no HTTP client dependency.

use tokio::net::TcpStream;

/// Sends one request and returns the status and body.
pub async fn request(method: &str, url: &str, body: Option<&str>) -> Result<(u16, String), String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = TcpStream::connect(host).await.map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    crate::write_all(&mut stream, head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    crate::write_all(&mut stream, body.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let raw = crate::read_all(&mut stream)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no HTTP status")?;
    Ok((status, body.to_owned()))
}

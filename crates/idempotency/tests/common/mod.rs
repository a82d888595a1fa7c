//! What the store tests share: the servers' URLs, a private Redis server, test
//! certificates, and freezing a process.
#![allow(dead_code)]

use std::time::Duration;
use tokio::net::TcpStream;

/// A private `redis-server`, stopped and its directory removed when dropped.
pub(crate) struct Child(std::process::Child, std::path::PathBuf);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Starts a private `redis-server` on a free port (nothing kept on disk), for tests whose
/// assertions another client of a shared server could disturb.
pub(crate) async fn private_redis() -> (Child, std::net::SocketAddr) {
    private_redis_with(|port, _| vec!["--port".into(), port.to_string()]).await
}

/// A private `redis-server` with the arguments `args(port, dir)` adds (the port to listen
/// on, plain or TLS, and the server's own directory).
pub(crate) async fn private_redis_with(
    args: impl FnOnce(u16, &std::path::Path) -> Vec<String>,
) -> (Child, std::net::SocketAddr) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = std::env::temp_dir().join(format!("idem-test-redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let extra = args(port, &dir);
    let spawned = std::process::Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect(
            "redis-server on PATH (install Redis 7: apt-get install redis-server, brew install redis)",
        );
    let child = Child(spawned, dir);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_ok() {
            return (child, addr);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(child);
    panic!("private redis-server did not start");
}

/// Writes a test CA and a server certificate for `localhost` and 127.0.0.1 into `dir`
/// with `openssl`: `ca.crt`, `server.crt`, `server.key`.
pub(crate) fn test_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl on PATH (apt-get install openssl)");
        assert!(status.success(), "openssl {args:?}");
    };
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=idempotency-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "server.ext",
    ]);
}

/// `REDIS_TEST_URL`, or the local server.
pub(crate) fn redis_url() -> String {
    std::env::var("REDIS_TEST_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `POSTGRES_TEST_URL`, or the local server.
pub(crate) fn postgres_url() -> String {
    std::env::var("POSTGRES_TEST_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `POSTGRES_TEST_SCHEMA` (one per `scripts/test` run, dropped when it ends), or `public`.
pub(crate) fn postgres_schema() -> String {
    std::env::var("POSTGRES_TEST_SCHEMA").unwrap_or_else(|_| "public".into())
}

/// Sends `sig` (`-STOP`, `-CONT`) to process `pid`: a server that freezes, then thaws.
pub(crate) fn signal(pid: &str, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

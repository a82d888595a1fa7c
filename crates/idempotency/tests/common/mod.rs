//! What the store tests share: a private Redis server.
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
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = std::env::temp_dir().join(format!("idem-test-redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Child(std::process::Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server on PATH (install Redis 7: apt-get install redis-server, brew install redis)"), dir);
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

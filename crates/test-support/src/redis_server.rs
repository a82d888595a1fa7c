//! A private `redis-server` of a test's own, for tests whose assertions another client of
//! a shared server could disturb, or that need a server set up their way (TLS, ACLs, a
//! memory limit, cluster mode, a frozen process). The only launcher: `scripts/test`
//! starts its private servers (a missing local Redis, the three-node cluster) through
//! the `private-redis` binary, which runs the same command line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const INSTALL: &str =
    "redis-server on PATH (install Redis 7: apt-get install redis-server, brew install redis)";

/// A free 127.0.0.1 port whose cluster bus port (the port + 10000) is free too.
pub fn free_port() -> u16 {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    for _ in 0..1000 {
        let port = 20_000 + (crate::servers::random() % 10_000) as u16;
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair in 20000..40000");
}

/// `redis-server` on 127.0.0.1, keeping its files in `dir` and nothing on disk
/// (no snapshots, no append-only file), in the foreground. The caller adds the port
/// (`--port`, or `--port 0` and `--tls-port`) and whatever else the test needs.
pub fn command(dir: &Path) -> Command {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--dir"])
        .arg(dir);
    command
}

/// A private `redis-server`, stopped (and its directory removed) when dropped.
#[derive(Debug)]
pub struct PrivateRedis {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl PrivateRedis {
    /// A plain server on a free port.
    pub async fn start() -> Self {
        Self::start_with(|port, _| vec!["--port".into(), port.to_string()]).await
    }

    /// A server with the arguments `args(port, dir)` gives: the port to listen on (plain,
    /// or TLS), and anything else, given the server's own directory. Returns once the port
    /// accepts connections.
    pub async fn start_with(args: impl FnOnce(u16, &Path) -> Vec<String>) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("idem-test-redis-{port}"));
        std::fs::create_dir_all(&dir).expect("the server's directory");
        let extra = args(port, &dir);
        let child = command(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect(INSTALL);
        let server = PrivateRedis {
            child,
            dir,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(server.addr).await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the private redis-server on port {port} did not start");
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and its address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Its own directory (certificates a test wrote there, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the process (`SIGSTOP`): connections stay open and nothing answers, as a
    /// frozen node or a half-open connection.
    pub fn freeze(&self) {
        signal(self.child.id(), "-STOP");
    }

    /// Lets a frozen process run again (`SIGCONT`).
    pub fn thaw(&self) {
        signal(self.child.id(), "-CONT");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

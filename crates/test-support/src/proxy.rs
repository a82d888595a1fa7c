//! A TCP proxy in front of a test server, for the faults that live in the network: a
//! connection that stops answering (half-open TCP after a Lambda freeze, a blackholed
//! node), slow answers, and an endpoint that starts leading elsewhere (a failover).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to an upstream server. [`freeze`](Self::freeze) makes every connection
/// accepted so far stop forwarding (sockets stay open, nothing is closed or reset: a
/// half-open connection); connections accepted later forward normally.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    generation: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// Where connections accepted from now on go.
    upstream: Arc<Mutex<SocketAddr>>,
    /// How long every answer is held back, in milliseconds (changeable at any time).
    delay_ms: Arc<AtomicU64>,
}

impl Proxy {
    /// A proxy to `upstream` on a free 127.0.0.1 port, holding every answer back `delay`.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            generation: Arc::default(),
            accepted: Arc::default(),
            upstream: Arc::new(Mutex::new(upstream)),
            delay_ms: Arc::new(AtomicU64::new(delay.as_millis() as u64)),
        };
        let (generation, accepted) = (proxy.generation.clone(), proxy.accepted.clone());
        let (upstream, delay) = (proxy.upstream.clone(), proxy.delay_ms.clone());
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let upstream = *upstream.lock().unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                let mine = generation.load(Ordering::SeqCst);
                let frozen = {
                    let generation = generation.clone();
                    move || generation.load(Ordering::SeqCst) != mine
                };
                tokio::spawn(forward(client, upstream, frozen, delay.clone()));
            }
        });
        proxy
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections accepted from now on go to `upstream` (those open stay where they are).
    pub fn redirect(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }

    /// Holds every answer back `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Every connection accepted so far stops forwarding, and stays open.
    pub fn freeze(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// Copies bytes both ways between `client` and `upstream` until either side closes or
/// the connection is `frozen`, from when on it swallows everything.
async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    frozen: impl Fn() -> bool + Clone + Send + 'static,
    delay_ms: Arc<AtomicU64>,
) {
    let server = TcpStream::connect(upstream).await.unwrap();
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let frozen_up = frozen.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if frozen_up() {
                // Swallow everything, keep the socket open.
                std::future::pending::<()>().await;
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let held = delay_ms.load(Ordering::SeqCst);
            if held > 0 {
                tokio::time::sleep(Duration::from_millis(held)).await;
            }
            if frozen() {
                std::future::pending::<()>().await;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let _ = tokio::join!(up, down);
}

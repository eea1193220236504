//! A TCP proxy on 127.0.0.1 that delays every byte from the client to the server by a set time
//! `D`: a slow link, or a partition that heals and lets TCP deliver what it buffered (issue 30).
//! The real-server tests put it between the controller and kube-apiserver, and between
//! kube-apiserver and etcd, to deliver writes after their sender gave up on them.
//!
//! What it does, per accepted connection (one connection to the upstream address each):
//! - **client → server**: every chunk read is queued with the release time `read + D` (`D` as set
//!   when the chunk was read, [`DelayProxy::set_delay`]) and written when that time has come, in
//!   the order read: one FIFO queue per connection, so a shorter delay set later never lets bytes
//!   overtake earlier ones. The client's end of stream (FIN, or a reset or read error, which is
//!   delivered the same way) is queued too: the server sees the half-close only after every byte
//!   before it, as TCP would deliver it after the link came back. A client that closes its
//!   socket does not cancel what it already sent — that is the point.
//! - **server → client**: copied at once (not delayed).
//! - [`DelayProxy::queued`] counts chunks (and ends of stream) read but not yet written;
//!   [`DelayProxy::drained`] waits until it is zero, i.e. every delayed byte has reached the
//!   server (or the server's socket refused it: a server that closed the connection).
//!
//! It listens on `127.0.0.1:<free port>` and connects only to the address it is given; dropping
//! the [`DelayProxy`] closes the listener and every connection (queued bytes are then lost).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

/// Size of one read from the client (bytes).
const CHUNK_BYTES: usize = 64 * 1024;

/// State shared by the proxy handle and its connection tasks.
#[derive(Debug)]
struct Shared {
    /// The delay given to chunks read from now on, in nanoseconds.
    delay_nanos: AtomicU64,
    /// Chunks and ends of stream queued and not yet written, over all connections.
    queued: watch::Sender<usize>,
    /// Connections accepted so far.
    accepted: AtomicU64,
}

impl Shared {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::SeqCst))
    }
}

/// A running delaying proxy (see the module documentation). Dropping it stops it.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on `127.0.0.1:0` and forwards each connection to `upstream`, delaying the client's
    /// bytes by `delay`. Must be called inside a tokio runtime (it spawns the accept loop).
    ///
    /// # Errors
    /// Binding the listener failed.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            delay_nanos: AtomicU64::new(nanos(delay)),
            queued: watch::Sender::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        Ok(DelayProxy {
            addr,
            shared,
            accept,
        })
    }

    /// The address to connect to instead of the upstream (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the delay of every chunk read from now on (chunks already queued keep their release
    /// time; order is kept either way).
    pub fn set_delay(&self, delay: Duration) {
        self.shared
            .delay_nanos
            .store(nanos(delay), Ordering::SeqCst);
    }

    /// The delay chunks read now get.
    pub fn delay(&self) -> Duration {
        self.shared.delay()
    }

    /// Chunks (and ends of stream) read from clients and not yet written to the server.
    pub fn queued(&self) -> usize {
        *self.shared.queued.borrow()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Waits until nothing is queued ([`DelayProxy::queued`] is 0). With a delay still set and
    /// clients still sending, that moment may never come: set the delay to zero first.
    pub async fn drained(&self) {
        let mut queued = self.shared.queued.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close while we wait.
        let _ = queued.wait_for(|n| *n == 0).await;
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops them all.
        self.accept.abort();
    }
}

fn nanos(delay: Duration) -> u64 {
    u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX)
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                connections.spawn(relay(client, upstream, Arc::clone(&shared)));
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One queued item: its release time and the bytes (`None`: the client's end of stream).
type Item = (Instant, Option<Vec<u8>>);

/// Relays one connection until both directions have ended.
async fn relay(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // the client sees its connection closed
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let (queue, items) = mpsc::unbounded_channel::<Item>();
    let downlink = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(
        read_client(client_read, queue, &shared),
        write_server(server_write, items, &shared),
        downlink,
    );
}

/// Reads the client's bytes and queues each chunk with its release time; queues the end of
/// stream last.
async fn read_client(
    mut client: OwnedReadHalf,
    queue: mpsc::UnboundedSender<Item>,
    shared: &Shared,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let read = client.read(&mut buf).await;
        let release = Instant::now() + shared.delay();
        let item = match read {
            Ok(n) if n > 0 => Some(buf[..n].to_vec()),
            _ => None,
        };
        let end = item.is_none();
        shared.queued.send_modify(|n| *n += 1);
        if queue.send((release, item)).is_err() {
            shared.queued.send_modify(|n| *n -= 1);
            return;
        }
        if end {
            return;
        }
    }
}

/// Writes each queued item to the server at its release time, in order.
async fn write_server(
    mut server: OwnedWriteHalf,
    mut items: mpsc::UnboundedReceiver<Item>,
    shared: &Shared,
) {
    let mut open = true;
    while let Some((release, item)) = items.recv().await {
        if open {
            sleep_until(release).await;
            open = match item {
                Some(bytes) => server.write_all(&bytes).await.is_ok(),
                None => {
                    let _ = server.shutdown().await;
                    false
                }
            };
        }
        shared.queued.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A one-connection server: writes `greeting` at once, then reads everything the client sends
    /// until end of stream and returns it with the instant the first byte came in.
    async fn server(
        greeting: &'static [u8],
    ) -> (
        SocketAddr,
        tokio::task::JoinHandle<(Vec<u8>, Option<Instant>)>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.write_all(greeting).await.unwrap();
            let mut received = Vec::new();
            let mut first = None;
            let mut buf = [0u8; 4096];
            loop {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    return (received, first);
                }
                first.get_or_insert_with(Instant::now);
                received.extend_from_slice(&buf[..n]);
            }
        });
        (addr, task)
    }

    /// The bytes arrive whole, in order and not before the delay they were read with has passed,
    /// also across delay changes (a shorter delay set later does not let bytes overtake), and the
    /// end of stream comes after them.
    #[tokio::test]
    async fn delays_the_client_bytes_and_keeps_their_order() {
        let delay = Duration::from_millis(300);
        let (upstream, server) = server(b"").await;
        let proxy = DelayProxy::start(upstream, delay).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut queued = proxy.shared.queued.subscribe();
        let sent = Instant::now();
        let mut expected = Vec::new();
        for i in 0..50u32 {
            let chunk = format!("chunk {i};").into_bytes();
            client.write_all(&chunk).await.unwrap();
            expected.extend_from_slice(&chunk);
            if i == 24 {
                // Once the proxy has read (and queued) the first half with the long delay, the
                // second half gets none: it must still come after the first.
                queued.wait_for(|n| *n >= 1).await.unwrap();
                proxy.set_delay(Duration::ZERO);
            }
        }
        client.shutdown().await.unwrap();
        let (received, first) = server.await.unwrap();
        assert_eq!(
            String::from_utf8(received).unwrap(),
            String::from_utf8(expected).unwrap()
        );
        // A lower bound, guaranteed by construction: the proxy holds the first chunk until
        // `read + delay`, and it read it after `sent`.
        assert!(first.unwrap() >= sent + delay);
        proxy.drained().await;
        assert_eq!(proxy.queued(), 0);
        assert_eq!(proxy.accepted(), 1);
    }

    /// A client that sends and closes at once has its bytes delivered anyway: a request its
    /// sender abandoned still reaches the server.
    #[tokio::test]
    async fn delivers_what_a_closed_client_sent() {
        let (upstream, server) = server(b"").await;
        let proxy = DelayProxy::start(upstream, Duration::from_millis(200))
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"PATCH late").await.unwrap();
        drop(client);
        let (received, _) = server.await.unwrap();
        assert_eq!(received, b"PATCH late");
        proxy.drained().await;
    }

    /// While the client's bytes are held, the server's bytes still reach the client, and
    /// [`DelayProxy::queued`] counts what is held; nothing has reached the server.
    #[tokio::test]
    async fn holds_the_client_bytes_but_not_the_server_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = DelayProxy::start(listener.local_addr().unwrap(), Duration::from_secs(3600))
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        client.write_all(b"held").await.unwrap();
        let mut queued = proxy.shared.queued.subscribe();
        queued.wait_for(|n| *n == 1).await.unwrap();
        server.write_all(b"hello").await.unwrap();
        let mut greeting = [0u8; 5];
        client.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"hello");
        // The chunk is queued for an hour: the server's socket has nothing to read.
        let mut buf = [0u8; 16];
        assert!(matches!(
            server.try_read(&mut buf),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        ));
        assert_eq!(proxy.queued(), 1);
    }
}

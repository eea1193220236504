//! The plain ports' bounds through `health::serve`, the probe server of
//! `--health-probe-bind-address` (issue 31, item 4). Paused time: the header timeout passes
//! without waiting for it, and the order of events is the proof (no wall-clock bound).

use std::io::ErrorKind;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS};
use crate::health::Health;

/// A probe server on a loopback port of its own; its address.
async fn probe_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let health = Health::new();
    health.set_ready(true);
    tokio::spawn(crate::health::serve(
        listener,
        health,
        std::future::pending(),
    ));
    address
}

/// Writes all of `bytes` (tokio's `io-util` helpers are not in this crate's feature set).
async fn write_all(stream: &TcpStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        stream.writable().await.expect("writable");
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("write: {e}"),
        }
    }
}

/// Reads until the end of the stream (or an error, such as a reset): what was read.
async fn read_to_end(stream: &TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if stream.readable().await.is_err() {
            return out;
        }
        match stream.try_read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return out,
        }
    }
}

/// Whether the server has closed `stream` (a blocking std socket, read here without blocking):
/// everything it sent is read, then end of stream.
fn closed_by_server(stream: &std::net::TcpStream) -> bool {
    use std::io::Read as _;
    stream.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 1024];
    let mut stream = stream;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// A connection that never sends a request is closed once the header timeout has passed; before,
/// the plain port kept it open for ever.
#[tokio::test(start_paused = true)]
async fn a_plain_port_closes_an_idle_connection() {
    let address = probe_server().await;
    let started = Instant::now();
    let idle = TcpStream::connect(address).await.expect("connect");
    let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 4, read_to_end(&idle)).await;
    assert!(
        read.is_ok(),
        "the idle connection is still open after 4 header timeouts"
    );
    assert!(
        started.elapsed() >= HEADER_READ_TIMEOUT,
        "closed before the header timeout"
    );
}

/// With MAX_CONNECTIONS idle connections open, one more connection's request is answered only
/// after the idle ones have been closed: the port serves at most MAX_CONNECTIONS at once, and the
/// others wait in the kernel's backlog without a file descriptor of the process.
#[tokio::test(start_paused = true)]
async fn a_plain_port_serves_at_most_max_connections_at_once() {
    let address = probe_server().await;
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        // Std sockets: `closed_by_server` reads them with a system call of its own. A loopback
        // connect completes in the kernel, before any accept.
        idle.push(std::net::TcpStream::connect(address).expect("connect"));
    }
    let probe = TcpStream::connect(address).await.expect("connect");
    write_all(
        &probe,
        b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answer = tokio::time::timeout(HEADER_READ_TIMEOUT * 4, read_to_end(&probe))
        .await
        .expect("answered within 4 header timeouts");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let open = idle.iter().filter(|s| !closed_by_server(s)).count();
    assert_eq!(
        open, 0,
        "{open} of the {MAX_CONNECTIONS} idle connections were still open when the next one was served"
    );
    assert!(started.elapsed() >= HEADER_READ_TIMEOUT);
    // The port serves again.
    let again = TcpStream::connect(address).await.expect("connect");
    write_all(
        &again,
        b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answer = read_to_end(&again).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
}

//! An "API server" on 127.0.0.1 that accepts every connection and closes it at once: each request
//! the controller sends fails, and each connection is a positive sign that it is still trying.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

/// The server's URL (`http://127.0.0.1:<port>`) and the number of connections accepted so far.
/// The accepting task runs until the test's runtime ends.
pub async fn start() -> (String, watch::Receiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let (count, counted) = watch::channel(0usize);
    tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            drop(connection);
            count.send_modify(|n| *n += 1);
        }
    });
    (url, counted)
}

/// Waits (at most 10 s) until `connections` connections were accepted; panics otherwise.
pub async fn wait_for(counted: &mut watch::Receiver<usize>, connections: usize) {
    tokio::time::timeout(
        Duration::from_secs(10),
        counted.wait_for(|n| *n >= connections),
    )
    .await
    .unwrap_or_else(|_| panic!("fewer than {connections} connections within 10 s"))
    .expect("the accepting task is alive");
}

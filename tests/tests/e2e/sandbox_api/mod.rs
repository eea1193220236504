//! Tests of the sandbox API server alone, through a real `kube::Client`.

mod events;
mod faults;
mod leases;
mod list_watch;
mod objects;
mod process;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodeipam_tests::sandbox::{Sandbox, SandboxHandle, fixture};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

fn api_status(r: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String, Value) {
    match r {
        Err(kube::Error::Api(s)) => (
            s.code,
            s.reason.clone(),
            serde_json::to_value(&s.details).unwrap_or(Value::Null),
        ),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn start(file: &str) -> (SandboxHandle, Api<Node>) {
    let sb = Sandbox::start(fixture(file)).await;
    let nodes: Api<Node> = Api::all(sb.client());
    (sb, nodes)
}

/// Sends one raw HTTP/1.1 request and reads until the server closes: `(bytes, read error)`.
async fn raw_http(
    sb: &SandboxHandle,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (Vec<u8>, Option<std::io::Error>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(sb.addr())
        .await
        .expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    let err = tokio::time::timeout(WAIT, conn.read_to_end(&mut out))
        .await
        .expect("server answers or closes in time")
        .err();
    (out, err)
}

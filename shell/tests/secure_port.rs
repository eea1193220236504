//! The secure port through the built binary (`main.rs`'s wiring): with `--secure-port` on, the
//! process serves the probes and `/metrics` over TLS with its in-memory self-signed certificate,
//! asks the API server (`--master`, here a tiny in-process fake answering TokenReviews and
//! SubjectAccessReviews) about every bearer token, and a port already in use stops it with exit
//! status 1 and one line naming the flag.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_nodeipam-controller");

/// The fake API server: token `good` is `alice`, who may `get` `/metrics`.
async fn fake_api_server() -> SocketAddr {
    let app = axum::Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(|Json(mut review): Json<Value>| async move {
                review["status"] = if review["spec"]["token"] == "good" {
                    json!({"authenticated": true, "user": {"username": "alice", "groups": ["system:authenticated"]}})
                } else {
                    json!({"authenticated": false})
                };
                (axum::http::StatusCode::CREATED, Json(review))
            }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(|Json(mut review): Json<Value>| async move {
                let allowed = review["spec"]["user"] == "alice"
                    && review["spec"]["nonResourceAttributes"]
                        == json!({"path": "/metrics", "verb": "get"});
                review["status"] = json!({"allowed": allowed});
                (axum::http::StatusCode::CREATED, Json(review))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(master: SocketAddr, port: u16) -> Controller {
    let child = Command::new(BIN)
        .args([
            "--allocate-node-cidrs=false",
            &format!("--master=http://{master}"),
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            &format!("--secure-port={port}"),
            "--bind-address=127.0.0.1",
        ])
        .env("RUST_LOG", "warn")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    Controller(child)
}

/// Accepts any certificate but records it: the point here is the server's wiring, not trust
/// (the e2e tests verify the chain against the CA).
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `GET https://127.0.0.1:<port><path>`: (status, body, the server's certificate chain length).
async fn get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String, usize)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").ok()?, tcp)
        .await
        .ok()?;
    let chain = tls.get_ref().1.peer_certificates().map_or(0, <[_]>::len);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .ok()?;
    tokio::spawn(connection);
    let mut request = http::Request::get(path).header(http::header::HOST, "localhost");
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).ok()?)
        .await
        .ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned(), chain))
}

#[tokio::test]
async fn the_binary_serves_the_secure_port_with_delegated_auth() {
    let master = fake_api_server().await;
    let port = free_port();
    let _controller = spawn(master, port);
    // Bounded wait for the listener (the binary starts in well under a second).
    let mut health = None;
    for _ in 0..100 {
        health = get(port, "/healthz", None).await;
        if health.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body, chain) = health.expect("the secure port answers");
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(chain, 2, "the self-signed serving certificate and its CA");
    let ready = get(port, "/readyz", None).await.expect("answers");
    assert_eq!(ready.0, 200, "allocation off: ready at once");
    assert_eq!(get(port, "/metrics", None).await.expect("answers").0, 401);
    assert_eq!(
        get(port, "/metrics", Some("bad")).await.expect("answers").0,
        401
    );
    assert_eq!(
        get(port, "/metrics", Some("good"))
            .await
            .expect("answers")
            .0,
        200
    );
    assert_eq!(
        get(port, "/other", Some("good")).await.expect("answers").0,
        403
    );
}

#[tokio::test]
async fn a_secure_port_in_use_exits_1_naming_the_flag() {
    let master = fake_api_server().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let controller = spawn(master, port);
    let mut child = controller;
    let output = tokio::task::spawn_blocking(move || {
        let status = child.0.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        (status, stderr)
    })
    .await
    .expect("joined");
    let (status, stderr) = output;
    assert_eq!(status.expect("exits").code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("--secure-port"), "{stderr}");
    drop(taken);
}

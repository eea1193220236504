//! Helpers of the secure-serving tests: start `nodeipam::serving` in-process on 127.0.0.1 from
//! real command-line flags, and an HTTPS client that trusts exactly the server's CA.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use nodeipam::controller::Health;
use nodeipam::serving::{SecureServing, ServingCertificate};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::sync::oneshot;

/// The process-wide metrics recorder (installed once per test binary).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| nodeipam::metrics::install_recorder().expect("first recorder"))
        .clone()
}

/// Parses `args` as the binary does and resolves secure serving against `client`.
pub async fn resolve(args: &[&str], client: &kube::Client) -> SecureServing {
    try_resolve(args, client)
        .await
        .expect("secure serving resolves")
}

/// As [`resolve`], keeping the error.
pub async fn try_resolve(
    args: &[&str],
    client: &kube::Client,
) -> Result<SecureServing, nodeipam::serving::ServingError> {
    use clap::Parser as _;
    let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
    let cli = nodeipam::flags::Cli::try_parse_from(argv).expect("flags parse");
    Ok(cli
        .serving
        .resolve(client)
        .await?
        .expect("--secure-port is not 0"))
}

/// A secure server running on 127.0.0.1:<free port>.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA its certificate chains to.
    pub ca: CertificateDer<'static>,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves `serving` (with `health` and the process's metrics) on a free loopback port. `ca`
/// overrides the trusted CA (for `--tls-cert-file` servers).
pub async fn start(
    serving: SecureServing,
    health: Health,
    ca: Option<CertificateDer<'static>>,
) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ca = match (ca, &serving.certificate) {
        (Some(ca), _) => ca,
        (None, ServingCertificate::SelfSigned { ca }) => ca.clone(),
        (None, ServingCertificate::Files { .. }) => panic!("give the CA of the certificate files"),
    };
    let router = nodeipam::serving::router(health, metrics_handle(), serving.auth.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(nodeipam::serving::serve(
        listener,
        serving.tls.clone(),
        router,
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        ca,
        stop: Some(stop),
    }
}

impl Server {
    /// The same server, as seen by a client that trusts `ca` instead.
    pub fn trusting(&self, ca: CertificateDer<'static>) -> Server {
        Server {
            addr: self.addr,
            ca,
            stop: None,
        }
    }
}

fn connector(ca: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Whether a TLS handshake verifying `server.ca` for `localhost` succeeds.
pub async fn handshake_ok(server: &Server) -> bool {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    connector(&server.ca)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .is_ok()
}

/// An answer: status, body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The `Status.reason` of a JSON error body.
    pub fn reason(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["reason"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// `GET https://localhost:<port><path>` trusting only `server.ca`, with `token` as a bearer
/// token. Verifies the certificate for the name `localhost`.
pub async fn get(server: &Server, path: &str, token: Option<&str>) -> Answer {
    request(server, "GET", path, token).await
}

/// Any method, as [`get`].
pub async fn request(server: &Server, method: &str, path: &str, token: Option<&str>) -> Answer {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let tls = connector(&server.ca)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake with a verified certificate");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "localhost");
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(builder.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

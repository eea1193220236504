//! Secure serving as kube-controller-manager does it: `/healthz`, `/livez`, `/readyz` and
//! `/metrics` over HTTPS on `--secure-port` (kcm's 10257), with **delegated authentication and
//! authorization**: every request to a path outside `--authorization-always-allow-paths` needs a
//! bearer token that a `TokenReview` accepts and a `SubjectAccessReview` (non-resource URL, the
//! request's verb) allows, both asked of the API server and cached briefly ([`auth`]).
//!
//! | piece | module | kcm's source |
//! |---|---|---|
//! | flags, defaults | [`SecureServingFlags`] | `k8s.io/apiserver/pkg/server/options/serving.go`, `authentication.go`, `authorization.go`; kcm's `app/options/options.go` |
//! | certificate: files, or an in-memory self-signed one | [`tls`] | `SecureServingOptions.MaybeDefaultWithSelfSignedCerts("localhost", nil, [127.0.0.1])` |
//! | authentication, authorization, caches | [`auth`] | `authenticatorfactory/delegating.go`, `authorizerfactory/delegating.go`, `authorization/path` |
//! | the accept loop and its bounds, shared with the plain ports ([`crate::http_server`]) | [`server`] | — |
//!
//! The plain `--metrics-bind-address` / `--health-probe-bind-address` servers stay for local use
//! (a developer's machine, `kubectl port-forward`); they are off (`0`) by default, as kcm has no
//! plain ports, and when on they run the same accept loop ([`crate::http_server`]) without TLS, with the same
//! bounds.
//!
//! ```no_run
//! # async fn demo(client: kube::Client, health: nodeipam::controller::Health,
//! #               metrics: metrics_exporter_prometheus::PrometheusHandle) -> Result<(), nodeipam::serving::ServingError> {
//! use clap::Parser as _;
//! let cli = nodeipam::flags::Cli::parse_from(["nodeipam-controller", "--secure-port=10257"]);
//! if let Some(serving) = cli.serving.resolve(&client).await? {
//!     let listener = serving.bind().await?;
//!     let router = nodeipam::serving::router(health, metrics, serving.auth.clone());
//!     nodeipam::serving::serve(listener, serving.tls.clone(), router, std::future::pending()).await;
//! }
//! # Ok(()) }
//! ```

pub mod auth;
pub mod server;
pub mod tls;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use kube::Client;
use metrics_exporter_prometheus::PrometheusHandle;

pub use auth::{CacheTtls, DelegatedAuth, Verdict};
pub use server::serve;
pub use tls::{CertificateFiles, RELOAD_INTERVAL, ServingCertificate};

/// The flags live with the other flags ([`crate::flags::serving`]); re-exported here, where the
/// secure port is built from them.
pub use crate::flags::serving::{
    AlwaysAllowPaths, BindIp, DEFAULT_ALWAYS_ALLOW_PATHS, DEFAULT_SECURE_PORT, SecureServingFlags,
};

use crate::client::ClientConfigError;
use crate::health::Health;

/// Why secure serving could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServingError {
    /// Only one of `--tls-cert-file` and `--tls-private-key-file` was given.
    #[error("--tls-cert-file and --tls-private-key-file must be given together")]
    CertificatePair,
    /// A certificate or key file could not be read or holds no usable PEM.
    #[error("{flag} {path}: {message}")]
    CertificateFile {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The certificate and key do not make a serving identity (e.g. the key does not match).
    #[error("--tls-cert-file/--tls-private-key-file: {0}")]
    Tls(#[source] rustls::Error),
    /// The in-memory self-signed certificate could not be generated.
    #[error("cannot generate the self-signed serving certificate: {0}")]
    SelfSigned(#[source] rcgen::Error),
    /// `--authentication-kubeconfig` or `--authorization-kubeconfig` is not usable.
    #[error("{flag}: {source}")]
    Kubeconfig {
        /// The flag.
        flag: &'static str,
        /// The client configuration error.
        #[source]
        source: Box<ClientConfigError>,
    },
    /// The secure port could not be bound.
    #[error("cannot listen on {address} (--secure-port/--bind-address): {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ServingError {
    /// 2 for a flag or file error (fix the command line), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ServingError::CertificatePair
            | ServingError::CertificateFile { .. }
            | ServingError::Tls(_)
            | ServingError::Kubeconfig { .. } => 2,
            ServingError::SelfSigned(_) | ServingError::Listen { .. } => 1,
        }
    }
}

/// Secure serving, ready to bind: the address, the TLS configuration and the delegated
/// authenticator/authorizer.
#[derive(Clone)]
pub struct SecureServing {
    /// Where to listen (`[::]:port` for an unspecified `--bind-address`).
    pub address: SocketAddr,
    /// The TLS server configuration (HTTP/1.1 via ALPN).
    pub tls: Arc<rustls::ServerConfig>,
    /// Where the certificate came from (the self-signed CA, for tests and logs).
    pub certificate: ServingCertificate,
    /// Authentication and authorization of every request.
    pub auth: DelegatedAuth,
}

impl std::fmt::Debug for SecureServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureServing")
            .field("address", &self.address)
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

impl SecureServingFlags {
    /// Loads or generates the certificate and builds the review clients: `default_client` (the
    /// controller's own) unless `--authentication-kubeconfig`/`--authorization-kubeconfig` name
    /// another. `None` when `--secure-port=0`.
    ///
    /// # Errors
    /// [`ServingError`] naming the flag or file that is wrong.
    pub async fn resolve(
        &self,
        default_client: &Client,
    ) -> Result<Option<SecureServing>, ServingError> {
        if !self.enabled() {
            return Ok(None);
        }
        let (tls, certificate) = tls::server_config(
            self.tls_cert_file.as_deref(),
            self.tls_private_key_file.as_deref(),
            self.bind_address.0,
        )?;
        let authentication = review_client(
            self.authentication_kubeconfig.as_deref(),
            default_client,
            "--authentication-kubeconfig",
        )
        .await?;
        let authorization = review_client(
            self.authorization_kubeconfig.as_deref(),
            default_client,
            "--authorization-kubeconfig",
        )
        .await?;
        let auth = DelegatedAuth::new(
            authentication,
            authorization,
            self.authorization_always_allow_paths.clone(),
            CacheTtls::default(),
        );
        Ok(Some(SecureServing {
            address: self.socket_address(),
            tls,
            certificate,
            auth,
        }))
    }
}

impl SecureServing {
    /// Binds the listener. For the unspecified address it tries `[::]` (both families) first and
    /// falls back to `0.0.0.0` where IPv6 is not available.
    ///
    /// # Errors
    /// [`ServingError::Listen`].
    pub async fn bind(&self) -> Result<tokio::net::TcpListener, ServingError> {
        match tokio::net::TcpListener::bind(self.address).await {
            Ok(listener) => Ok(listener),
            Err(source) if self.address.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
                let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), self.address.port());
                tokio::net::TcpListener::bind(v4)
                    .await
                    .map_err(|_| ServingError::Listen {
                        address: self.address,
                        source,
                    })
            }
            Err(source) => Err(ServingError::Listen {
                address: self.address,
                source,
            }),
        }
    }
}

async fn review_client(
    kubeconfig: Option<&std::path::Path>,
    default_client: &Client,
    flag: &'static str,
) -> Result<Client, ServingError> {
    let Some(path) = kubeconfig else {
        return Ok(default_client.clone());
    };
    let wrap = |e: ClientConfigError| ServingError::Kubeconfig {
        flag,
        source: Box::new(e),
    };
    let config = crate::client::config_from_kubeconfig(path)
        .await
        .map_err(wrap)?;
    Client::try_from(config).map_err(|e| {
        wrap(ClientConfigError::new(
            path.display().to_string(),
            e.to_string(),
        ))
    })
}

/// The secure port's routes — `/healthz`, `/livez`, `/readyz` (the probe router) and `/metrics`
/// — behind [`DelegatedAuth`]: anything else answers 404 once authorized.
pub fn router(health: Health, metrics: PrometheusHandle, auth: DelegatedAuth) -> Router {
    crate::health::router(health)
        .merge(crate::health::metrics_router(metrics))
        .layer(axum::middleware::from_fn_with_state(auth, auth::middleware))
}

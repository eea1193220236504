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
//! | the TLS accept loop | [`server`] | — |
//!
//! The plain `--metrics-bind-address` / `--health-probe-bind-address` servers stay for local use
//! (a developer's machine, `kubectl port-forward`); in a cluster they are turned off (`0`) and
//! only the secure port is served.
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
use clap::Args;
use kube::Client;
use metrics_exporter_prometheus::PrometheusHandle;

pub use auth::{AlwaysAllowPaths, CacheTtls, DelegatedAuth, Verdict};
pub use server::serve;
pub use tls::{CertificateFiles, RELOAD_INTERVAL, ServingCertificate};

use crate::controller::Health;

/// kube-controller-manager's secure port (`ports.KubeControllerManagerPort`).
pub const DEFAULT_SECURE_PORT: u16 = 10257;

/// kcm's default `--authorization-always-allow-paths`: the probes, so the kubelet needs no token.
pub const DEFAULT_ALWAYS_ALLOW_PATHS: &str = "/healthz,/readyz,/livez";

/// The secure-serving flags, kube-controller-manager's names and defaults, read as pflag reads
/// them (global, so `plan` takes the whole command line). Exactly these seven are implemented;
/// kcm's other `--tls-*`, `--authentication-*` and `--authorization-*` flags (cipher suites, SNI
/// certificates, cache TTLs, client-CA and request-header authentication) are accepted and
/// ignored with a reason ([`crate::flags::kcm::KCM_FLAGS`]).
#[derive(Debug, Clone, Args)]
pub struct SecureServingFlags {
    /// HTTPS port for /healthz, /livez, /readyz and /metrics with authentication and
    /// authorization; 0 disables it.
    #[arg(long, global = true, value_name = "PORT", default_value_t = DEFAULT_SECURE_PORT,
          value_parser = crate::flags::pflag::parse_int_as::<u16>)]
    pub secure_port: u16,
    /// IP address to listen on for --secure-port. Empty or unspecified (0.0.0.0, ::) listens on
    /// all interfaces and both address families.
    #[arg(long, global = true, value_name = "IP", default_value = "0.0.0.0", value_parser = parse_bind_ip)]
    pub bind_address: BindIp,
    /// PEM file with the serving certificate (and any intermediates after it). Without it (and
    /// --tls-private-key-file), a self-signed certificate for localhost is generated in memory.
    #[arg(long, global = true, value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file with the private key matching --tls-cert-file.
    #[arg(long, global = true, value_name = "PATH")]
    pub tls_private_key_file: Option<PathBuf>,
    /// kubeconfig of the API server that answers TokenReviews (default: the controller's own
    /// client).
    #[arg(long, global = true, value_name = "PATH")]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// kubeconfig of the API server that answers SubjectAccessReviews (default: the controller's
    /// own client).
    #[arg(long, global = true, value_name = "PATH")]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// Comma-separated HTTP paths served without authentication or authorization; a trailing `*`
    /// matches a prefix, the leading `/` is optional.
    #[arg(long, global = true, value_name = "PATHS", default_value = DEFAULT_ALWAYS_ALLOW_PATHS,
          value_parser = parse_always_allow_paths)]
    pub authorization_always_allow_paths: AlwaysAllowPaths,
}

/// `--bind-address`: `None` for empty or unspecified (all interfaces, both families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindIp(pub Option<IpAddr>);

fn parse_bind_ip(text: &str) -> Result<BindIp, String> {
    if text.is_empty() {
        return Ok(BindIp(None));
    }
    let ip: IpAddr = text
        .parse()
        .map_err(|_| "expected an IP address such as 0.0.0.0, 127.0.0.1 or ::".to_owned())?;
    Ok(BindIp((!ip.is_unspecified()).then_some(ip)))
}

fn parse_always_allow_paths(text: &str) -> Result<AlwaysAllowPaths, String> {
    AlwaysAllowPaths::parse(text)
}

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
        source: Box<crate::Error>,
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
    /// Whether secure serving is on (`--secure-port` ≠ 0).
    pub fn enabled(&self) -> bool {
        self.secure_port != 0
    }

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

    /// `--bind-address`:`--secure-port`; an unspecified address becomes `[::]` (dual-stack on
    /// Linux, as Go's listener on `0.0.0.0` is).
    pub fn socket_address(&self) -> SocketAddr {
        let ip = self
            .bind_address
            .0
            .unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        SocketAddr::new(ip, self.secure_port)
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
    let wrap = |e: crate::Error| ServingError::Kubeconfig {
        flag,
        source: Box::new(e),
    };
    let config = crate::controller::client::config_from_kubeconfig(path)
        .await
        .map_err(wrap)?;
    Client::try_from(config).map_err(|e| {
        wrap(crate::Error::client_config(
            path.display().to_string(),
            e.to_string(),
        ))
    })
}

/// The secure port's routes — `/healthz`, `/livez`, `/readyz` (the probe router) and `/metrics`
/// — behind [`DelegatedAuth`]: anything else answers 404 once authorized.
pub fn router(health: Health, metrics: PrometheusHandle, auth: DelegatedAuth) -> Router {
    crate::controller::health_router(health)
        .merge(crate::controller::metrics_router(metrics))
        .layer(axum::middleware::from_fn_with_state(auth, auth::middleware))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn flags(args: &[&str]) -> Result<SecureServingFlags, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serving: SecureServingFlags,
        }
        let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|cli| cli.serving)
    }

    #[test]
    fn defaults_match_kube_controller_manager() {
        let f = flags(&[]).expect("parses");
        assert_eq!(f.secure_port, 10257);
        assert_eq!(f.bind_address, BindIp(None));
        assert!(f.tls_cert_file.is_none() && f.tls_private_key_file.is_none());
        assert!(f.authentication_kubeconfig.is_none() && f.authorization_kubeconfig.is_none());
        for open in ["/healthz", "/readyz", "/livez"] {
            assert!(f.authorization_always_allow_paths.allows(open), "{open}");
        }
        assert!(!f.authorization_always_allow_paths.allows("/metrics"));
        assert_eq!(
            f.socket_address(),
            "[::]:10257".parse::<SocketAddr>().expect("addr")
        );
    }

    #[test]
    fn flag_values() {
        let f = flags(&[
            "--secure-port=0",
            "--bind-address=127.0.0.1",
            "--authorization-always-allow-paths=/metrics,/debug/*",
        ])
        .expect("parses");
        assert!(!f.enabled());
        assert_eq!(
            f.bind_address,
            BindIp(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
        );
        assert!(f.authorization_always_allow_paths.allows("/metrics"));
        assert!(f.authorization_always_allow_paths.allows("/debug/pprof"));
        assert!(!f.authorization_always_allow_paths.allows("/healthz"));
        let none = flags(&["--authorization-always-allow-paths="]).expect("parses");
        assert!(!none.authorization_always_allow_paths.allows("/healthz"));
        assert_eq!(
            flags(&["--bind-address=::"]).expect("parses").bind_address,
            BindIp(None)
        );
        assert_eq!(
            flags(&["--bind-address="]).expect("parses").bind_address,
            BindIp(None)
        );
        for bad in [
            "--secure-port=70000",
            "--bind-address=localhost",
            "--authorization-always-allow-paths=/a*b",
        ] {
            assert!(flags(&[bad]).is_err(), "{bad}");
        }
    }
}

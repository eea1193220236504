//! The secure-serving flags (`--secure-port`, `--bind-address`, `--tls-*`,
//! `--authentication-kubeconfig`, `--authorization-*`): kube-controller-manager's names, defaults
//! and parsing (`k8s.io/apiserver/pkg/server/options/serving.go`, `authentication.go`,
//! `authorization.go`). What is built from them — certificate, review clients, listener — is
//! [`crate::serving`]'s.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use clap::Args;

/// kube-controller-manager's secure port (`ports.KubeControllerManagerPort`).
pub const DEFAULT_SECURE_PORT: u16 = 10257;

/// kcm's default `--authorization-always-allow-paths`: the probes, so the kubelet needs no token.
pub const DEFAULT_ALWAYS_ALLOW_PATHS: &str = "/healthz,/readyz,/livez";

/// The secure-serving flags, kube-controller-manager's names and defaults, read as pflag reads
/// them (global, so `plan` takes the whole command line). Exactly these seven are implemented;
/// kcm's other `--tls-*`, `--authentication-*` and `--authorization-*` flags (cipher suites, SNI
/// certificates, cache TTLs, client-CA and request-header authentication) are accepted and
/// ignored with a reason ([`super::kcm::KCM_FLAGS`]).
#[derive(Debug, Clone, Args)]
pub struct SecureServingFlags {
    /// HTTPS port for /healthz, /livez, /readyz and /metrics with authentication and
    /// authorization; 0 disables it.
    #[arg(long, global = true, value_name = "PORT", default_value_t = DEFAULT_SECURE_PORT,
          value_parser = super::pflag::parse_int_as::<u16>)]
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

/// `--authorization-always-allow-paths`, with kcm's rules (`k8s.io/apiserver/pkg/authorization/path`
/// `NewAuthorizer`): comma-separated; the leading `/` is optional; a trailing `*` matches any path
/// with that prefix; `*` anywhere else is an error; empty entries are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlwaysAllowPaths {
    exact: BTreeSet<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllowPaths {
    /// Parses the flag's value.
    ///
    /// # Errors
    /// A message for an entry with a `*` before its end.
    pub fn parse(text: &str) -> Result<AlwaysAllowPaths, String> {
        let mut paths = AlwaysAllowPaths::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let entry = entry.strip_prefix('/').unwrap_or(entry);
            match entry.strip_suffix('*') {
                Some(prefix) if prefix.contains('*') => {
                    return Err(format!("only a trailing * is allowed in {entry:?}"));
                }
                Some(prefix) => paths.prefixes.push(prefix.to_owned()),
                None if entry.contains('*') => {
                    return Err(format!("only a trailing * is allowed in {entry:?}"));
                }
                None => {
                    paths.exact.insert(entry.to_owned());
                }
            }
        }
        Ok(paths)
    }

    /// Whether `path` (as in the request line, without the query) is always allowed.
    pub fn allows(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        self.exact.contains(path) || self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
    }
}

impl SecureServingFlags {
    /// Whether secure serving is on (`--secure-port` ≠ 0).
    pub fn enabled(&self) -> bool {
        self.secure_port != 0
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

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

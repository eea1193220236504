//! The Kubernetes client configuration, validated before anything starts, with
//! kube-controller-manager's semantics (`clientcmd.BuildConfigFromFlags(master, kubeconfig)`):
//!
//! | flags | configuration |
//! |---|---|
//! | `--kubeconfig PATH` (± `--master`) | that file's current context; `--master` overrides its server |
//! | `--master URL` alone | that server and **no credentials** (no kubeconfig file, no in-cluster token is read: kcm's loading rules with an empty explicit path load nothing) |
//! | neither | the in-cluster service account (`KUBERNETES_SERVICE_HOST`/`_PORT` and the mounted token); outside a Pod, exit 2 |
//!
//! `$KUBECONFIG` and `~/.kube/config` are never read: kcm's `BuildConfigFromFlags` passes
//! `ClientConfigLoadingRules{ExplicitPath: kubeconfig}` without the default precedence list, so
//! with an empty `--kubeconfig` it loads no file at all — with `--master` alone it sends no
//! credentials, and with neither flag it uses the in-cluster config or fails with "no
//! configuration has been provided" (client-go `tools/clientcmd/client_config.go`,
//! `BuildConfigFromFlags`; `merged_client_builder.go`, `DeferredLoadingClientConfig.ClientConfig`).
//! So a shell whose `$KUBECONFIG` points at a real cluster never leaks that cluster's token to
//! another `--master`, and an operator's kubeconfig is used only when named with `--kubeconfig`.
//!
//! A server without a scheme (`127.0.0.1:6443`) is completed as client-go's `DefaultServerURL`
//! does: `https://` when TLS is configured for it (a CA, a client certificate, `insecure-skip-tls-verify`
//! or `tls-server-name`), else `http://`. Any other malformed server is refused, naming the flag or
//! file (exit status 2). Every request carries `User-Agent: nodeipam-controller/<version>`, and
//! kube-rs's automatic retries are off: the controller decides itself what a failed write means.

use std::path::Path;

use http::HeaderValue;
use http::header::USER_AGENT;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use kube::Client;

use crate::flags::ControllerFlags;

/// A client configuration that cannot work: the flag or file it came from and what is wrong
/// (exit status 2, as kube-controller-manager exits on a bad `--kubeconfig`). The shell's
/// [`crate::Error::ClientConfig`] carries the same two fields and the same message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Kubernetes client configuration: {origin}: {message}")]
pub struct ClientConfigError {
    /// The flag or file the configuration came from (e.g. `--master`).
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

impl ClientConfigError {
    /// The error for `origin` (a flag or file) and what is wrong with it.
    pub fn new(origin: impl Into<String>, message: impl Into<String>) -> ClientConfigError {
        ClientConfigError {
            origin: origin.into(),
            message: message.into(),
        }
    }

    /// The process exit status: always 2 (a flag or file to fix).
    pub fn exit_code(&self) -> i32 {
        2
    }
}

/// `nodeipam-controller/<version>`, sent on every request (audit logs, `managedFields`).
pub const USER_AGENT_VALUE: &str = concat!("nodeipam-controller/", env!("CARGO_PKG_VERSION"));

/// client-go's `DefaultServerURL` completion, plus the checks client-go leaves to the first
/// request: `server` with a scheme must be `http://` or `https://` with a host; without one it
/// gets `https://` if `tls_configured`, else `http://`.
///
/// # Errors
/// One line saying what is wrong with `server`.
pub fn server_url(server: &str, tls_configured: bool) -> Result<http::Uri, String> {
    if server.is_empty() {
        return Err("the server must be a URL or a host:port pair, not empty".to_owned());
    }
    if server.chars().any(char::is_whitespace) {
        return Err(format!("{server:?} contains whitespace"));
    }
    let full = if server.contains("://") {
        server.to_owned()
    } else if tls_configured {
        format!("https://{server}")
    } else {
        format!("http://{server}")
    };
    let uri: http::Uri = full
        .parse()
        .map_err(|e| format!("{server:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "{server:?} has scheme {other:?}; the API server is reached over http:// or https://"
            ));
        }
        None => return Err(format!("{server:?} has no scheme")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{server:?} has no host"));
    }
    Ok(uri)
}

/// The client configuration the flags describe (see the module documentation).
///
/// # Errors
/// [`ClientConfigError`] naming the flag or file that is wrong.
pub async fn config_from_flags(flags: &ControllerFlags) -> Result<Config, ClientConfigError> {
    let mut config = match (&flags.kubeconfig, &flags.master) {
        (Some(path), master) => from_kubeconfig_file(path, master.as_deref()).await?,
        (None, Some(master)) => {
            let uri = server_url(master, false)
                .map_err(|message| ClientConfigError::new("--master", message))?;
            Config::new(uri)
        }
        (None, None) => {
            let mut config = Config::incluster().map_err(|e| {
                ClientConfigError::new(
                    "neither --kubeconfig nor --master is given",
                    format!(
                        "no in-cluster configuration ({e}); outside a Pod give --kubeconfig (as kube-controller-manager, $KUBECONFIG and ~/.kube/config are not read)"
                    ),
                )
            })?;
            let tls = config.root_cert.is_some()
                || config.root_cert_file.is_some()
                || config.accept_invalid_certs
                || config.tls_server_name.is_some();
            config.cluster_url =
                server_url(&config.cluster_url.to_string(), tls).map_err(|message| {
                    ClientConfigError::new("the inferred client configuration", message)
                })?;
            config
        }
    };
    finish(&mut config)?;
    Ok(config)
}

/// A configuration for a plain URL without credentials (tests, `kubectl proxy`), as `--master`.
///
/// # Errors
/// [`ClientConfigError`] if `url` is not usable.
pub fn config_for_url(url: &str) -> Result<Config, ClientConfigError> {
    let uri = server_url(url, false).map_err(|message| ClientConfigError::new(url, message))?;
    let mut config = Config::new(uri);
    finish(&mut config)?;
    Ok(config)
}

/// The configuration of a kubeconfig file's current context (no `--master` override), with the
/// same checks and finishing as [`config_from_flags`] (`--authentication-kubeconfig`,
/// `--authorization-kubeconfig`).
///
/// # Errors
/// [`ClientConfigError`] naming the file.
pub async fn config_from_kubeconfig(path: &Path) -> Result<Config, ClientConfigError> {
    let mut config = from_kubeconfig_file(path, None).await?;
    finish(&mut config)?;
    Ok(config)
}

/// A client for an API server URL with no credentials (tests, `kubectl proxy`); a URL without a
/// scheme gets `http://`, as `--master` does.
///
/// # Errors
/// [`ClientConfigError`] for a bad URL or TLS setup.
pub fn client_for_url(url: &str) -> Result<Client, ClientConfigError> {
    let config = config_for_url(url)?;
    Client::try_from(config).map_err(|e| ClientConfigError::new(url, e.to_string()))
}

/// A client as kube-controller-manager builds it from `--kubeconfig`/`--master` (see the module
/// documentation), and the API server URL it talks to (for the start-up line).
///
/// # Errors
/// [`ClientConfigError`] naming what failed (exit status 2).
pub async fn client_from_flags(
    flags: &ControllerFlags,
) -> Result<(Client, String), ClientConfigError> {
    let config = config_from_flags(flags).await?;
    let url = config.cluster_url.to_string();
    let origin = match (&flags.kubeconfig, &flags.master) {
        (Some(path), _) => format!("--kubeconfig {}", path.display()),
        (None, Some(_)) => "--master".to_owned(),
        (None, None) => "the in-cluster configuration".to_owned(),
    };
    let client =
        Client::try_from(config).map_err(|e| ClientConfigError::new(origin, e.to_string()))?;
    Ok((client, url))
}

fn finish(config: &mut Config) -> Result<(), ClientConfigError> {
    config.default_retry = false;
    let agent = HeaderValue::from_static(USER_AGENT_VALUE);
    config.headers.retain(|(name, _)| name != USER_AGENT);
    config.headers.push((USER_AGENT, agent));
    Ok(())
}

async fn from_kubeconfig_file(
    path: &Path,
    master: Option<&str>,
) -> Result<Config, ClientConfigError> {
    let origin = || format!("--kubeconfig {}", path.display());
    let mut kubeconfig =
        Kubeconfig::read_from(path).map_err(|e| ClientConfigError::new(origin(), e.to_string()))?;
    let context_name = kubeconfig.current_context.clone().unwrap_or_default();
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone());
    let user_has_cert = context
        .as_ref()
        .and_then(|c| c.user.as_ref())
        .and_then(|user| kubeconfig.auth_infos.iter().find(|a| &a.name == user))
        .and_then(|a| a.auth_info.as_ref())
        .is_some_and(|a| a.client_certificate.is_some() || a.client_certificate_data.is_some());
    let cluster_name = context.map(|c| c.cluster);
    for named in &mut kubeconfig.clusters {
        let in_use = cluster_name.as_deref() == Some(named.name.as_str());
        let Some(cluster) = named.cluster.as_mut() else {
            continue;
        };
        let tls = cluster.certificate_authority.is_some()
            || cluster.certificate_authority_data.is_some()
            || cluster.insecure_skip_tls_verify == Some(true)
            || cluster.tls_server_name.is_some()
            || (in_use && user_has_cert);
        let server = match (master, in_use) {
            (Some(master), true) => Some(
                server_url(master, tls)
                    .map_err(|message| ClientConfigError::new("--master", message))?,
            ),
            _ => match cluster.server.as_deref() {
                Some(server) => Some(server_url(server, tls).map_err(|message| {
                    ClientConfigError::new(
                        format!("{}: cluster {:?} server", origin(), named.name),
                        message,
                    )
                })?),
                None => None,
            },
        };
        if let Some(server) = server {
            cluster.server = Some(server.to_string());
        }
    }
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| ClientConfigError::new(origin(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_completed_as_client_go_does() {
        let ok = |server: &str, tls: bool| server_url(server, tls).map(|u| u.to_string());
        assert_eq!(
            ok("127.0.0.1:18101", false).as_deref(),
            Ok("http://127.0.0.1:18101/")
        );
        assert_eq!(
            ok("127.0.0.1:6443", true).as_deref(),
            Ok("https://127.0.0.1:6443/")
        );
        assert_eq!(
            ok("localhost:8080", false).as_deref(),
            Ok("http://localhost:8080/")
        );
        assert_eq!(
            ok("https://10.0.0.1", false).as_deref(),
            Ok("https://10.0.0.1/")
        );
        assert_eq!(
            ok("http://[::1]:8080/prefix", true).as_deref(),
            Ok("http://[::1]:8080/prefix")
        );
        for bad in [
            "",
            "ftp://host",
            "http://",
            " http://a",
            "http://a b",
            "://x",
        ] {
            assert!(server_url(bad, false).is_err(), "{bad:?} is refused");
        }
    }

    fn flags(args: &[&str]) -> ControllerFlags {
        use clap::Parser as _;
        let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
        crate::flags::Cli::try_parse_from(argv)
            .expect("parses")
            .controller
    }

    #[tokio::test]
    async fn master_alone_sends_no_credentials_and_our_user_agent() {
        let config = config_from_flags(&flags(&["--master=127.0.0.1:18101"]))
            .await
            .expect("valid");
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:18101/");
        assert!(config.auth_info.token.is_none() && config.auth_info.token_file.is_none());
        assert!(!config.default_retry);
        assert!(
            config
                .headers
                .iter()
                .any(|(n, v)| n == USER_AGENT && v == USER_AGENT_VALUE)
        );
    }

    /// Outside a Pod, neither flag is an error naming both flags — even when `$KUBECONFIG` or
    /// `~/.kube/config` exist (kcm reads neither). The test process has no in-cluster
    /// environment unless it runs in a Pod; then it checks nothing.
    #[tokio::test]
    async fn neither_flag_outside_a_pod_is_refused_without_reading_kubeconfig() {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return;
        }
        let error = config_from_flags(&flags(&[]))
            .await
            .expect_err("no in-cluster config here");
        assert_eq!(error.exit_code(), 2);
        let text = error.to_string();
        assert!(
            text.contains("--kubeconfig") && text.contains("--master"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_kubeconfig_server_without_a_scheme_is_completed_or_refused() {
        let dir = std::env::temp_dir().join(format!("nodeipam-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let write = |name: &str, server: &str| {
            let path = dir.join(name);
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user: {{}}\n"
                ),
            )
            .expect("write kubeconfig");
            path
        };
        let plain = write("plain", "127.0.0.1:18102");
        let config = config_from_flags(&flags(&[&format!("--kubeconfig={}", plain.display())]))
            .await
            .expect("completed");
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:18102/");
        let bad = write("bad", "gopher://127.0.0.1:70");
        let error = config_from_flags(&flags(&[&format!("--kubeconfig={}", bad.display())]))
            .await
            .expect_err("refused");
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("--kubeconfig"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

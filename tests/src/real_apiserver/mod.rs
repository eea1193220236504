//! The real control plane for the real-server tests (issue 16): upstream etcd and kube-apiserver,
//! built from their published Go modules by `tests/upstream/build.sh`, started on 127.0.0.1 with
//! free ports and a temporary data directory, stopped (SIGKILL, then reaped) when the
//! [`RealCluster`] is dropped — also when a test panics, since unwinding runs `Drop`.
//!
//! The binaries are found in the folder named by [`BIN_ENV`] (`build.sh`'s last line). A missing
//! variable, a missing binary, a process that exits, or a server that is not ready within
//! [`READY_TIMEOUT`] is an [`StartError`]: the tests fail, they never skip.
//!
//! What the servers are started with (as few flags as the tests need; [`Options`] adds more):
//!
//! | process | flag | why |
//! |---|---|---|
//! | etcd | `--data-dir` (temp), `--listen-client-urls`/`--advertise-client-urls` `http://127.0.0.1:<free>`, `--listen-peer-urls`/`--initial-advertise-peer-urls`/`--initial-cluster` on another free port | a one-member cluster on loopback; plain HTTP (the tests never leave 127.0.0.0/8) |
//! | etcd | `--unsafe-no-fsync` | a throw-away store: no fsync on 2 shared cores |
//! | kube-apiserver | `--etcd-servers` | the etcd above |
//! | kube-apiserver | `--bind-address=127.0.0.1`, `--advertise-address=127.0.0.1`, `--secure-port=<free>` | loopback only |
//! | kube-apiserver | `--tls-cert-file`, `--tls-private-key-file`, `--cert-dir` (temp) | a serving certificate for `127.0.0.1`/`localhost` signed by a CA generated here ([`pki`]) |
//! | kube-apiserver | `--authorization-mode=Node,RBAC` | as a real cluster: the controller gets only what RBAC grants |
//! | kube-apiserver | `--token-auth-file` | one static token ([`ADMIN_TOKEN`]), user `nodeipam-test-admin` in `system:masters`: the tests' own credential |
//! | kube-apiserver | `--service-account-key-file`, `--service-account-signing-key-file`, `--service-account-issuer` | an ECDSA P-256 key generated here, so TokenRequest and TokenReview work |
//! | kube-apiserver | `--service-cluster-ip-range=10.0.0.0/24` | required to be valid; upstream's default, given so it does not warn |
//!
//! [`RealCluster::start_extra_apiserver`] adds a second kube-apiserver with the same flags on
//! another free port and `--etcd-servers` of the caller's choice (this etcd, or a proxy in front
//! of it): an HA control plane's two API servers on one etcd.

pub mod pki;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

/// Environment variable naming the folder that holds `etcd` and `kube-apiserver`
/// (`tests/upstream/build.sh` prints it as its last line).
pub const BIN_ENV: &str = "NODEIPAM_UPSTREAM_BIN";

/// The static bearer token of the tests' admin user (`--token-auth-file`; user
/// `nodeipam-test-admin`, group `system:masters`). Only ever sent to 127.0.0.1.
pub const ADMIN_TOKEN: &str = "nodeipam-real-apiserver-test-admin";

/// The admin user's name, as the API server sees it (audit logs, `managedFields`).
pub const ADMIN_USER: &str = "nodeipam-test-admin";

/// How long [`RealCluster::start`] waits for kube-apiserver's `/readyz` (2 shared cores, and
/// kube-apiserver runs its post-start hooks — RBAC bootstrap, priority and fairness — first).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why the real control plane could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// [`BIN_ENV`] is not set.
    #[error(
        "{BIN_ENV} is not set: build the real control plane with \
         `export {BIN_ENV}=\"$(tests/upstream/build.sh | tail -n 1)\"` (needs Go and the Go module proxy)"
    )]
    MissingEnv,
    /// A binary is not in the [`BIN_ENV`] folder.
    #[error(
        "{path} does not exist or is not a file ({BIN_ENV} must name build.sh's output folder)"
    )]
    MissingBinary {
        /// The path looked for.
        path: PathBuf,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Generating the certificates or keys failed.
    #[error("generating the test PKI: {0}")]
    Pki(#[from] rcgen::Error),
    /// A process exited while the cluster was starting.
    #[error("{name} exited during start-up ({status}); the end of its log:\n{log}")]
    Exited {
        /// `etcd` or `kube-apiserver`.
        name: &'static str,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last lines of its output.
        log: String,
    },
    /// `/readyz` did not answer `ok` in time.
    #[error(
        "kube-apiserver was not ready within {waited:?} (last answer: {last}); the end of its log:\n{log}"
    )]
    NotReady {
        /// How long it waited.
        waited: Duration,
        /// The last `/readyz` answer or error.
        last: String,
        /// The last lines of kube-apiserver's output.
        log: String,
    },
    /// The kube client could not be built from the written kubeconfig.
    #[error("client for {url}: {message}")]
    Client {
        /// The server.
        url: String,
        /// What kube-rs said.
        message: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// Extra flags for the two processes (for example a short etcd compaction interval), appended
/// after the defaults (a repeated flag wins: both parse the last occurrence).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra etcd flags (`--name=value`).
    pub etcd_args: Vec<String>,
    /// Extra kube-apiserver flags (`--name=value`).
    pub apiserver_args: Vec<String>,
}

/// A running process and where its output goes.
#[derive(Debug)]
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Process, StartError> {
        let out = File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {}", program.display())))?;
        Ok(Process { name, child, log })
    }

    /// `Err(Exited)` if it has exited.
    fn check_alive(&mut self) -> Result<(), StartError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(StartError::Exited {
                name: self.name,
                status,
                log: log_tail(&self.log),
            }),
            Ok(None) => Ok(()),
            Err(e) => Err(StartError::Io {
                what: format!("waiting for {}", self.name),
                source: e,
            }),
        }
    }

    /// SIGKILL and reap (idempotent).
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last 40 lines of a log file (or why it cannot be read).
pub fn log_tail(path: &Path) -> String {
    const TAIL_BYTES: u64 = 16 * 1024;
    let mut text = String::new();
    let read = File::open(path).and_then(|mut f| {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("({}: {e})", path.display());
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A free TCP port on 127.0.0.1 (bound, then released for the child to take).
fn free_port() -> Result<u16, StartError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding 127.0.0.1:0"))?;
    let port = listener
        .local_addr()
        .map_err(io("reading a bound port"))?
        .port();
    Ok(port)
}

/// The folder of [`BIN_ENV`] and the path of one binary in it, checked.
fn binary(folder: &Path, name: &str) -> Result<PathBuf, StartError> {
    let path = folder.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(StartError::MissingBinary { path })
    }
}

/// Polls `/readyz` of `url` through `client` until it answers `ok`; `alive` is checked before
/// each try (a process that exited fails at once), `log` is the server's log for the error.
async fn wait_ready_at(
    client: &Client,
    url: &str,
    mut alive: impl FnMut() -> Result<(), StartError>,
    log: &Path,
) -> Result<(), StartError> {
    let start = Instant::now();
    let mut last;
    loop {
        alive()?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| StartError::Client {
                url: url.to_owned(),
                message: e.to_string(),
            })?;
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
            Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
            Ok(Ok(text)) => last = text,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer within 5 s".to_owned(),
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(StartError::NotReady {
                waited: READY_TIMEOUT,
                last,
                log: log_tail(log),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The text of a kubeconfig for server `url` with a bearer `token`, the CA by file path.
fn kubeconfig_text(url: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: user\ncurrent-context: real\n",
        ca = ca.display(),
    )
}

/// The real etcd + kube-apiserver, on loopback, killed on drop.
#[derive(Debug)]
pub struct RealCluster {
    // Field order: the processes are killed (Drop) before the directory is removed.
    etcd: Process,
    apiserver: Option<Process>,
    apiserver_args: Vec<String>,
    apiserver_bin: PathBuf,
    etcd_url: String,
    url: String,
    ca_file: PathBuf,
    started_in: Duration,
    dir: tempfile::TempDir,
}

impl RealCluster {
    /// Starts etcd and kube-apiserver with the default flags (see the module documentation) and
    /// waits for `/readyz`.
    ///
    /// # Errors
    /// See [`StartError`].
    pub async fn start() -> Result<RealCluster, StartError> {
        RealCluster::start_with(Options::default()).await
    }

    /// [`RealCluster::start`] with extra flags.
    ///
    /// # Errors
    /// See [`StartError`].
    pub async fn start_with(options: Options) -> Result<RealCluster, StartError> {
        let started = Instant::now();
        let folder = PathBuf::from(std::env::var_os(BIN_ENV).ok_or(StartError::MissingEnv)?);
        let etcd_bin = binary(&folder, "etcd")?;
        let apiserver_bin = binary(&folder, "kube-apiserver")?;
        let dir = tempfile::Builder::new()
            .prefix("nodeipam-real-apiserver.")
            .tempdir()
            .map_err(io("creating the temporary directory"))?;
        let files = pki::write(dir.path())?;

        let client_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd_args = vec![
            "--name=nodeipam-test".to_owned(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=nodeipam-test={peer_url}"),
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        etcd_args.extend(options.etcd_args);
        let etcd = Process::spawn("etcd", &etcd_bin, &etcd_args, dir.path().join("etcd.log"))?;

        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", dir.path().join("certs").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            "--authorization-mode=Node,RBAC".to_owned(),
            format!("--token-auth-file={}", files.tokens.display()),
            format!(
                "--service-account-key-file={}",
                files.sa_public_key.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_private_key.display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        ];
        apiserver_args.extend(options.apiserver_args);
        let mut cluster = RealCluster {
            etcd,
            apiserver: None,
            apiserver_args,
            apiserver_bin,
            etcd_url: etcd_url.clone(),
            url,
            ca_file: files.ca_cert,
            started_in: Duration::ZERO,
            dir,
        };
        cluster.start_apiserver().await?;
        cluster.started_in = started.elapsed();
        Ok(cluster)
    }

    /// Starts kube-apiserver (again) and waits for `/readyz`.
    async fn start_apiserver(&mut self) -> Result<(), StartError> {
        let log = self.dir.path().join("kube-apiserver.log");
        let process = Process::spawn(
            "kube-apiserver",
            &self.apiserver_bin,
            &self.apiserver_args,
            log,
        )?;
        self.apiserver = Some(process);
        self.wait_ready().await
    }

    /// Polls `/readyz` (as the admin) until it answers `ok`, failing early if a process exits.
    async fn wait_ready(&mut self) -> Result<(), StartError> {
        let client = self.admin_client().await?;
        let url = self.url.clone();
        let log = self.dir.path().join("kube-apiserver.log");
        let (etcd, apiserver) = (&mut self.etcd, &mut self.apiserver);
        let alive = || {
            etcd.check_alive()?;
            if let Some(apiserver) = apiserver.as_mut() {
                apiserver.check_alive()?;
            }
            Ok(())
        };
        wait_ready_at(&client, &url, alive, &log).await
    }

    /// `https://127.0.0.1:<port>` of kube-apiserver.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA certificate (PEM) that signed kube-apiserver's serving certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The temporary directory holding the data, certificates, kubeconfigs and logs (removed on
    /// drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// From the start of [`RealCluster::start`] to the first `ok` from `/readyz` (PKI, both
    /// processes, kube-apiserver's post-start hooks).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// etcd's process id (for reading its `/proc` figures, e.g. the scale benchmark's RSS).
    pub fn etcd_pid(&self) -> u32 {
        self.etcd.child.id()
    }

    /// kube-apiserver's process id, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(|p| p.child.id())
    }

    /// The last lines of kube-apiserver's output.
    pub fn apiserver_log(&self) -> String {
        log_tail(&self.dir.path().join("kube-apiserver.log"))
    }

    /// Writes a kubeconfig for this server with a bearer `token` (the CA by file path) to `path`:
    /// what `nodeipam-controller --kubeconfig` reads.
    ///
    /// # Errors
    /// [`StartError::Io`] if the file cannot be written.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<(), StartError> {
        let text = kubeconfig_text(&self.url, &self.ca_file, token);
        std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
    }

    /// Writes a kubeconfig for another server `url` of this cluster (a second kube-apiserver, or
    /// a proxy in front of one: the serving certificate names `127.0.0.1`) with `token` into the
    /// temporary directory as `<name>.kubeconfig` and returns its path.
    ///
    /// # Errors
    /// [`StartError::Io`] if the file cannot be written.
    pub fn kubeconfig_for(
        &self,
        name: &str,
        url: &str,
        token: &str,
    ) -> Result<PathBuf, StartError> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig_text(url, &self.ca_file, token))
            .map_err(io(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// Writes a kubeconfig with `token` into the temporary directory as `<name>.kubeconfig` and
    /// returns its path.
    ///
    /// # Errors
    /// [`StartError::Io`] if the file cannot be written.
    pub fn kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, StartError> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        self.write_kubeconfig(&path, token)?;
        Ok(path)
    }

    /// A kube client (kube-rs defaults) with a bearer `token`, through a written kubeconfig.
    ///
    /// # Errors
    /// [`StartError::Client`] if kube-rs refuses the configuration.
    pub async fn client_with_token(&self, name: &str, token: &str) -> Result<Client, StartError> {
        self.client_at(name, &self.url, token).await
    }

    /// [`RealCluster::client_with_token`] for another server `url` of this cluster
    /// ([`RealCluster::kubeconfig_for`]).
    ///
    /// # Errors
    /// [`StartError::Client`] if kube-rs refuses the configuration.
    pub async fn client_at(
        &self,
        name: &str,
        url: &str,
        token: &str,
    ) -> Result<Client, StartError> {
        let path = self.kubeconfig_for(name, url, token)?;
        let client_error = |message: String| StartError::Client {
            url: url.to_owned(),
            message,
        };
        let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| client_error(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_error(e.to_string()))?;
        Client::try_from(config).map_err(|e| client_error(e.to_string()))
    }

    /// The tests' admin client ([`ADMIN_TOKEN`], `system:masters`).
    ///
    /// # Errors
    /// [`StartError::Client`] if kube-rs refuses the configuration.
    pub async fn admin_client(&self) -> Result<Client, StartError> {
        self.client_with_token("admin", ADMIN_TOKEN).await
    }

    /// Compacts etcd's history up to its current revision (etcd's JSON gateway:
    /// `POST /v3/maintenance/status` for the revision, then `POST /v3/kv/compaction`, physical),
    /// as kube-apiserver's own compactor does every `--etcd-compaction-interval`: afterwards a
    /// LIST continue token or a WATCH that reaches etcd from an older resourceVersion gets
    /// `410 Gone`/`Expired`. Returns the revision compacted to.
    ///
    /// # Errors
    /// [`StartError::Client`] if etcd does not answer as expected.
    pub async fn compact_etcd(&self) -> Result<i64, StartError> {
        let fail = |message: String| StartError::Client {
            url: self.etcd_url.clone(),
            message,
        };
        let uri: http::Uri = self.etcd_url.parse().map_err(|e| fail(format!("{e}")))?;
        let client = Client::try_from(Config::new(uri)).map_err(|e| fail(e.to_string()))?;
        let post = |path: &str, body: serde_json::Value| {
            http::Request::post(path)
                .header("Content-Type", "application/json")
                .body(body.to_string().into_bytes())
                .map_err(|e| fail(e.to_string()))
        };
        let status: serde_json::Value = client
            .request(post("/v3/maintenance/status", serde_json::json!({}))?)
            .await
            .map_err(|e| fail(e.to_string()))?;
        // The gateway writes int64 fields as JSON strings.
        let revision = status["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .ok_or_else(|| fail(format!("no revision in {status}")))?;
        let _: serde_json::Value = client
            .request(post(
                "/v3/kv/compaction",
                serde_json::json!({"revision": revision.to_string(), "physical": true}),
            )?)
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(revision)
    }

    /// etcd's client address (`127.0.0.1:<port>`, plain HTTP/2 gRPC), e.g. for a proxy in front
    /// of it.
    ///
    /// # Errors
    /// [`StartError::Client`] if the URL this harness built does not parse (a bug here).
    pub fn etcd_addr(&self) -> Result<std::net::SocketAddr, StartError> {
        let fail = |message: String| StartError::Client {
            url: self.etcd_url.clone(),
            message,
        };
        let authority = self
            .etcd_url
            .strip_prefix("http://")
            .ok_or_else(|| fail("not an http:// URL".to_owned()))?;
        authority.parse().map_err(|e| fail(format!("{e}")))
    }

    /// Starts one more kube-apiserver with the same flags, PKI and tokens on its own free port,
    /// reaching etcd at `etcd_url` (this cluster's etcd, or a proxy in front of it: an HA control
    /// plane's second API server), and waits for its `/readyz`. It is killed when the returned
    /// [`ExtraApiServer`] is dropped (drop it before the cluster: its log is in the cluster's
    /// temporary directory).
    ///
    /// # Errors
    /// See [`StartError`].
    pub async fn start_extra_apiserver(
        &self,
        etcd_url: &str,
    ) -> Result<ExtraApiServer, StartError> {
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let mut args = self.apiserver_args.clone();
        args.extend([
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={port}"),
            format!(
                "--cert-dir={}",
                self.dir.path().join(format!("certs-{port}")).display()
            ),
        ]);
        let log = self.dir.path().join(format!("kube-apiserver-{port}.log"));
        let mut process =
            Process::spawn("kube-apiserver", &self.apiserver_bin, &args, log.clone())?;
        let client = self
            .client_at(&format!("admin-{port}"), &url, ADMIN_TOKEN)
            .await?;
        wait_ready_at(&client, &url, || process.check_alive(), &log).await?;
        Ok(ExtraApiServer { process, url, log })
    }

    /// Kills kube-apiserver (SIGKILL; etcd keeps running).
    pub fn kill_apiserver(&mut self) {
        if let Some(mut process) = self.apiserver.take() {
            process.kill();
        }
    }

    /// Starts kube-apiserver again on the same port, data and flags, and waits for `/readyz`.
    ///
    /// # Errors
    /// See [`StartError`].
    pub async fn restart_apiserver(&mut self) -> Result<(), StartError> {
        self.kill_apiserver();
        self.start_apiserver().await
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        self.kill_apiserver();
        self.etcd.kill();
    }
}

/// A kube-apiserver started by [`RealCluster::start_extra_apiserver`]; killed (SIGKILL, reaped)
/// on drop.
#[derive(Debug)]
pub struct ExtraApiServer {
    process: Process,
    url: String,
    log: PathBuf,
}

impl ExtraApiServer {
    /// `https://127.0.0.1:<port>` of this kube-apiserver.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The last lines of its output.
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }
}

impl Drop for ExtraApiServer {
    fn drop(&mut self) {
        self.process.kill();
    }
}

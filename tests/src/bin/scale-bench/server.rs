//! The API server of a run: the sandbox (`sandbox-apiserver --replicate`, a separate process) or
//! the real etcd + kube-apiserver ([`nodeipam_tests::real_apiserver::RealCluster`], the Nodes
//! created through the API before the timed part). Each runner gets a fresh server with N Nodes
//! without podCIDRs (a podCIDR cannot be taken back). What the bench reads from it: request
//! counters by verb, 410s, how many Nodes have podCIDRs, and the servers' own RSS.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::core::WatchEvent;
use nodeipam_tests::real_apiserver::{ADMIN_TOKEN, Options, RealCluster};
use nodeipam_tests::sandbox::replicate::Replicas;
use serde::Deserialize;

use crate::http;
use crate::process::{self, Running, Usage};

/// Which API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// The sandbox API server (`sandbox-apiserver`), plain HTTP.
    Sandbox,
    /// etcd + kube-apiserver built by `tests/upstream/build.sh` (`$NODEIPAM_UPSTREAM_BIN`), HTTPS.
    Real,
}

/// Node request counters of the server (since it started).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Counters {
    /// Node PATCHes.
    pub patches: u64,
    /// Node LISTs (every page).
    pub lists: u64,
    /// Node WATCHes.
    pub watches: u64,
    /// Node GETs (real server only; the sandbox does not count them).
    pub gets: u64,
    /// 410 answers on Nodes (sandbox: also in-stream ERROR 410 events; real server: answers with
    /// code 410 in `apiserver_request_total`).
    pub gone410: u64,
}

impl Counters {
    /// `self − before`, per counter.
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            patches: self.patches.saturating_sub(before.patches),
            lists: self.lists.saturating_sub(before.lists),
            watches: self.watches.saturating_sub(before.watches),
            gets: self.gets.saturating_sub(before.gets),
            gone410: self.gone410.saturating_sub(before.gone410),
        }
    }
}

/// A running server loaded with N Nodes.
pub enum Server {
    /// The sandbox.
    Sandbox {
        /// Its process.
        process: Running,
        /// `http://127.0.0.1:PORT`.
        url: String,
        /// A client of it.
        api: kube::Client,
    },
    /// etcd + kube-apiserver.
    Real {
        /// Both processes and their data directory.
        cluster: Box<RealCluster>,
        /// The admin kubeconfig (what every runner uses here).
        kubeconfig: PathBuf,
        /// The admin client.
        api: kube::Client,
        /// How many Nodes have been seen with podCIDRs (a watch from before the run).
        served: Arc<AtomicUsize>,
        /// Whether that watch is open.
        watching: Arc<AtomicBool>,
    },
}

/// How the Nodes of a real server were created.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Setup {
    /// etcd + kube-apiserver start to `/readyz` ok, seconds.
    pub start_s: f64,
    /// Creating the N Nodes (POSTs in flight: [`CREATE_IN_FLIGHT`]), seconds.
    pub create_s: f64,
}

/// POSTs in flight while the real server's Nodes are created.
pub const CREATE_IN_FLIGHT: usize = 64;

#[derive(Debug, Clone, Deserialize)]
struct SlimSpec {
    #[serde(rename = "podCIDRs", default)]
    pod_cidrs: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct SlimMeta {
    #[serde(default)]
    name: String,
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
}

/// The parts of a Node the served-watch reads.
#[derive(Debug, Clone, Deserialize)]
struct SlimNode {
    metadata: SlimMeta,
    #[serde(default)]
    spec: Option<SlimSpec>,
}

impl Server {
    /// A sandbox with `nodes` copies of `fixture`'s `items[1]`.
    ///
    /// # Errors
    /// The sandbox would not start, or did not load the Nodes.
    pub async fn sandbox(
        binary: &Path,
        fixture: &Path,
        nodes: usize,
        latency_ms: u64,
        history_limit: usize,
        log: PathBuf,
    ) -> Result<Server, String> {
        let args: Vec<String> = [
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "--request-log-size",
            "1000",
            "--history-limit",
            &history_limit.to_string(),
            "--delay-ms",
            &latency_ms.to_string(),
            "--replicate",
            &format!("{}:1:{nodes}", fixture.display()),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let (process, line) = Running::spawn(binary, &args, &[], log, &[], Instant::now(), true)?;
        let url = line
            .as_deref()
            .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
            .ok_or_else(|| format!("sandbox printed no URL: {line:?}"))?
            .to_owned();
        let api = http::client(&url)?;
        let before = http::summary(&api).await?;
        if before.nodes != nodes || before.nodes_with_pod_cidrs != 0 {
            return Err(format!(
                "sandbox loaded {before:?}, wanted {nodes} Nodes without podCIDRs"
            ));
        }
        Ok(Server::Sandbox { process, url, api })
    }

    /// etcd + kube-apiserver (with the extra flags `apiserver_args`) with `nodes` copies of
    /// `fixture`'s `items[1]` (named `node-<i>`, as the sandbox names them), created through the
    /// API with [`CREATE_IN_FLIGHT`] POSTs in flight.
    ///
    /// # Errors
    /// The cluster would not start, or a create failed.
    pub async fn real(
        fixture: &Path,
        nodes: usize,
        apiserver_args: &[String],
    ) -> Result<(Server, Setup), String> {
        let started = Instant::now();
        let options = Options {
            apiserver_args: apiserver_args.to_vec(),
            ..Options::default()
        };
        let cluster = RealCluster::start_with(options)
            .await
            .map_err(|e| e.to_string())?;
        let start_s = started.elapsed().as_secs_f64();
        let api = cluster.admin_client().await.map_err(|e| e.to_string())?;
        let kubeconfig = cluster
            .kubeconfig("bench-admin", ADMIN_TOKEN)
            .map_err(|e| e.to_string())?;
        let replicas = Replicas::parse_arg(&format!("{}:1:{nodes}", fixture.display()), "node")
            .map_err(|e| e.to_string())?;
        let created = Instant::now();
        let results = futures::stream::iter((0..nodes).map(|i| {
            let api = api.clone();
            let body = serde_json::to_vec(&replicas.node(i));
            async move {
                let body = body.map_err(|e| e.to_string())?;
                let request = ::http::Request::post("/api/v1/nodes")
                    .header(::http::header::CONTENT_TYPE, "application/json")
                    .body(body)
                    .map_err(|e| e.to_string())?;
                api.request_text(request)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("creating node-{i}: {e}"))
            }
        }))
        .buffer_unordered(CREATE_IN_FLIGHT);
        results.try_collect::<()>().await?;
        let create_s = created.elapsed().as_secs_f64();
        let server = Server::Real {
            cluster: Box::new(cluster),
            kubeconfig,
            api,
            served: Arc::new(AtomicUsize::new(0)),
            watching: Arc::new(AtomicBool::new(false)),
        };
        Ok((server, Setup { start_s, create_s }))
    }

    /// A client of the server (admin on the real one).
    pub fn api(&self) -> &kube::Client {
        match self {
            Server::Sandbox { api, .. } | Server::Real { api, .. } => api,
        }
    }

    /// The flags that point a runner at this server: `--master=URL` (sandbox) or
    /// `--kubeconfig=FILE` (real).
    pub fn connect_flag(&self) -> String {
        match self {
            Server::Sandbox { url, .. } => format!("--master={url}"),
            Server::Real { kubeconfig, .. } => format!("--kubeconfig={}", kubeconfig.display()),
        }
    }

    /// Starts counting Nodes that get podCIDRs (real server: a watch from now; the sandbox counts
    /// them itself).
    ///
    /// # Errors
    /// The first LIST (for the resourceVersion) failed.
    pub async fn start_counting(&self) -> Result<(), String> {
        let Server::Real {
            api,
            served,
            watching,
            ..
        } = self
        else {
            return Ok(());
        };
        let rv = http::nodes_resource_version(api).await?;
        let (api, served, watching) = (api.clone(), served.clone(), watching.clone());
        watching.store(true, Ordering::SeqCst);
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            let mut rv = rv;
            // Re-opened from the last resourceVersion if the server ends the watch.
            while watching.load(Ordering::SeqCst) {
                let uri = format!(
                    "/api/v1/nodes?watch=true&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={rv}"
                );
                let Ok(request) = ::http::Request::get(uri).body(Vec::new()) else {
                    break;
                };
                eprintln!("  bench watch: opened at resourceVersion {rv}");
                let Ok(stream) = api.request_events::<SlimNode>(request).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let event = match event {
                        Ok(event) => event,
                        Err(e) => {
                            eprintln!("  bench watch: {e}");
                            break;
                        }
                    };
                    let node = match event {
                        WatchEvent::Added(n) | WatchEvent::Modified(n) => n,
                        WatchEvent::Bookmark(b) => {
                            rv = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Deleted(_) | WatchEvent::Error(_) => continue,
                    };
                    rv = node.metadata.resource_version;
                    if node.spec.is_some_and(|s| !s.pod_cidrs.is_empty())
                        && seen.insert(node.metadata.name)
                    {
                        served.store(seen.len(), Ordering::SeqCst);
                    }
                    if !watching.load(Ordering::SeqCst) {
                        break;
                    }
                }
            }
        });
        Ok(())
    }

    /// Stops the watch of [`Server::start_counting`] (at its next event or re-open).
    pub fn stop_counting(&self) {
        if let Server::Real { watching, .. } = self {
            watching.store(false, Ordering::SeqCst);
        }
    }

    /// How many Nodes have podCIDRs.
    ///
    /// # Errors
    /// The sandbox's summary could not be read.
    pub async fn served(&self) -> Result<usize, String> {
        match self {
            Server::Sandbox { api, .. } => Ok(http::summary(api).await?.nodes_with_pod_cidrs),
            Server::Real { served, .. } => Ok(served.load(Ordering::SeqCst)),
        }
    }

    /// The Node request counters now.
    ///
    /// # Errors
    /// The summary or `/metrics` could not be read.
    pub async fn counters(&self) -> Result<Counters, String> {
        match self {
            Server::Sandbox { api, .. } => {
                let s = http::summary(api).await?;
                Ok(Counters {
                    patches: s.patches,
                    lists: s.lists,
                    watches: s.watches,
                    gets: 0,
                    gone410: s.gone410,
                })
            }
            Server::Real { api, .. } => {
                let text = http::get_text(api, "/metrics").await?;
                Ok(node_counters(&text))
            }
        }
    }

    /// Peak RSS and CPU of the server processes: the sandbox, or (kube-apiserver, etcd).
    pub fn usage(&self, ticks: f64) -> (Usage, Option<Usage>) {
        match self {
            Server::Sandbox { process, .. } => (
                process::usage(process.pid(), ticks).unwrap_or_default(),
                None,
            ),
            Server::Real { cluster, .. } => (
                cluster
                    .apiserver_pid()
                    .and_then(|pid| process::usage(pid, ticks))
                    .unwrap_or_default(),
                process::usage(cluster.etcd_pid(), ticks),
            ),
        }
    }

    /// kube-apiserver's log so far (real server only).
    pub fn apiserver_log(&self) -> Option<String> {
        match self {
            Server::Sandbox { .. } => None,
            Server::Real { cluster, .. } => Some(cluster.apiserver_log()),
        }
    }

    /// Stops the server (the real one is killed on drop).
    pub fn stop(self, ticks: f64) {
        match self {
            Server::Sandbox { process, .. } => {
                let _ = process.terminate(Duration::from_secs(10), ticks);
            }
            Server::Real { watching, .. } => watching.store(false, Ordering::SeqCst),
        }
    }
}

/// Sums kube-apiserver's `apiserver_request_total` samples with `resource="nodes"` and no
/// subresource by `verb`; `gone410` is those with `code="410"`.
pub fn node_counters(metrics: &str) -> Counters {
    let mut c = Counters::default();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels.split(',').find_map(|kv| {
                kv.strip_prefix(key)
                    .and_then(|v| v.strip_prefix("=\""))
                    .and_then(|v| v.strip_suffix('"'))
            })
        };
        if label("resource") != Some("nodes") || label("subresource").is_some_and(|s| !s.is_empty())
        {
            continue;
        }
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        match label("verb") {
            Some("PATCH") => c.patches += n,
            Some("LIST") => c.lists += n,
            Some("WATCH") => c.watches += n,
            Some("GET") => c.gets += n,
            _ => {}
        }
        if label("code") == Some("410") {
            c.gone410 += n;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_node_requests_by_verb() {
        let text = "# HELP apiserver_request_total x\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1\"} 7\n\
apiserver_request_total{code=\"422\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1\"} 2\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 5\n\
apiserver_request_total{code=\"410\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 1\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 3\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1\"} 9\n";
        let c = node_counters(text);
        assert_eq!(
            (c.patches, c.lists, c.watches, c.gets, c.gone410),
            (9, 3, 1, 0, 1)
        );
    }
}

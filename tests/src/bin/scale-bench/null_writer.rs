//! The null writer (`scale-bench null-writer`): the API server's floor for any allocator. It knows
//! every answer in advance — a file of `name uid podCIDR[,podCIDR]` lines written by the bench
//! from `nodeipam-controller plan`'s output before the timed part — and only PATCHes them, with
//! the controller's client (kube-rs, the workspace's features: HTTP/1.1, one pooled connection
//! per request in flight), `fieldManager`, `timeout=10s`, and as many PATCHes in flight as the
//! controller has workers (`--workers`, the controller's default 30). No informer, no allocator,
//! no retries: an answer other than 2xx is counted and printed.
//!
//! `--patch-type` picks the body (issue 34 item 3, the server's CPU per PATCH by type):
//!
//! | `--patch-type` | `Content-Type` | body |
//! |---|---|---|
//! | `smp` (default) | `application/strategic-merge-patch+json` | the controller's own: `nodeipam::reconcile::pod_cidrs_patch`, `{"metadata":{"uid":…},"spec":{"podCIDR":…,"podCIDRs":[…]}}` (the uid is the fence: a replaced Node answers 422) |
//! | `merge` | `application/merge-patch+json` | the same document as a JSON merge patch |
//! | `json-test` | `application/json-patch+json` | `[{"op":"test","path":"/metadata/uid",…},{"op":"add","path":"/spec/podCIDR",…},{"op":"add","path":"/spec/podCIDRs",…}]` |
//!
//! `--answer metadata` asks for the answer as `PartialObjectMetadata`
//! (`Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`): what the server
//! encodes when the writer wants only `metadata` (resourceVersion, uid) back.
//!
//! The first answer's body is kept in `<answers>.first-answer.json` (a real PATCH answer of the
//! server, for the answer-parsing bench `shell/benches/patch_answer.rs`).
//!
//! It prints `null writer: patching N Nodes` once the file is read and the client is built (the
//! bench's "ready" mark), `null writer: done …` when every PATCH has been answered, then waits to be
//! stopped (SIGTERM) so the bench reads its CPU and peak RSS from `/proc` as for the other runners.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt as _;

/// The bench's ready mark for the null writer (printed once the answers are loaded).
pub const READY: &str = "null writer: patching";

/// The null writer's flags.
#[derive(Debug, Parser)]
#[command(name = "scale-bench null-writer")]
pub struct NullArgs {
    /// API server URL (plain HTTP sandbox); or use `--kubeconfig`.
    #[arg(long, conflicts_with = "kubeconfig")]
    master: Option<String>,
    /// Kubeconfig of the API server (the real kube-apiserver).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The answers: one `name uid podCIDR[,podCIDR]` line per Node.
    #[arg(long)]
    answers: PathBuf,
    /// PATCHes in flight.
    #[arg(long, default_value_t = 30)]
    workers: usize,
    /// `fieldManager` of the PATCHes.
    #[arg(long, default_value = "nodeipam-null-writer")]
    field_manager: String,
    /// The PATCH type and body (see the module documentation).
    #[arg(long, value_enum, default_value = "smp")]
    patch_type: PatchType,
    /// What the answer carries: the whole Node, or only its metadata.
    #[arg(long, value_enum, default_value = "full")]
    answer: Answer,
}

/// The PATCH type of the null writer (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PatchType {
    /// Strategic merge patch, the controller's body.
    Smp,
    /// JSON merge patch (RFC 7386), the same document.
    Merge,
    /// JSON patch (RFC 6902): `test` of `metadata.uid`, then `add` of `spec.podCIDR(s)`.
    JsonTest,
}

impl PatchType {
    /// The flag value (`smp`, `merge`, `json-test`).
    pub fn name(self) -> &'static str {
        match self {
            PatchType::Smp => "smp",
            PatchType::Merge => "merge",
            PatchType::JsonTest => "json-test",
        }
    }

    /// The request's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Smp => "application/strategic-merge-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::JsonTest => "application/json-patch+json",
        }
    }

    /// The body that gives Node object `uid` the podCIDRs `cidrs`.
    ///
    /// # Errors
    /// A podCIDR that does not parse (the `smp` and `merge` bodies go through the controller's
    /// own builder, which takes parsed CIDRs).
    pub fn body(self, uid: &str, cidrs: &[&str]) -> Result<serde_json::Value, String> {
        match self {
            PatchType::Smp | PatchType::Merge => {
                let parsed = cidrs
                    .iter()
                    .map(|c| c.parse::<nodeipam_core::Cidr>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("{cidrs:?}: {e}"))?;
                Ok(nodeipam::reconcile::pod_cidrs_patch(&parsed, Some(uid)))
            }
            PatchType::JsonTest => Ok(serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "add", "path": "/spec/podCIDR", "value": cidrs.first()},
                {"op": "add", "path": "/spec/podCIDRs", "value": cidrs},
            ])),
        }
    }
}

/// What the null writer asks the PATCH answers to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// The whole Node (`Accept: application/json`, what the controller asks for).
    Full,
    /// Only its metadata, as `PartialObjectMetadata`.
    Metadata,
}

impl Answer {
    /// The flag value (`full`, `metadata`).
    pub fn name(self) -> &'static str {
        match self {
            Answer::Full => "full",
            Answer::Metadata => "metadata",
        }
    }

    /// The request's `Accept`.
    pub fn accept(self) -> &'static str {
        match self {
            Answer::Full => "application/json",
            Answer::Metadata => "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        }
    }
}

struct Planned {
    name: String,
    body: Vec<u8>,
}

fn read_answers(path: &std::path::Path, patch_type: PatchType) -> Result<Vec<Planned>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            let mut words = line.split_whitespace();
            let (Some(name), Some(uid), Some(cidrs), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{}:{}: want `name uid podCIDR[,podCIDR]`, got {line:?}",
                    path.display(),
                    i + 1
                ));
            };
            let cidrs: Vec<&str> = cidrs.split(',').collect();
            let body = patch_type
                .body(uid, &cidrs)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            Ok(Planned {
                name: name.to_owned(),
                body: serde_json::to_vec(&body).map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

/// A client of `--master` (plain HTTP) or `--kubeconfig` (the real server), as the runners have.
///
/// # Errors
/// Neither given, a bad URL or kubeconfig.
pub async fn connect(
    master: Option<&str>,
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, String> {
    let config = match (master, kubeconfig) {
        (Some(url), _) => kube::Config::new(url.parse().map_err(|e| format!("{url}: {e}"))?),
        (None, Some(path)) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        (None, None) => return Err("give --master or --kubeconfig".to_owned()),
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Runs the null writer; returns the process exit status.
pub async fn main(args: NullArgs) -> std::process::ExitCode {
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("null writer: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: NullArgs) -> Result<(), String> {
    if args.workers == 0 {
        return Err("--workers must be at least 1".to_owned());
    }
    let answers = read_answers(&args.answers, args.patch_type)?;
    let client = connect(args.master.as_deref(), args.kubeconfig.as_deref()).await?;
    let query = format!(
        "?fieldManager={}&timeout=10s",
        form_urlencoded::byte_serialize(args.field_manager.as_bytes()).collect::<String>()
    );
    eprintln!(
        "{READY} {} Nodes, {} in flight, {} PATCHes, {} answers",
        answers.len(),
        args.workers,
        args.patch_type.name(),
        args.answer.name()
    );
    let (content_type, accept) = (args.patch_type.content_type(), args.answer.accept());
    let start = Instant::now();
    let mut failed = 0_usize;
    let mut kept = false;
    let keep = args.answers.with_extension("first-answer.json");
    let mut results = futures::stream::iter(answers.into_iter().map(|answer| {
        let client = client.clone();
        let uri = format!("/api/v1/nodes/{}{query}", answer.name);
        async move {
            let request = http::Request::patch(uri)
                .header(http::header::CONTENT_TYPE, content_type)
                .header(http::header::ACCEPT, accept)
                .body(answer.body)
                .map_err(|e| e.to_string())?;
            client
                .request_text(request)
                .await
                .map_err(|e| format!("PATCH {}: {e}", answer.name))
        }
    }))
    .buffer_unordered(args.workers);
    while let Some(result) = results.next().await {
        match result {
            Ok(text) if !kept => {
                kept = true;
                if let Err(e) = std::fs::write(&keep, text) {
                    eprintln!("null writer: {}: {e}", keep.display());
                }
            }
            Ok(_) => {}
            Err(e) => {
                failed += 1;
                if failed <= 10 {
                    eprintln!("null writer: {e}");
                }
            }
        }
    }
    eprintln!(
        "null writer: done in {:.3} s, {failed} PATCHes failed",
        start.elapsed().as_secs_f64()
    );
    // Stay (idle) until the bench stops us, so it reads our figures as for the other runners.
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `smp` is the controller's body byte for byte; `merge` the same document; `json-test`
    /// tests the uid before it adds.
    #[test]
    fn bodies_by_patch_type() {
        let uid = "6b3f0b1e-0000-4000-8000-000000000001";
        let cidrs = ["10.0.3.0/24", "fd00:0:0:3::/64"];
        let parsed: Vec<nodeipam_core::Cidr> = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        let controller =
            serde_json::to_vec(&nodeipam::reconcile::pod_cidrs_patch(&parsed, Some(uid))).unwrap();
        let smp = serde_json::to_vec(&PatchType::Smp.body(uid, &cidrs).unwrap()).unwrap();
        assert_eq!(smp, controller);
        assert_eq!(
            String::from_utf8(smp).unwrap(),
            format!(
                r#"{{"metadata":{{"uid":"{uid}"}},"spec":{{"podCIDR":"10.0.3.0/24","podCIDRs":["10.0.3.0/24","fd00:0:0:3::/64"]}}}}"#
            )
        );
        assert_eq!(
            PatchType::Merge.body(uid, &cidrs).unwrap(),
            PatchType::Smp.body(uid, &cidrs).unwrap()
        );
        assert_eq!(
            PatchType::JsonTest.body(uid, &cidrs).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "add", "path": "/spec/podCIDR", "value": "10.0.3.0/24"},
                {"op": "add", "path": "/spec/podCIDRs", "value": cidrs},
            ])
        );
        assert!(PatchType::Smp.body(uid, &["10.0.3.0/33"]).is_err());
    }
}

//! The null writer (`scale-bench null-writer`): the API server's floor for any allocator. It knows
//! every answer in advance — a file of `name uid podCIDR[,podCIDR]` lines written by the bench
//! from `nodeipam-controller plan`'s output before the timed part — and only PATCHes them: the
//! same strategic-merge body the controller sends (`{"metadata":{"uid":…},"spec":{"podCIDR":…,
//! "podCIDRs":[…]}}`, `fieldManager`, `timeout=10s`), with the same client (kube-rs, the
//! workspace's features: HTTP/1.1, one pooled connection per request in flight) and as many
//! PATCHes in flight as the controller has workers (`--workers`, the controller's default 30).
//! No informer, no allocator, no retries: an answer other than 2xx is counted and printed.
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
}

struct Answer {
    name: String,
    body: Vec<u8>,
}

fn read_answers(path: &std::path::Path) -> Result<Vec<Answer>, String> {
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
            let body = serde_json::json!({
                "metadata": {"uid": uid},
                "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
            });
            Ok(Answer {
                name: name.to_owned(),
                body: serde_json::to_vec(&body).map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

async fn client(args: &NullArgs) -> Result<kube::Client, String> {
    let config = match (&args.master, &args.kubeconfig) {
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
    let answers = read_answers(&args.answers)?;
    let client = client(&args).await?;
    let query = format!(
        "?fieldManager={}&timeout=10s",
        form_urlencoded::byte_serialize(args.field_manager.as_bytes()).collect::<String>()
    );
    eprintln!(
        "{READY} {} Nodes, {} in flight",
        answers.len(),
        args.workers
    );
    let start = Instant::now();
    let mut failed = 0_usize;
    let mut results = futures::stream::iter(answers.into_iter().map(|answer| {
        let client = client.clone();
        let uri = format!("/api/v1/nodes/{}{query}", answer.name);
        async move {
            let request = http::Request::patch(uri)
                .header(
                    http::header::CONTENT_TYPE,
                    "application/strategic-merge-patch+json",
                )
                .header(http::header::ACCEPT, "application/json")
                .body(answer.body)
                .map_err(|e| e.to_string())?;
            client
                .request_text(request)
                .await
                .map(|_| ())
                .map_err(|e| format!("PATCH {}: {e}", answer.name))
        }
    }))
    .buffer_unordered(args.workers);
    while let Some(result) = results.next().await {
        if let Err(e) = result {
            failed += 1;
            if failed <= 10 {
                eprintln!("null writer: {e}");
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

//! The watcher (`scale-bench watcher`): one informer's worth of Node reads — a full LIST served
//! from the watch cache (`resourceVersion=0`, as client-go's reflector lists), then a WATCH from
//! the resourceVersion of a one-item LIST taken first — in one encoding, held until the bench
//! stops it (SIGTERM). It only drains the bytes (nothing is decoded but the one-item LIST), so
//! what it adds to a row is the server's cost of encoding and sending the Nodes' list and
//! changes: `--encoding json` as our informer asks for them (`Accept: application/json`),
//! `--encoding protobuf` as kube-controller-manager's informer does
//! (`Accept: application/vnd.kubernetes.protobuf`). Issue 34 item 3: the server's CPU for our
//! watch (JSON) against kcm's (protobuf) is the difference between null-writer rows with and
//! without it.
//!
//! It prints [`LISTED`] with the list's size once the list is read (the bench's ready mark), and
//! [`ENDED`] if the server ends the watch before the bench stops the watcher (kube-apiserver's
//! watch cache closes a watcher that reads too slowly; a starved watcher on a loaded machine
//! does): it does not open it again — a watch from the first resourceVersion would replay every
//! change and inflate the row — and the bench fails the row instead.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use futures::AsyncReadExt as _;

/// The bench's mark: the watcher has read the full list and opens its watch.
pub const LISTED: &str = "watcher: listed";
/// The watcher's mark when its watch ended before it was stopped.
pub const ENDED: &str = "watcher: watch ended";

/// The encoding the watcher asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `Accept: application/json` (our informer, kube-rs).
    Json,
    /// `Accept: application/vnd.kubernetes.protobuf` (kube-controller-manager's informer, client-go
    /// with `--kube-api-content-type`'s default).
    Protobuf,
}

impl Encoding {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::Protobuf => "protobuf",
        }
    }

    fn accept(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Protobuf => "application/vnd.kubernetes.protobuf",
        }
    }
}

/// The watcher's flags.
#[derive(Debug, Parser)]
#[command(name = "scale-bench watcher")]
pub struct WatcherArgs {
    /// API server URL (plain HTTP sandbox); or use `--kubeconfig`.
    #[arg(long, conflicts_with = "kubeconfig")]
    master: Option<String>,
    /// Kubeconfig of the API server (the real kube-apiserver).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The encoding of the list and the watch.
    #[arg(long, value_enum)]
    encoding: Encoding,
}

/// Runs the watcher until it is killed; after an error or the watch's end it waits to be
/// stopped too (the bench reads its marks).
pub async fn main(args: WatcherArgs) -> std::process::ExitCode {
    if let Err(e) = run(args).await {
        eprintln!("watcher: error: {e}");
    }
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// GETs `uri` with `accept` and reads the body to its end: (bytes, reads).
async fn drain(client: &kube::Client, uri: &str, accept: &str) -> Result<(u64, u64), String> {
    let request = http::Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let mut body = client
        .request_stream(request)
        .await
        .map_err(|e| format!("GET {uri}: {e}"))?;
    let mut buffer = vec![0_u8; 64 * 1024];
    let (mut bytes, mut reads) = (0_u64, 0_u64);
    loop {
        let n = body
            .read(&mut buffer)
            .await
            .map_err(|e| format!("GET {uri}: {e}"))?;
        if n == 0 {
            return Ok((bytes, reads));
        }
        bytes += n as u64;
        reads += 1;
    }
}

async fn run(args: WatcherArgs) -> Result<(), String> {
    let client =
        crate::null_writer::connect(args.master.as_deref(), args.kubeconfig.as_deref()).await?;
    let rv = crate::http::nodes_resource_version(&client).await?;
    let accept = args.encoding.accept();
    let (bytes, _) = drain(&client, "/api/v1/nodes?resourceVersion=0", accept).await?;
    eprintln!(
        "{LISTED} {bytes} bytes ({}); watching",
        args.encoding.name()
    );
    // The watch from the one-item LIST's resourceVersion: nothing has changed since (the bench
    // starts the writer after this mark), so it carries exactly the writer's changes. No
    // bookmarks: the watcher never resumes.
    let uri = format!("/api/v1/nodes?watch=true&timeoutSeconds=3600&resourceVersion={rv}");
    eprintln!("watcher: watch opened");
    match drain(&client, &uri, accept).await {
        Ok((bytes, reads)) => eprintln!("{ENDED}, {bytes} bytes in {reads} reads"),
        Err(e) => eprintln!("{ENDED}: {e}"),
    }
    Ok(())
}

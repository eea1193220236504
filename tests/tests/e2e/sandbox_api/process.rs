//! The `sandbox-apiserver` process: replication and admin faults, and the scale driver.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

/// The `sandbox-apiserver` process: 1,000 copies of a real AWS Node from `--replicate`, the
/// summary, a late write injected through the admin API, every flag in `--help`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_process_replicates_nodes_and_takes_admin_faults() {
    let bin = env!("CARGO_BIN_EXE_sandbox-apiserver");
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for flag in [
        "--listen",
        "--nodes",
        "--replicate",
        "--history-limit",
        "--request-log-size",
        "--request-body-limit",
        "--bookmark-interval-ms",
        "--delay-ms",
        "--no-watch-list",
        "--admin",
    ] {
        assert!(help.contains(flag), "{flag} in --help:\n{help}");
    }
    let fixture = format!(
        "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
        env!("CARGO_MANIFEST_DIR")
    );
    /// Kills the process when the test ends, passing or not.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(
        std::process::Command::new(bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "--history-limit",
                "50",
            ])
            .args(["--request-log-size", "10", "--no-watch-list"])
            .args([
                "--replicate",
                &format!("{fixture}:1:1000"),
                "--replicate",
                &format!("{fixture}:0:2:extra"),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        }),
    )
    .await
    .expect("started in time")
    .expect("task")
    .expect("a line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_owned();
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("uri"))).expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let summary = |client: kube::Client| async move {
        let req = axum::http::Request::get("/sandbox/summary")
            .body(Vec::new())
            .expect("request");
        client.request::<Value>(req).await.expect("summary")
    };
    let s = summary(client.clone()).await;
    assert_eq!(s["nodes"], 1002);
    assert_eq!(s["nodesWithPodCIDRs"], 0);
    let page = nodes
        .list(&ListParams::default().limit(500))
        .await
        .expect("list");
    assert_eq!(page.items.len(), 500);
    assert_eq!(page.metadata.remaining_item_count, Some(502));
    let copy = nodes.get("node-999").await.expect("copy");
    let other = nodes.get("node-0").await.expect("copy");
    assert_ne!(copy.metadata.uid, other.metadata.uid);
    assert!(
        copy.spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_ref())
            .is_none()
    );
    nodes.get("extra-1").await.expect("second --replicate");
    // A late write through the admin API.
    let rule = json!({"verb": "patch", "resource": "nodes", "name": "node-7",
        "lateWrite": {"commitAfterMs": 200, "answer": "drop"}});
    let req = axum::http::Request::post("/sandbox/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&rule).expect("json"))
        .expect("request");
    client.request::<Value>(req).await.expect("fault injected");
    let mut cfg = kube::Config::new(url.parse().expect("uri"));
    cfg.default_retry = false;
    let no_retry: Api<Node> = Api::all(kube::Client::try_from(cfg).expect("client"));
    let patch = json!({"spec": {"podCIDRs": ["10.5.0.0/24"]}});
    let r = no_retry
        .patch("node-7", &PatchParams::default(), &Patch::Strategic(&patch))
        .await;
    assert!(
        matches!(&r, Err(e) if !matches!(e, kube::Error::Api(_))),
        "{r:?}"
    );
    let mut served = false;
    for _ in 0..100 {
        let s = summary(client.clone()).await;
        if s["nodesWithPodCIDRs"] == 1 {
            assert_eq!(s["patches"], 1);
            assert_eq!(s["lists"], 1);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the late write was committed");
    // --no-watch-list: a streaming list is refused.
    let refused = nodes
        .watch(&WatchParams::streaming_lists().timeout(5), "")
        .await;
    assert!(
        matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 422),
        "{:?}",
        refused.err()
    );
    // --request-log-size 10: the log is a ring.
    let req = axum::http::Request::get("/sandbox/requests")
        .body(Vec::new())
        .expect("request");
    let log: Vec<Value> = client.request(req).await.expect("log");
    assert!(log.len() <= 10, "{}", log.len());
    drop(child);
}

/// `(VmHWM kB, VmRSS kB, CPU seconds user+system)` of a process, from `/proc/PID/status` and
/// `/proc/PID/stat` (clock ticks at the usual 100 Hz).
fn process_usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
    (kb("VmHWM:"), kb("VmRSS:"), cpu)
}

/// The scale driver (not a test: `#[ignore]`d, no timing assertions). Starts `sandbox-apiserver`
/// as its own process with N copies of the second AWS Node of fixture 05 (`--replicate`), then
/// does what a controller does: a paged LIST (limit 500), a WATCH from the list's
/// resourceVersion, and a PATCH of every Node's podCIDRs with 30 requests in flight; it waits
/// until the watch has seen every change and `GET /sandbox/summary` says every Node is served,
/// and prints the sandbox process's peak memory (VmHWM) and CPU time at each phase.
///
/// ```text
/// cargo build -p nodeipam-tests --release --bin sandbox-apiserver
/// SANDBOX_SCALE_BIN=target/release/sandbox-apiserver SANDBOX_SCALE_NODES=50000 \
///   cargo test -p nodeipam-tests --test e2e -- --ignored sandbox_api::process::scale_driver --nocapture
/// ```
/// `SANDBOX_SCALE_BIN` defaults to the test build's binary, `SANDBOX_SCALE_NODES` to 50000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale benchmark, run by hand (see its doc)"]
async fn scale_driver() {
    use futures::stream;
    let count: usize = std::env::var("SANDBOX_SCALE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let bin = std::env::var("SANDBOX_SCALE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sandbox-apiserver").to_owned());
    let fixture = format!(
        "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
        env!("CARGO_MANIFEST_DIR")
    );
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let started = std::time::Instant::now();
    let mut child = Kill(
        std::process::Command::new(&bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "--request-log-size",
                "1000",
            ])
            .args(["--replicate", &format!("{fixture}:1:{count}")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let pid = child.0.id();
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .expect("task")
    .expect("a line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_owned();
    let report = |phase: &str| {
        let (hwm, rss, cpu) = process_usage(pid);
        println!(
            "{phase:<28} VmHWM {:>7.1} MiB  VmRSS {:>7.1} MiB  sandbox CPU {cpu:>6.1} s  (wall {:>6.1} s)",
            hwm as f64 / 1024.0,
            rss as f64 / 1024.0,
            started.elapsed().as_secs_f64()
        );
    };
    report(&format!("loaded {count} Nodes"));
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("uri"))).expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    // Paged LIST, as a reflector does.
    let mut names = Vec::with_capacity(count);
    let mut token: Option<String> = None;
    let list_rv = loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = nodes.list(&lp).await.expect("page");
        names.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break page.metadata.resource_version.expect("rv");
        }
    };
    assert_eq!(names.len(), count);
    report("paged LIST (500/page)");
    // WATCH from the list's resourceVersion, counting MODIFIED events.
    let mut watch = nodes
        .watch(&WatchParams::default().timeout(290), &list_rv)
        .await
        .expect("watch")
        .boxed();
    let watcher = tokio::spawn(async move {
        let mut modified = 0usize;
        while modified < count {
            match watch.try_next().await {
                Ok(Some(WatchEvent::Modified(_))) => modified += 1,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        modified
    });
    // PATCH every Node, 30 in flight.
    let results: Vec<bool> = stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let nodes = nodes.clone();
            async move {
                let cidr = format!("10.{}.{}.0/24", i / 256, i % 256);
                let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(30)
        .collect()
        .await;
    assert!(results.iter().all(|ok| *ok), "every PATCH succeeded");
    report("PATCHed all (30 in flight)");
    let modified = tokio::time::timeout(Duration::from_secs(600), watcher)
        .await
        .expect("watch events in time")
        .expect("watch task");
    assert_eq!(modified, count, "the watch saw every change");
    report("WATCH saw every MODIFIED");
    let req = axum::http::Request::get("/sandbox/summary")
        .body(Vec::new())
        .expect("request");
    let summary: Value = client.request(req).await.expect("summary");
    println!("summary: {summary}");
    assert_eq!(summary["nodesWithPodCIDRs"], count);
    drop(child);
}

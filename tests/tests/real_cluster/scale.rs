//! Issue 33 (3): real kubelet code at scale. The controller (Helm chart, one replica on the
//! cluster's Node) serves N kubemark hollow Nodes (default 100, `NODEIPAM_HOLLOW_NODES`): upstream's
//! kubelet code registering each Node with its own credentials, updating its status and renewing
//! its Lease; then its CPU and RSS are read from /proc over S seconds of those heartbeats
//! (default 600, `NODEIPAM_HEARTBEAT_SECONDS`), with every Node still served and no new event
//! at the end; then a hollow Node is deleted and registers again, and gets a podCIDR again.
//! Ignored (long): BENCHMARKS.md, "A real cluster", has its figures and command.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

use crate::harness::{Cluster, all_served, lease_holder_pod, pod_cidrs, run, wait_for};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}"))
    })
}

/// The controller's process on this host (the container's, seen from the host's /proc).
fn controller_pid() -> u32 {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).next() == Some(b"/usr/local/bin/nodeipam-controller") {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "controller processes: {found:?}");
    found[0]
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces, inside parentheses).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the name and state.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / ticks_per_second
}

/// VmRSS and VmHWM of `pid`, in kB.
fn rss_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn our_events(cluster: &Cluster) -> usize {
    cluster
        .kubectl(
            &[
                "get",
                "events",
                "--all-namespaces",
                "--field-selector",
                "reportingComponent=nodeipam-controller",
                "-o",
                "name",
            ],
            None,
        )
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: 100 hollow Nodes and 10 minutes of heartbeats (BENCHMARKS.md, \"A real cluster\")"]
async fn hollow_nodes_served_and_what_their_heartbeats_cost() {
    let hollow = env_or("NODEIPAM_HOLLOW_NODES", 100);
    let heartbeat = Duration::from_secs(env_or("NODEIPAM_HEARTBEAT_SECONDS", 600));
    let ticks_per_second: f64 = {
        let mut getconf = std::process::Command::new("getconf");
        getconf.arg("CLK_TCK");
        run(getconf, None).trim().parse().unwrap()
    };
    let cluster = Cluster::up("scale");
    let client = cluster.client().await;
    cluster.helm_install(&["--set=replicas=1"]);
    lease_holder_pod(&client).await;
    let pid = controller_pid();

    // The hollow Nodes, ten at a time (each start is a Go binary's initialisation).
    let names: Vec<String> = (0..hollow).map(|i| format!("hollow-{i}")).collect();
    let started = Instant::now();
    for batch in names.chunks(10) {
        let mut args = vec!["hollow", "add"];
        args.extend(batch.iter().map(String::as_str));
        cluster.cluster_sh(&args);
    }
    let all = usize::try_from(hollow).unwrap() + 1;
    let served = all_served(&client, &format!("{all} Nodes served"), all).await;
    eprintln!(
        "{all} Nodes registered and served {:?} after the first hollow Node started",
        started.elapsed()
    );

    // The heartbeats: CPU and RSS of the controller, sampled every 10 s.
    let events_before = our_events(&cluster);
    let cpu_before = cpu_seconds(pid, ticks_per_second);
    let window = Instant::now();
    let mut peak_rss = 0;
    while window.elapsed() < heartbeat {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (rss, _) = rss_kb(pid);
        peak_rss = peak_rss.max(rss);
    }
    let seconds = window.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid, ticks_per_second) - cpu_before;
    let (rss, hwm) = rss_kb(pid);
    let node_hours = all as f64 * seconds / 3600.0;
    eprintln!(
        "heartbeats of {all} Nodes for {seconds:.0} s: controller CPU {cpu:.2} s \
         ({:.3} CPU-s per Node-hour, {:.3} % of a core), RSS {rss} kB at the end, \
         {peak_rss} kB sampled peak, VmHWM {hwm} kB",
        cpu / node_hours,
        100.0 * cpu / seconds
    );
    assert_eq!(controller_pid(), pid, "the controller restarted");
    let after = pod_cidrs(&client).await;
    assert_eq!(after, served, "podCIDRs changed during the heartbeats");
    let events_after = our_events(&cluster);
    assert_eq!(
        events_after, events_before,
        "the controller wrote events during heartbeats alone"
    );

    // A hollow Node deleted and registered again gets a podCIDR again.
    let name = "hollow-7";
    cluster.cluster_sh(&["hollow", "delete", name]);
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.delete(name, &DeleteParams::default()).await.unwrap();
    wait_for(&format!("{name} gone"), || async {
        nodes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    cluster.cluster_sh(&["hollow", "add", name]);
    let again = all_served(&client, &format!("{name} served again"), all).await;
    eprintln!(
        "{name}: {:?} before its deletion, {:?} after it registered again; events {events_before} → {}",
        served[name],
        again[name],
        our_events(&cluster)
    );
    cluster.down();
}

//! Issue 31, item 4, through the built binary: idle connections to a plain port cannot starve the
//! controller of file descriptors, and the soft `RLIMIT_NOFILE` is raised to the hard limit at
//! start (and logged).
//!
//! The API server is the tests' sandbox (`sandbox-apiserver`, built beside this binary by `cargo
//! test --workspace`) with a real fixture of Nodes. It starts only once the idle connections are
//! open, so that the controller's first successful list, its watch and its PATCHes all need
//! connections opened under that pressure.
#![allow(clippy::unwrap_used)]

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use rlimit::Resource;

const BIN: &str = env!("CARGO_BIN_EXE_nodeipam-controller");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/nodes/05-aws-4nodes-no-podcidr.json"
);

/// Idle connections opened to the health port: more than a soft limit of 1024 descriptors.
const IDLE: usize = 1_100;

/// `nodeipam::serving::server::MAX_CONNECTIONS`, the cap of every port.
const MAX_CONNECTIONS: usize = nodeipam::serving::server::MAX_CONNECTIONS;

/// The sandbox API server binary, beside the controller's.
fn sandbox_binary() -> PathBuf {
    let path = std::path::Path::new(BIN).with_file_name("sandbox-apiserver");
    assert!(
        path.exists(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build -p nodeipam-tests --bin sandbox-apiserver`)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Kills the process when the test ends, passing or not.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The controller with `args`, its open-file limit set to `soft`/`hard` before it runs, stderr
/// into `log`.
fn controller(args: &[String], soft: u64, hard: u64, log: &std::fs::File) -> Kill {
    use std::os::unix::process::CommandExt as _;
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(log.try_clone().unwrap());
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls may be made. It makes one setrlimit(2) system call through the `rlimit` crate's thin
    // wrapper (no allocation, no lock; an error is `io::Error::last_os_error`, which reads errno
    // and allocates nothing) and touches nothing shared with the parent but the copied integers.
    unsafe {
        command.pre_exec(move || rlimit::setrlimit(Resource::NOFILE, soft, hard));
    }
    Kill(command.spawn().expect("the controller runs"))
}

/// Waits until `address` accepts a connection (the controller's server is up).
async fn wait_for_listener(address: SocketAddr, child: &mut Kill) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return;
        }
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the controller exited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{address} never accepted a connection");
}

/// `IDLE` connection attempts to `address`, 32 at a time (so that the kernel's listen backlog is
/// not overrun faster than a server that accepts everything can take them); the connections the
/// kernel completed within 300 ms each (on loopback a handshake completes at once, or its SYN
/// was dropped because the backlog is full).
async fn idle_connections(address: SocketAddr) -> Vec<tokio::net::TcpStream> {
    let mut open = Vec::new();
    for _ in 0..IDLE / 32 + 1 {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..32 {
            opening.spawn(tokio::time::timeout(
                Duration::from_millis(300),
                tokio::net::TcpStream::connect(address),
            ));
        }
        while let Some(done) = opening.join_next().await {
            if let Ok(Ok(Ok(stream))) = done {
                open.push(stream);
            }
        }
    }
    open.truncate(IDLE);
    open
}

/// The number of file descriptors the process `pid` has open, once it has stopped changing
/// (the server has accepted what it will accept).
async fn settled_descriptors(pid: u32) -> usize {
    let count = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    let mut last = count();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = count();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// The sandbox on `port` with the fixture's Nodes; returns once it listens.
async fn sandbox(port: u16) -> Kill {
    let mut child = Kill(
        Command::new(sandbox_binary())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--nodes", FIXTURE])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the sandbox runs"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(line.contains("listening on"), "{line}");
    child
}

/// Issue 31, item 4: a controller whose open-file limit is 1024 (soft and hard, so raising it
/// does not help), with 1,100 idle connections to its `--health-probe-bind-address` opened while
/// it starts, still lists, watches and serves every Node of the fixture. Before, the plain port
/// accepted every connection, the process ran out of descriptors ("listing Nodes failed … Too
/// many open files") and no Node was served while the connections stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_health_port_do_not_starve_the_controller() {
    // This process holds the idle connections: its own limit must allow them.
    nodeipam::open_files::raise_to_hard_limit().unwrap();
    let (api_port, health_port) = (free_port(), free_port());
    let log = tempfile::NamedTempFile::new().unwrap();
    let args = [
        format!("--master=http://127.0.0.1:{api_port}"),
        "--cluster-cidr=10.244.0.0/16".to_owned(),
        "--leader-elect=false".to_owned(),
        "--secure-port=0".to_owned(),
        "--metrics-bind-address=0".to_owned(),
        format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
    ];
    let mut controller = controller(&args, 1024, 1024, log.as_file());
    let health: SocketAddr = ([127, 0, 0, 1], health_port).into();
    wait_for_listener(health, &mut controller).await;
    // Nothing listens on the API server's port yet: every list fails and is retried.
    let idle = idle_connections(health).await;
    // More than the port serves at once: the cap was reached. (Before, all 1,100 opened and were
    // accepted; now the ones past the cap and the listen backlog are not completed.)
    assert!(
        idle.len() > MAX_CONNECTIONS,
        "only {} of {IDLE} connections opened",
        idle.len()
    );
    let held = settled_descriptors(controller.0.id()).await;
    eprintln!(
        "{} of {IDLE} idle connections open; the controller holds {held} descriptors",
        idle.len()
    );
    let _sandbox = sandbox(api_port).await;
    let client =
        nodeipam::controller::client_for_url(&format!("http://127.0.0.1:{api_port}")).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let mut served = Vec::new();
    for _ in 0..600 {
        let list = nodes.list(&ListParams::default()).await.unwrap();
        served = list
            .items
            .iter()
            .map(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.pod_cidrs.clone())
                    .unwrap_or_default()
            })
            .collect();
        if served.iter().all(|cidrs| !cidrs.is_empty()) {
            break;
        }
        assert!(
            controller.0.try_wait().unwrap().is_none(),
            "the controller exited: {}",
            std::fs::read_to_string(log.path()).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(served.len(), 4, "the fixture's four Nodes");
    assert!(
        served.iter().all(|cidrs| !cidrs.is_empty()),
        "not every Node was served while {} idle connections were open: {served:?}\n{text}",
        idle.len()
    );
    let mut distinct = served.concat();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{served:?}");
    assert!(!text.contains("Too many open files"), "{text}");
    assert!(
        text.contains("open-file limit (RLIMIT_NOFILE)")
            && text.contains("soft=1024")
            && text.contains("hard=1024"),
        "the limit is logged: {text}"
    );
    drop(idle);
}

/// The soft limit the process of `pid` runs with, from `/proc/PID/limits` ("Max open files").
fn soft_open_files(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Started with a soft open-file limit of 256 under a hard one of 4096, the controller runs with
/// 4096 and logs it (as a Go program raises its own). Before, it kept 256.
#[tokio::test]
async fn a_low_soft_open_file_limit_is_raised_to_the_hard_limit() {
    let (_, hard) = rlimit::getrlimit(Resource::NOFILE).unwrap();
    let hard = hard.min(4096);
    let health_port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let args = [
        "--allocate-node-cidrs=false".to_owned(),
        "--master=http://127.0.0.1:1".to_owned(),
        "--secure-port=0".to_owned(),
        "--metrics-bind-address=0".to_owned(),
        format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
    ];
    let mut controller = controller(&args, 256, hard, log.as_file());
    // Serving means start-up is past the raise.
    wait_for_listener(([127, 0, 0, 1], health_port).into(), &mut controller).await;
    assert_eq!(soft_open_files(controller.0.id()), hard);
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        text.contains("open-file limit (RLIMIT_NOFILE)")
            && text.contains(&format!("soft={hard}"))
            && text.contains("before=256"),
        "{text}"
    );
}

//! Hostile input for `nodeipam-controller` and `plan`, through the built binary: garbage flags
//! must exit 2 with one line naming the flag; hostile Node objects (real fixtures, mutated) must
//! never make the plan hand out a block twice or over a kept/skipped Node's range.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod plan_json;

const BIN: &str = env!("CARGO_BIN_EXE_nodeipam-controller");

/// Runs the binary with no cluster reachable (no kubeconfig, no in-cluster env).
fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let mut pipe = child.stdin.take().expect("stdin");
    let text = stdin.unwrap_or("").to_owned();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(text.as_bytes());
    });
    let out = child.wait_with_output().expect("binary exits");
    let _ = writer.join();
    out
}

/// The AWS fixture's Nodes with their spec's pod CIDR fields replaced by `specs[i]` (the Node
/// objects are real; only podCIDR/podCIDRs/name change).
fn nodes(specs: &[Value], names: &[&str]) -> Value {
    let path = format!(
        "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let list: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
        .expect("fixture JSON");
    let base = list["items"].as_array().expect("items").clone();
    let items: Vec<Value> = specs
        .iter()
        .enumerate()
        .map(|(i, extra)| {
            let mut node = base[i % base.len()].clone();
            node["metadata"]["name"] = json!(names.get(i).copied().unwrap_or(&format!("node-{i}")));
            let spec = node["spec"].as_object_mut().expect("spec");
            spec.remove("podCIDR");
            spec.remove("podCIDRs");
            for (k, v) in extra.as_object().expect("spec patch") {
                spec.insert(k.clone(), v.clone());
            }
            node
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
}

/// `plan -o json -` over `list`: (exit code, JSON or Null, stderr).
fn plan(list: &Value, flags: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["plan", "-o", "json"];
    args.extend_from_slice(flags);
    args.push("-");
    let out = run(&args, Some(&list.to_string()));
    let code = out.status.code().expect("exit code");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        code,
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn actions(json: &Value) -> Vec<(String, String)> {
    plan_json::rows(json, "nodes")
        .iter()
        .map(|n| (plan_json::text(n, "name"), plan_json::text(n, "action")))
        .collect()
}

/// (first, last) address of a CIDR text, IPv4 only (enough for these tests), read as Go reads
/// it: an IPv4-mapped IPv6 network (`::ffff:10.244.0.0/120`) is the IPv4 range of its low 32
/// bits, 96 bits shorter.
fn span(text: &str) -> Option<(u32, u32)> {
    let (addr, len) = text.trim().split_once('/')?;
    let len: u32 = len.parse().ok()?;
    let (addr, len) = match addr.parse::<std::net::Ipv4Addr>() {
        Ok(v4) => (v4, len),
        Err(_) => {
            let v6: std::net::Ipv6Addr = addr.parse().ok()?;
            (v6.to_ipv4_mapped()?, len.checked_sub(96)?)
        }
    };
    let host = 32u32.checked_sub(len)?;
    let lo = u32::from(addr) & !((1u64 << host) - 1) as u32;
    Some((lo, lo | ((1u64 << host) - 1) as u32))
}

/// The plan never assigns one block twice, nor over a kept/skipped Node's range or a service CIDR.
fn assert_no_double_assignment(json: &Value, services: &[&str]) {
    let mut reserved: Vec<(String, (u32, u32))> = services
        .iter()
        .filter_map(|s| Some(((*s).to_owned(), span(s)?)))
        .collect();
    let mut assigned = Vec::new();
    for node in json["nodes"].as_array().expect("nodes") {
        let name = node["name"].as_str().unwrap_or_default().to_owned();
        for text in node["podCIDRs"].as_array().expect("podCIDRs") {
            let Some(range) = text.as_str().and_then(span) else {
                continue;
            };
            match node["action"].as_str() {
                Some("assign") => assigned.push((name.clone(), range)),
                _ => reserved.push((name.clone(), range)),
            }
        }
        if matches!(node["action"].as_str(), Some("skip" | "fail")) {
            assert!(
                node["reason"].is_string(),
                "{name}: skip/fail without reason"
            );
        }
    }
    let overlap = |a: (u32, u32), b: (u32, u32)| a.0 <= b.1 && b.0 <= a.1;
    for (i, (name, range)) in assigned.iter().enumerate() {
        for (other, theirs) in assigned[i + 1..].iter().chain(&reserved) {
            assert!(
                !overlap(*range, *theirs),
                "{name} is assigned {range:?}, which overlaps {other}'s {theirs:?}: {json}"
            );
        }
    }
}

// ----- flags -------------------------------------------------------------------------------------

/// Every bad flag exits 2 with exactly one line on stderr naming the flag — including clap's own
/// parse errors, and configuration errors only found when the pool is built.
#[test]
fn bad_flags_exit_2_with_one_line_naming_the_flag() {
    let cluster = "--cluster-cidr=10.244.0.0/16";
    let off = [
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--secure-port=0",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--node-cidr-mask-size=-1"], "--node-cidr-mask-size"),
        (vec!["--node-cidr-mask-size=256"], "--node-cidr-mask-size"),
        (vec!["--kube-api-qps=NaN"], "--kube-api-qps"),
        (vec!["--kube-api-qps=inf"], "--kube-api-qps"),
        (vec!["--kube-api-burst=0"], "--kube-api-burst"),
        (vec!["--allocate-node-cidrs=maybe"], "--allocate-node-cidrs"),
        (
            vec!["--cidr-allocator-type=IPAMFromCluster"],
            "--cidr-allocator-type",
        ),
        (
            vec!["--metrics-bind-address=:99999"],
            "--metrics-bind-address",
        ),
        (
            vec!["--leader-elect-lease-duration=soon"],
            "--leader-elect-lease-duration",
        ),
        // Found only when the pool is built: must still be exit 2, before any client setup.
        (
            vec!["--service-cluster-ip-range=10.0.0.0/8"],
            "--service-cluster-ip-range",
        ),
        // Leader-election values kube-controller-manager rejects.
        (
            vec![
                "--leader-elect",
                "--leader-elect-lease-duration=5s",
                "--leader-elect-renew-deadline=10s",
            ],
            "--leader-elect-renew-deadline",
        ),
        (
            vec!["--leader-elect", "--leader-elect-lease-duration=0"],
            "--leader-elect-lease-duration",
        ),
        (
            vec!["--leader-elect", "--leader-elect-retry-period=0"],
            "--leader-elect-retry-period",
        ),
        (
            vec![
                "--leader-elect",
                "--leader-elect-lease-duration=99999999999h",
            ],
            "--leader-elect-lease-duration",
        ),
        (
            vec!["--leader-elect", "--leader-elect-resource-name="],
            "--leader-elect-resource-name",
        ),
        (
            vec!["--leader-elect", "--leader-elect-resource-namespace="],
            "--leader-elect-resource-namespace",
        ),
        (
            vec!["--node-cidr-update-workers=0"],
            "--node-cidr-update-workers",
        ),
        // Client configuration, checked before anything starts.
        (vec!["--master=ftp://127.0.0.1:1"], "--master"),
        (vec!["--master=http://"], "--master"),
        (vec!["--master=http://a b:1"], "--master"),
        (vec!["--kubeconfig=/nonexistent/kubeconfig"], "--kubeconfig"),
    ];
    for (extra, flag) in cases {
        let mut args = vec![cluster];
        args.extend_from_slice(&off);
        args.extend_from_slice(&extra);
        let out = run(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{extra:?}: not one line: {stderr:?}");
        assert!(
            lines[0].contains(flag),
            "{extra:?}: {stderr:?} does not name {flag}"
        );
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
    // plan: a missing NODELIST is one line too.
    let out = run(&["plan", cluster], None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{stderr:?}"
    );
}

/// `--master=HOST:PORT` without a scheme is completed to `http://` as client-go does (it used to
/// make the kube client panic and leave a half-alive process), and `--master` without
/// `--kubeconfig` sends no credentials even when `$KUBECONFIG` names a file with a token
/// (kube-controller-manager's `BuildConfigFromFlags` loads no kubeconfig then). The first request
/// arrives at a plain TCP listener of the test as HTTP/1.1 with our User-Agent.
#[test]
fn master_without_a_scheme_reaches_the_server_over_http_without_credentials() {
    use std::io::{BufRead as _, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let dir = std::env::temp_dir().join(format!("nodeipam-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: real-cluster-secret\n",
    )
    .expect("kubeconfig");
    let mut child = Command::new(BIN)
        .args([
            "--cluster-cidr=10.244.0.0/16",
            &format!("--master=127.0.0.1:{port}"),
            "--leader-elect=false",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--secure-port=0",
        ])
        .env("RUST_LOG", "warn")
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    listener.set_nonblocking(false).expect("blocking");
    let (stream, _) = listener.accept().expect("the controller connects");
    let mut head = Vec::new();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_owned());
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("exits");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        // Without leader election the first request still reads the Lease that keeps the write
        // intents (issue 30), before the Nodes are listed.
        head.first().is_some_and(|l| l
            == "GET /apis/coordination.k8s.io/v1/namespaces/kube-system/leases/nodeipam-controller HTTP/1.1"),
        "{head:?}"
    );
    let header = |name: &str| {
        head.iter()
            .find(|l| l.to_ascii_lowercase().starts_with(&format!("{name}:")))
            .cloned()
    };
    assert_eq!(
        header("user-agent"),
        Some(format!(
            "user-agent: nodeipam-controller/{}",
            env!("CARGO_PKG_VERSION")
        )),
        "{head:?}"
    );
    assert_eq!(header("authorization"), None, "no credentials: {head:?}");
}

#[test]
fn help_and_version_still_exit_0() {
    for flag in ["--help", "--version"] {
        let out = run(&[flag], None);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert!(!out.stdout.is_empty(), "{flag}");
    }
}

// ----- hostile Nodes -----------------------------------------------------------------------------

/// Duplicate Node names cannot come from an API server; a list that has them is bad input (it
/// made the plan free the first Node's kept block and assign it again).
#[test]
fn duplicate_node_names_are_bad_input() {
    let list = nodes(
        &[
            json!({"podCIDR": "10.244.0.0/24"}),
            json!({"podCIDR": "10.244.1.0/24"}),
            json!({}),
            json!({}),
        ],
        &["a", "a", "b", "c"],
    );
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.244.0.0/16"]);
    if json.is_object() {
        assert_no_double_assignment(&json, &[]);
    }
    assert_eq!(code, 2, "{json} {stderr}");
    assert!(
        stderr.contains("duplicate") && stderr.contains("\"a\""),
        "{stderr}"
    );
}

#[test]
fn nameless_nodes_are_bad_input() {
    let mut list = nodes(
        &[json!({"podCIDR": "10.244.0.0/24"}), json!({}), json!({})],
        &[],
    );
    list["items"][0]["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("name");
    list["items"][1]["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("name");
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.244.0.0/16"]);
    if json.is_object() {
        assert_no_double_assignment(&json, &[]);
    }
    assert_eq!(code, 2, "{json} {stderr}");
    assert!(stderr.contains("metadata.name"), "{stderr}");
}

/// A podCIDR larger than the whole cluster CIDR does not lie in it: skipped (out of range), its
/// overlap (the whole pool) stays reserved.
#[test]
fn pod_cidr_larger_than_the_cluster_cidr_is_skipped() {
    let list = nodes(&[json!({"podCIDR": "10.0.0.0/8"}), json!({})], &[]);
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.244.0.0/16"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        actions(&json),
        [
            ("node-0".into(), "skip".into()),
            ("node-1".into(), "fail".into())
        ],
        "{json}"
    );
    assert_eq!(json["pools"][0]["free"], 0, "{json}");
    assert_no_double_assignment(&json, &[]);
}

/// A Node whose podCIDR overlaps a service CIDR cannot be served correctly (pods would collide
/// with Service IPs): skipped with a reason, never kept; nothing is assigned over it.
#[test]
fn pod_cidr_overlapping_a_service_cidr_is_skipped() {
    let list = nodes(
        &[json!({"podCIDR": "10.244.128.0/24"}), json!({}), json!({})],
        &[],
    );
    let (code, json, stderr) = plan(
        &list,
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--service-cluster-ip-range=10.244.128.0/20",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        actions(&json)[0],
        ("node-0".into(), "skip".into()),
        "{json}"
    );
    assert!(
        json["nodes"][0]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("service"),
        "{json}"
    );
    assert_no_double_assignment(&json, &["10.244.128.0/20"]);
}

/// The API server rejects podCIDRs with surrounding whitespace; so does the occupy check (a CNI
/// would not parse them either).
#[test]
fn pod_cidr_with_whitespace_is_invalid() {
    let list = nodes(
        &[
            json!({"podCIDR": " 10.244.0.0/24 ", "podCIDRs": [" 10.244.0.0/24 "]}),
            json!({}),
        ],
        &[],
    );
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.244.0.0/16"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        actions(&json)[0],
        ("node-0".into(), "skip".into()),
        "{json}"
    );
}

/// Issue 31, item 1: `plan` reads legacy IPv4-mapped podCIDRs as Go's `net.ParseCIDR` does —
/// `::ffff:10.244.1.0/120` is 10.244.1.0/24, `::ffff:10.244.0.60/126` is 10.244.0.60/30 — keeps
/// those Nodes with their IPv4 ranges, and gives the two new Nodes the other two blocks. Before,
/// both were skipped as IPv6 (exit 1) and the new Nodes got 10.244.0.0/24 and 10.244.1.0/24.
#[test]
fn plan_reads_ipv4_mapped_pod_cidrs_as_go_does() {
    let list = nodes(
        &[
            json!({"podCIDR": "::ffff:10.244.1.0/120", "podCIDRs": ["::ffff:10.244.1.0/120"]}),
            json!({"podCIDR": "::ffff:10.244.0.60/126", "podCIDRs": ["::ffff:10.244.0.60/126"]}),
            json!({}),
            json!({}),
        ],
        &["legacy-120", "legacy-126", "new-1", "new-2"],
    );
    let (code, json, stderr) = plan(
        &list,
        &["--cluster-cidr=10.244.0.0/22", "--node-cidr-mask-size=24"],
    );
    assert_eq!(code, 0, "{json} {stderr}");
    let rows: Vec<(String, String, Vec<String>)> = plan_json::rows(&json, "nodes")
        .iter()
        .map(|n| {
            let cidrs = n["podCIDRs"]
                .as_array()
                .expect("podCIDRs")
                .iter()
                .map(|c| c.as_str().unwrap_or_default().to_owned())
                .collect();
            (
                plan_json::text(n, "name"),
                plan_json::text(n, "action"),
                cidrs,
            )
        })
        .collect();
    let row = |name: &str, action: &str, cidr: &str| {
        (name.to_owned(), action.to_owned(), vec![cidr.to_owned()])
    };
    assert_eq!(
        rows,
        [
            row("legacy-120", "keep", "10.244.1.0/24"),
            row("legacy-126", "keep", "10.244.0.60/30"),
            row("new-1", "assign", "10.244.2.0/24"),
            row("new-2", "assign", "10.244.3.0/24"),
        ],
        "{json}"
    );
    assert!(!stderr.contains("IPv6"), "{stderr}");
    assert_eq!(json["pools"][0]["used"], 4, "{json}");
    assert_no_double_assignment(&json, &[]);
}

/// Every other hostile podCIDR shape: exit 0/1, a reason per skipped Node, never a block twice.
#[test]
fn hostile_pod_cidrs_never_double_assign() {
    let cases: Vec<(Vec<Value>, i32)> = vec![
        (
            vec![
                json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.2.0/24"]}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDRs": ["10.244.1.0/24", "fd00::/64", "10.244.2.0/24"]}),
                json!({}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDRs": ["10.244.1.0/24", "10.244.2.0/24"]}),
                json!({}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDRs": ["banana"]}),
                json!({"podCIDRs": [""]}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDR": "10.244.0.0/24"}),
                json!({"podCIDR": "10.244.0.0/24"}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDR": "10.244.2.0/24"}),
                json!({"podCIDR": "10.244.2.0/23"}),
                json!({}),
                json!({}),
                json!({}),
            ],
            1,
        ),
        (
            vec![
                json!({"podCIDR": "10.244.3.0/24"}),
                json!({"podCIDR": "10.244.0.0/16"}),
                json!({}),
            ],
            1,
        ),
        (vec![json!({"podCIDR": "fd00::/64"}), json!({})], 1),
        // Kept as the IPv4 range Go reads, 10.244.0.0/24 (issue 31, item 1).
        (
            vec![json!({"podCIDR": "::ffff:10.244.0.0/120"}), json!({})],
            0,
        ),
        (
            vec![json!({"podCIDR": "::ffff:10.244.0.60/126"}), json!({})],
            0,
        ),
        (vec![json!({"podCIDR": "192.168.0.0/24"}), json!({})], 1),
        (
            vec![json!({"podCIDR": "10.244.0.5/24"}), json!({}), json!({})],
            0,
        ),
        (
            vec![
                json!({"podCIDR": "10.244.0.0/27"}),
                json!({"podCIDR": "10.244.0.32/27"}),
                json!({}),
            ],
            0,
        ),
    ];
    for (specs, want) in cases {
        let list = nodes(&specs, &[]);
        let (code, json, stderr) = plan(
            &list,
            &[
                "--cluster-cidr=10.244.0.0/16",
                "--service-cluster-ip-range=10.244.128.0/20",
            ],
        );
        assert_eq!(code, want, "{specs:?}: {json} {stderr}");
        assert_no_double_assignment(&json, &["10.244.128.0/20"]);
    }
    // Wrong JSON types in the Node itself are unreadable input.
    for bad in [
        json!({"podCIDRs": [42]}),
        json!({"podCIDRs": [null]}),
        json!({"podCIDR": {}}),
    ] {
        let (code, _, stderr) = plan(
            &nodes(std::slice::from_ref(&bad), &[]),
            &["--cluster-cidr=10.244.0.0/16"],
        );
        assert_eq!(code, 2, "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// 10 000 Nodes that all have podCIDRs are all occupied. How long that takes (the start-up occupy
/// was once quadratic-with-sort) is measured, not asserted: BENCHMARKS.md's "`plan` on a full
/// pool" section times 300,000 Nodes.
#[test]
fn ten_thousand_nodes_with_pod_cidrs_are_all_occupied() {
    let specs: Vec<Value> = (0..10_000)
        .map(|i| json!({"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256)}))
        .collect();
    let names: Vec<String> = (0..10_000).map(|i| format!("n{i:05}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let list = nodes(&specs, &names);
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.0.0.0/8"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["pools"][0]["used"], 10_000);
    let nodes = plan_json::rows(&json, "nodes");
    assert_eq!(nodes.len(), 10_000);
    for (node, spec) in nodes.iter().zip(&specs) {
        assert_eq!(
            (
                plan_json::text(node, "action"),
                plan_json::first_pod_cidr(node)
            ),
            (
                "keep".to_owned(),
                spec["podCIDR"].as_str().unwrap_or_default().to_owned()
            ),
            "{node}"
        );
    }
}

/// Several cluster CIDRs per family (issue 18 §1): two that overlap, or more than 8, exit 2 with
/// one line naming the flag (and the two entries).
#[test]
fn overlapping_or_too_many_cluster_cidrs_exit_2() {
    let off = [
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--secure-port=0",
    ];
    let nine = "--cluster-cidr=10.0.0.0/16,10.1.0.0/16,10.2.0.0/16,10.3.0.0/16,10.4.0.0/16,10.5.0.0/16,10.6.0.0/16,10.7.0.0/16,fd00::/48";
    for (flag, says) in [
        (
            "--cluster-cidr=10.244.0.0/16,fd00::/48,10.244.128.0/17",
            "--cluster-cidr entries 1 (10.244.0.0/16) and 3 (10.244.128.0/17) overlap",
        ),
        (nine, "--cluster-cidr has 9 entries; at most 8 are allowed"),
    ] {
        let mut args = vec![flag];
        args.extend_from_slice(&off);
        let out = run(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{flag}: not one line: {stderr:?}");
        assert!(lines[0].contains(says), "{flag}: {stderr:?}");
    }
}

/// `plan` with two IPv4 cluster CIDRs over the AWS fixture's four Nodes: one pool row per CIDR,
/// the second used only for what the first cannot hold.
#[test]
fn plan_shows_one_pool_row_per_cluster_cidr() {
    let list = nodes(&[json!({}), json!({}), json!({}), json!({})], &[]);
    let (code, json, stderr) = plan(&list, &["--cluster-cidr=10.10.0.0/23,10.20.0.0/22"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        plan_json::pools(&json, "capacity"),
        [
            ("10.10.0.0/23".to_owned(), 2, 2),
            ("10.20.0.0/22".to_owned(), 4, 2)
        ]
    );
    let mut cidrs: Vec<String> = plan_json::rows(&json, "nodes")
        .iter()
        .map(plan_json::first_pod_cidr)
        .collect();
    cidrs.sort();
    assert_eq!(
        cidrs,
        [
            "10.10.0.0/24",
            "10.10.1.0/24",
            "10.20.0.0/24",
            "10.20.1.0/24"
        ]
    );
}

//! `nodeipam-controller plan` on every real NodeList fixture, through the built binary.
//!
//! Config per fixture (what the cluster plausibly used; documented here and in the report):
//! | fixture | flags | expectation |
//! |---|---|---|
//! | 01 k3s | `--cluster-cidr=10.42.0.0/16` (k3s default) | keep 10.42.0.0/24 |
//! | 03 AKS kubenet | `10.244.0.0/16` (AKS kubenet default) | keep all 3 (out of name order) |
//! | 05 AWS | `10.244.0.0/16` | assign 10.244.0.0/24 … 10.244.3.0/24 in list order |
//! | 06 KVM | `10.2.0.0/16`, services `10.2.0.0/24` | assign from 10.2.1.0/24, skipping the service block |
//! | 07 EKS | `10.100.0.0/16`, `--node-cidr-mask-size=26` | assign two /26s |
//! | 08 OpenShift GCP | `10.128.0.0/14`, mask 23 (OpenShift hostPrefix) | assign 6 /23s |
//! | 09 OpenShift bare metal | `10.128.0.0/14`, mask 23 | assign 2 |
//! | 10 minikube | `10.244.0.0/16` | assign 10.244.0.0/24 |
//! | 11 mixed | `10.32.0.0/12` (Weave default) | 5 `***HIDDEN***/25` skipped, exit 1 |
//! | 12 k0s | `10.244.0.0/16,fd00::/104`, ipv6 mask 110 | IPv6-first node kept |
//! | 13 kind | `10.244.0.0/16,fd00:10:244::/56` | dual-stack node kept; single-stack config skips it |
//! | 20/21 GKE | `10.48.0.0/14` / `10.40.0.0/14` | `podCIDR`-only node kept |
//! | 22 GCE | `10.244.0.0/16` | kept |

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod plan_json;
use plan_json::{first_pod_cidr, text};

const BIN: &str = env!("CARGO_BIN_EXE_nodeipam-controller");

fn fixture(name: &str) -> String {
    format!("{}/../fixtures/nodes/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("binary runs")
}

/// Runs `plan -o json` and returns (exit code, JSON).
fn plan(file: &str, flags: &[&str]) -> (i32, Value) {
    let path = fixture(file);
    let mut args = vec!["plan", "--output", "json"];
    args.extend_from_slice(flags);
    args.push(&path);
    let out = run(&args);
    let code = out.status.code().expect("exit code");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{file}: stdout is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

fn actions(json: &Value) -> Vec<(String, Vec<String>, String)> {
    plan_json::rows(json, "nodes")
        .iter()
        .map(|n| {
            (
                text(n, "name"),
                n["podCIDRs"]
                    .as_array()
                    .expect("podCIDRs array")
                    .iter()
                    .map(|c| c.as_str().unwrap_or_default().to_owned())
                    .collect(),
                text(n, "action"),
            )
        })
        .collect()
}

fn all(json: &Value, action: &str) -> bool {
    actions(json).iter().all(|(_, _, a)| a == action)
}

#[test]
fn aks_keeps_all_three_exactly() {
    let (code, json) = plan(
        "03-aks-kubenet-3nodes.json",
        &["--cluster-cidr=10.244.0.0/16"],
    );
    assert_eq!(code, 0);
    assert_eq!(
        json,
        json!({
            "nodes": [
                {"name": "aks-agentpool-11223344-vmss000000", "podCIDRs": ["10.244.1.0/24"], "action": "keep", "reason": null},
                {"name": "aks-agentpool-11223344-vmss000001", "podCIDRs": ["10.244.2.0/24"], "action": "keep", "reason": null},
                {"name": "aks-agentpool-11223344-vmss000002", "podCIDRs": ["10.244.0.0/24"], "action": "keep", "reason": null},
            ],
            "pools": [{"clusterCIDR": "10.244.0.0/16", "nodeMaskSize": 24, "capacity": 256, "used": 3, "free": 253, "largestFreeBlock": "10.244.128.0/17"}],
        })
    );
}

#[test]
fn aws_assigns_in_list_order() {
    let (code, json) = plan(
        "05-aws-4nodes-no-podcidr.json",
        &["--cluster-cidr=10.244.0.0/16"],
    );
    assert_eq!(code, 0);
    let got: Vec<(String, Vec<String>, String)> = actions(&json);
    let want: Vec<(String, Vec<String>, String)> = [15, 34, 41, 42]
        .iter()
        .enumerate()
        .map(|(i, host)| {
            (
                format!("ip-10-1-1-{host}.eu-central-1.compute.internal"),
                vec![format!("10.244.{i}.0/24")],
                "assign".to_owned(),
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(json["pools"][0]["used"], 4);
    assert_eq!(json["pools"][0]["free"], 252);
}

#[test]
fn aws_exhausted_pool_fails_and_exits_1() {
    let (code, json) = plan(
        "05-aws-4nodes-no-podcidr.json",
        &["--cluster-cidr=10.244.0.0/23"],
    );
    assert_eq!(code, 1);
    let got: Vec<String> = actions(&json).into_iter().map(|(_, _, a)| a).collect();
    assert_eq!(got, ["assign", "assign", "fail", "fail"]);
    let reason = json["nodes"][2]["reason"].as_str().expect("reason");
    assert!(reason.contains("10.244.0.0/23"), "{reason}");
    assert_eq!(json["nodes"][2]["podCIDRs"], json!([]));
}

#[test]
fn kvm_avoids_the_service_cidr() {
    let (code, json) = plan(
        "06-kvm-onprem-4nodes-no-podcidr.json",
        &[
            "--cluster-cidr=10.2.0.0/16",
            "--service-cluster-ip-range=10.2.0.0/24",
        ],
    );
    assert_eq!(code, 0);
    let cidrs: Vec<Vec<String>> = actions(&json).into_iter().map(|(_, c, _)| c).collect();
    assert_eq!(
        cidrs,
        [
            ["10.2.1.0/24"],
            ["10.2.2.0/24"],
            ["10.2.3.0/24"],
            ["10.2.4.0/24"]
        ]
    );
    assert_eq!(json["pools"][0]["used"], 5);
}

#[test]
fn eks_uses_the_mask_size_flag() {
    let (code, json) = plan(
        "07-eks-2nodes-no-podcidr.json",
        &["--cluster-cidr=10.100.0.0/16", "--node-cidr-mask-size=26"],
    );
    assert_eq!(code, 0);
    let cidrs: Vec<Vec<String>> = actions(&json).into_iter().map(|(_, c, _)| c).collect();
    assert_eq!(cidrs, [["10.100.0.0/26"], ["10.100.0.64/26"]]);
    assert_eq!(json["pools"][0]["capacity"], 1024);
}

#[test]
fn openshift_fixtures_are_all_assigned() {
    for (file, count) in [
        ("08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json", 6),
        ("09-openshift-baremetal-2nodes-no-podcidr.json", 2),
    ] {
        let (code, json) = plan(
            file,
            &["--cluster-cidr=10.128.0.0/14", "--node-cidr-mask-size=23"],
        );
        assert_eq!(code, 0, "{file}");
        assert!(all(&json, "assign"), "{file}");
        assert_eq!(actions(&json).len(), count, "{file}");
        assert_eq!(
            json["nodes"][1]["podCIDRs"],
            json!(["10.128.2.0/23"]),
            "{file}"
        );
    }
}

#[test]
fn minikube_gets_the_first_block() {
    let (code, json) = plan(
        "10-minikube-single-node-no-podcidr.json",
        &["--cluster-cidr=10.244.0.0/16"],
    );
    assert_eq!(code, 0);
    assert_eq!(
        actions(&json),
        [(
            "minikube".to_owned(),
            vec!["10.244.0.0/24".to_owned()],
            "assign".to_owned()
        )]
    );
}

#[test]
fn mixed_bundle_skips_redacted_nodes_with_a_reason() {
    let (code, json) = plan(
        "11-mixed-bundle-7nodes-redacted-podcidr.json",
        &["--cluster-cidr=10.32.0.0/12"],
    );
    assert_eq!(code, 1);
    let nodes = json["nodes"].as_array().expect("nodes");
    let skipped: Vec<&Value> = nodes.iter().filter(|n| n["action"] == "skip").collect();
    assert_eq!(skipped.len(), 5);
    for node in skipped {
        assert_eq!(node["podCIDRs"], json!(["***HIDDEN***/25"]));
        let reason = node["reason"].as_str().expect("a sentence");
        assert!(reason.contains("not a valid CIDR"), "{reason}");
    }
    // Existing CIDRs are occupied before allocating: node-a (listed first) does not get 10.32.0.0/24.
    assert_eq!(nodes[0]["name"], "node-a");
    assert_eq!(nodes[0]["podCIDRs"], json!(["10.32.1.0/24"]));
    assert_eq!(nodes[0]["action"], "assign");
    assert_eq!(nodes[6]["action"], "keep");
    assert_eq!(nodes[6]["podCIDRs"], json!(["10.32.0.0/24"]));
}

#[test]
fn k0s_ipv6_first_node_is_kept_by_an_ipv4_first_config() {
    let (code, json) = plan(
        "12-k0s-dualstack-ipv6-primary-partial.json",
        &[
            "--cluster-cidr=10.244.0.0/16,fd00::/104",
            "--node-cidr-mask-size-ipv6=110",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(
        actions(&json),
        [(
            "worker-1".to_owned(),
            vec!["fd00::/110".to_owned(), "10.244.0.0/24".to_owned()],
            "keep".to_owned()
        )]
    );
    assert_eq!(json["pools"][1]["clusterCIDR"], "fd00::/104");
    assert_eq!(json["pools"][1]["capacity"], 64);
    assert_eq!(json["pools"][1]["used"], 1);
}

#[test]
fn kind_dual_stack_kept_or_skipped_by_single_stack() {
    let (code, json) = plan(
        "13-kind-dualstack-single-node-abridged.json",
        &["--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"],
    );
    assert_eq!(code, 0);
    assert!(all(&json, "keep"));
    let (code, json) = plan(
        "13-kind-dualstack-single-node-abridged.json",
        &["--cluster-cidr=10.244.0.0/16"],
    );
    assert_eq!(code, 1);
    assert_eq!(json["nodes"][0]["action"], "skip");
    let reason = json["nodes"][0]["reason"].as_str().expect("reason");
    assert!(reason.contains("no IPv6 cluster CIDR"), "{reason}");
    // The IPv4 part stays reserved.
    assert_eq!(json["pools"][0]["used"], 1);
}

#[test]
fn single_podcidr_fixtures_are_kept() {
    for (file, cluster, want) in [
        (
            "01-k3s-single-node-flannel-hostgw.json",
            "10.42.0.0/16",
            "10.42.0.0/24",
        ),
        (
            "20-gke-preemptible-single-node-podcidr.json",
            "10.48.0.0/14",
            "10.48.10.0/24",
        ),
        (
            "21-gke-cos-single-node-podcidr.json",
            "10.40.0.0/14",
            "10.40.0.0/24",
        ),
        (
            "22-gce-notready-single-node-podcidr.json",
            "10.244.0.0/16",
            "10.244.0.0/24",
        ),
    ] {
        let flag = format!("--cluster-cidr={cluster}");
        let (code, json) = plan(file, &[&flag]);
        assert_eq!(code, 0, "{file}");
        assert_eq!(json["nodes"][0]["action"], "keep", "{file}");
        assert_eq!(json["nodes"][0]["podCIDRs"], json!([want]), "{file}");
    }
}

#[test]
fn out_of_range_node_is_skipped() {
    let (code, json) = plan(
        "01-k3s-single-node-flannel-hostgw.json",
        &["--cluster-cidr=10.244.0.0/16"],
    );
    assert_eq!(code, 1);
    assert_eq!(json["nodes"][0]["action"], "skip");
    assert_eq!(json["pools"][0]["used"], 0);
}

#[test]
fn reads_stdin_and_prints_a_table() {
    let text = std::fs::read(fixture("05-aws-4nodes-no-podcidr.json")).expect("fixture");
    let mut child = Command::new(BIN)
        .args(["plan", "--cluster-cidr=10.244.0.0/16", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&text)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("NODE"), "{table}");
    assert!(
        table.contains("ip-10-1-1-42.eu-central-1.compute.internal  assign  10.244.3.0/24"),
        "{table}"
    );
    assert!(table.contains("10.244.0.0/16"), "{table}");
}

/// docs/node-selector.md's `--node-selector` example, byte for byte: the AKS Nodes of another CNI are `ignore`,
/// their blocks reserved (USED 3), exit 0.
#[test]
fn node_selector_ignores_unselected_nodes() {
    let out = run(&[
        "plan",
        "--cluster-cidr=10.244.0.0/16",
        "--node-selector=agentpool!=agentpool",
        &fixture("03-aks-kubenet-3nodes.json"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    let readme = std::fs::read_to_string(format!(
        "{}/../docs/node-selector.md",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("docs/node-selector.md");
    let example = readme
        .split("--node-selector='agentpool!=agentpool'")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("docs/node-selector.md has the example's output");
    assert_eq!(table, example);
    assert!(table.contains(
        "aks-agentpool-11223344-vmss000002  ignore  10.244.0.0/24  not selected by --node-selector; 10.244.0.0/24 stays reserved"
    ));
    // The same Nodes selected are kept, as without the flag.
    let (code, json) = plan(
        "03-aks-kubenet-3nodes.json",
        &["--cluster-cidr=10.244.0.0/16", "--node-selector=agentpool"],
    );
    assert_eq!(code, 0);
    assert!(all(&json, "keep"), "{json}");
}

#[test]
fn bad_flags_and_input_exit_2_with_one_line() {
    let path = fixture("05-aws-4nodes-no-podcidr.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["plan", "--cluster-cidr=10.0.0.0/8,10.1.0.0/16", &path],
            "--cluster-cidr",
        ),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "--node-cidr-mask-size=8",
                &path,
            ],
            "--node-cidr-mask-size",
        ),
        (
            vec!["plan", "--cluster-cidr=nonsense", &path],
            "--cluster-cidr",
        ),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "--service-cluster-ip-range=x",
                &path,
            ],
            "--service-cluster-ip-range",
        ),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "/nonexistent/nodes.json",
            ],
            "/nonexistent/nodes.json",
        ),
        (
            vec!["plan", "--cluster-cidr=10.0.0.0/16", "--output=yaml", &path],
            "--output",
        ),
        (
            vec!["--cidr-allocator-type=IPAMFromCluster"],
            "--cidr-allocator-type",
        ),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "--cidr-allocator-type=CloudAllocator",
                "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
                "--node-cidr-mask-size-rule=agentpool=huge:ipv4=8",
                &path,
            ],
            "--node-cidr-mask-size-rule #2 \"agentpool=huge:ipv4=8\": /8 does not fit",
        ),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
                &path,
            ],
            "--node-cidr-mask-size-rule needs --cidr-allocator-type=CloudAllocator",
        ),
        (vec!["--kube-api-qps=-1"], "--kube-api-qps"),
        (
            vec![
                "plan",
                "--cluster-cidr=10.0.0.0/16",
                "--node-selector=pool in (a",
                &path,
            ],
            "--node-selector",
        ),
        (vec!["--node-selector=pool>1"], "--node-selector"),
    ];
    for (args, names) in cases {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains(names),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn invalid_node_list_exits_2() {
    let mut child = Command::new(BIN)
        .args(["plan", "--cluster-cidr=10.0.0.0/16", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(br#"{"kind":"PodList","items":[]}"#)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid NodeList"));
}

/// IPAM flags are global: given before `plan` they count the same as after it.
#[test]
fn ipam_flags_before_the_subcommand_count() {
    let path = fixture("05-aws-4nodes-no-podcidr.json");
    let before = run(&["--cluster-cidr=10.244.0.0/16", "plan", "-o", "json", &path]);
    let after = run(&["plan", "-o", "json", "--cluster-cidr=10.244.0.0/16", &path]);
    assert_eq!(
        before.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&before.stderr)
    );
    assert_eq!(before.stdout, after.stdout);
}

/// `plan` has nothing to show when allocation is off: a clear exit 2, not a misleading plan.
#[test]
fn plan_refuses_allocation_off() {
    let path = fixture("05-aws-4nodes-no-podcidr.json");
    let out = run(&[
        "plan",
        "--cluster-cidr=10.244.0.0/16",
        "--allocate-node-cidrs=false",
        &path,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--allocate-node-cidrs=false"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// `--cidr-allocator-type=CloudAllocator` on fixture 08 (OpenShift on GCP): the masters' role
/// label (`node-role.kubernetes.io/master`, which NodeRestriction keeps kubelets from setting)
/// gives them /25s round-robin from the cursor, the workers keep the default /23 — on a /25 grid.
/// The same rule from a rules file gives the same plan.
#[test]
fn cloud_allocator_sizes_openshift_masters_by_role() {
    let rule = "node-role.kubernetes.io/master=:ipv4=25";
    let flags = [
        "--cluster-cidr=10.128.0.0/14",
        "--node-cidr-mask-size=23",
        "--service-cluster-ip-range=172.30.0.0/16",
        "--cidr-allocator-type=CloudAllocator",
    ];
    let file = "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json";
    let mut with_flag = flags.to_vec();
    let rule_flag = format!("--node-cidr-mask-size-rule={rule}");
    with_flag.push(&rule_flag);
    let (code, json) = plan(file, &with_flag);
    assert_eq!(code, 0, "{json}");
    let got: Vec<(String, Vec<String>)> = actions(&json)
        .into_iter()
        .map(|(name, cidrs, _)| (name, cidrs))
        .collect();
    let want: Vec<(String, Vec<String>)> = [
        ("master-0", "10.128.0.0/25"),
        ("master-1", "10.128.0.128/25"),
        ("master-2", "10.128.1.0/25"),
        ("worker-b-7x8mw", "10.128.2.0/23"),
        ("worker-c-nmnbz", "10.128.4.0/23"),
        ("worker-d-bpnbd", "10.128.6.0/23"),
    ]
    .iter()
    .map(|(n, c)| {
        (
            format!("ci-ln-d53y532-f76d1-2btqq-{n}"),
            vec![(*c).to_owned()],
        )
    })
    .collect();
    assert_eq!(got, want);
    assert!(all(&json, "assign"));
    assert_eq!(
        json["nodes"][0]["reason"],
        format!("10.128.0.0/25 sized by --node-cidr-mask-size-rule #1 \"{rule}\"")
    );
    assert_eq!(json["nodes"][3]["reason"], Value::Null, "default size");
    assert_eq!(json["pools"][0]["nodeMaskSize"], 25);
    assert_eq!(json["pools"][0]["capacity"], 2048);
    assert_eq!(json["pools"][0]["used"], 3 + 3 * 4);

    let dir = std::env::temp_dir().join(format!("nodeipam-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rules = dir.join("rules");
    std::fs::write(&rules, format!("# masters are small\n\n{rule}\n")).expect("write rules");
    let rules_flag = format!("--node-cidr-mask-size-rules-file={}", rules.display());
    let mut with_file = flags.to_vec();
    with_file.push(&rules_flag);
    let (code, from_file) = plan(file, &with_file);
    std::fs::remove_dir_all(&dir).expect("clean up");
    assert_eq!(code, 0);
    assert_eq!(actions(&from_file), actions(&json));
    assert_eq!(from_file["pools"], json["pools"]);
}

/// `--cluster-cidrs` with a hand-written ClusterCIDR List (fixtures/clustercidrs) over fixture
/// 08's real labels: the masters get /28s of their selector pool, the us-east1-b worker a /26 of
/// the pool selecting its zone (the two-requirement match beats the deleting `retired` pool,
/// which serves no new Node anyway), the other workers the flag CIDR and then the `overflow`
/// fallback pool (a supernet of the flag CIDR: one backing set, 10.128.0.0/22). The invalid
/// object is shown, not used.
#[test]
fn cluster_cidrs_serve_the_nodes_their_selectors_match() {
    let pools = format!(
        "{}/../fixtures/clustercidrs/openshift-gcp-pools.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let (code, json) = plan(
        "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
        &["--cluster-cidr=10.128.0.0/24", "--cluster-cidrs", &pools],
    );
    assert_eq!(code, 0, "{json}");
    let got: Vec<[String; 3]> = plan_json::rows(&json, "nodes")
        .iter()
        .map(|n| {
            [
                text(n, "name").replace("ci-ln-d53y532-f76d1-2btqq-", ""),
                first_pod_cidr(n),
                text(n, "reason"),
            ]
        })
        .collect();
    let expected = [
        ["master-0", "10.200.0.0/28", "in ClusterCIDR masters"],
        ["master-1", "10.200.0.16/28", "in ClusterCIDR masters"],
        ["master-2", "10.200.0.32/28", "in ClusterCIDR masters"],
        ["worker-b-7x8mw", "10.201.0.0/26", "in ClusterCIDR zone-b"],
        ["worker-c-nmnbz", "10.128.0.0/24", "in ClusterCIDR overflow"],
        ["worker-d-bpnbd", "10.128.1.0/24", "in ClusterCIDR overflow"],
    ];
    assert_eq!(got, expected);
    assert_eq!(
        plan_json::pools(&json, "nodeMaskSize"),
        [
            ("10.128.0.0/22".to_owned(), 24, 2),
            ("10.200.0.0/24".to_owned(), 28, 3),
            ("10.202.0.0/23".to_owned(), 24, 0),
            ("10.201.0.0/24".to_owned(), 26, 1),
        ]
    );
    let rows: Vec<(String, String, Value)> = plan_json::rows(&json, "clusterCIDRs")
        .iter()
        .map(|r| (text(r, "name"), text(r, "state"), r["ranges"].clone()))
        .collect();
    // One row: `(name, state, ranges)`, its one range `cidr` with `capacity` and `used` blocks.
    let row = |name: &str, state: &str, cidr: &str, capacity: u64, used: u64| {
        let range =
            json!([{"cidr": cidr, "capacity": capacity, "used": used, "free": capacity - used}]);
        (name.to_owned(), state.to_owned(), range)
    };
    assert_eq!(
        rows,
        [
            row("masters", "serving", "10.200.0.0/24", 16, 3),
            row("overflow", "serving", "10.128.0.0/22", 4, 2),
            row("retired", "deleting", "10.202.0.0/23", 2, 0),
            row("zone-b", "serving", "10.201.0.0/24", 4, 1),
            (
                "too-small-blocks".to_owned(),
                "invalid".to_owned(),
                json!([])
            ),
        ]
    );
    // Without the flag there is no clusterCIDRs key (the output is as before).
    let (_, plain) = plan(
        "08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json",
        &["--cluster-cidr=10.128.0.0/24"],
    );
    assert!(plain.get("clusterCIDRs").is_none(), "{plain}");
}

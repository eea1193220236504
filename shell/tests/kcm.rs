//! kube-controller-manager's command line: real kcm/ccm command lines (kubeadm's static Pod,
//! cloud-provider-azure's CCM and KCM manifests, `fixtures/commandlines/`) parse to the expected
//! configuration; pflag's value forms; the refusals; `plan` with a pasted kcm command line; the
//! docs/kcm-flags.md flag table; `--help`, `--version`, completions; the start-up line in JSON; the
//! diagnostics as `plan` notes.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Output, Stdio};

use nodeipam::flags::{self, LogFormat, Parsed};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_nodeipam-controller");

fn path(relative: &str) -> String {
    format!("{}/../{relative}", env!("CARGO_MANIFEST_DIR"))
}

/// The command of a manifest: every `- --flag…` / `- "--flag…"` line (YAML list items of a
/// container's `command`/`args`), quotes and trailing comments removed, with the program first.
fn manifest_command(relative: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path(relative)).expect("fixture");
    let mut argv = vec!["nodeipam-controller".to_owned()];
    for line in text.lines() {
        let Some(item) = line.trim_start().strip_prefix("- ") else {
            continue;
        };
        let item = item.trim();
        let arg = if let Some(quoted) = item.strip_prefix('"') {
            quoted.split('"').next().unwrap_or_default().to_owned()
        } else {
            item.split(" #")
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        if arg.starts_with('-') {
            argv.push(arg);
        }
    }
    argv
}

fn parse(argv: &[String]) -> Parsed {
    flags::parse_from(argv.iter().cloned()).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

fn ignored_names(parsed: &Parsed) -> BTreeSet<&'static str> {
    parsed.ignored.iter().map(|f| f.name).collect()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("binary runs")
}

/// kubeadm's kube-controller-manager command parses; the node IPAM flags and the client and
/// leader-election and secure-serving flags are read as kcm reads them; the other eight are
/// accepted and listed.
#[test]
fn kubeadm_command_line_parses_as_kcm() {
    let argv = manifest_command("fixtures/commandlines/kubeadm-kube-controller-manager.yaml");
    assert_eq!(argv.len(), 18, "{argv:?}");
    let parsed = parse(&argv);
    let cli = &parsed.cli;
    assert!(cli.command.is_none());
    assert!(cli.ipam.allocate_node_cidrs);
    let ipam = cli.ipam.validate().expect("valid IPAM flags");
    assert_eq!(ipam.cluster_cidrs.len(), 1);
    assert_eq!(
        ipam.cluster_cidrs[0].cluster_cidr.to_string(),
        "10.244.0.0/16"
    );
    assert_eq!(ipam.cluster_cidrs[0].node_mask_size, 24);
    assert_eq!(ipam.service_cidrs[0].to_string(), "10.96.0.0/12");
    assert_eq!(
        cli.controller.kubeconfig.as_deref(),
        Some(std::path::Path::new(
            "/etc/kubernetes/controller-manager.conf"
        ))
    );
    assert_eq!(cli.controller.master, None);
    assert!(cli.controller.leader_elect);
    assert_eq!(
        cli.controller.leader_elect_resource_namespace,
        "kube-system"
    );
    assert_eq!(
        cli.controller.leader_elect_resource_name,
        flags::DEFAULT_LEASE_NAME
    );
    assert_eq!(
        cli.compat.controllers,
        ["*", "bootstrapsigner", "tokencleaner"]
    );
    assert_eq!(cli.compat.leader_elect_resource_lock, "leases");
    assert_eq!(cli.compat.validate(&cli.controller), Ok(()));
    assert_eq!(cli.controller.validate(), Ok(()));
    assert_eq!(cli.logging.verbosity, 0);
    assert_eq!(cli.logging.logging_format, LogFormat::Text);
    assert_eq!(
        ignored_names(&parsed),
        BTreeSet::from([
            "client-ca-file",
            "cluster-name",
            "cluster-signing-cert-file",
            "cluster-signing-key-file",
            "requestheader-client-ca-file",
            "root-ca-file",
            "service-account-private-key-file",
            "use-service-account-credentials",
        ])
    );
    // The secure-serving flags are kcm's: the port on localhost, reviews through kubeadm's
    // controller-manager.conf; client-certificate authentication is listed as ignored.
    assert_eq!(cli.serving.secure_port, 10257);
    assert_eq!(
        cli.serving.bind_address.0,
        Some(std::net::IpAddr::from([127, 0, 0, 1]))
    );
    let conf = Some(std::path::Path::new(
        "/etc/kubernetes/controller-manager.conf",
    ));
    assert_eq!(cli.serving.authentication_kubeconfig.as_deref(), conf);
    assert_eq!(cli.serving.authorization_kubeconfig.as_deref(), conf);
    let client_ca = parsed
        .ignored
        .iter()
        .find(|f| f.name == "client-ca-file")
        .expect("listed");
    assert_eq!(
        client_ca.to_string(),
        "--client-ca-file=/etc/kubernetes/pki/ca.crt"
    );
    assert!(
        client_ca.reason.contains("bearer tokens only"),
        "{}",
        client_ca.reason
    );
}

/// cloud-provider-azure's cloud-controller-manager (the AKS/CAPZ CCM) parses: it allocates from
/// 10.244.0.0/16 with no service range, `--controllers=*,-cloud-node` keeps node-ipam on,
/// `--v=4` is debug, `--secure-port=10267` is read, and the cloud flags are listed as ignored.
#[test]
fn azure_ccm_command_line_parses() {
    let argv = manifest_command(
        "fixtures/commandlines/cloud-provider-azure-cloud-controller-manager.yaml",
    );
    let parsed = parse(&argv);
    let cli = &parsed.cli;
    assert!(cli.ipam.allocate_node_cidrs);
    let ipam = cli.ipam.validate().expect("valid IPAM flags");
    assert_eq!(
        ipam.cluster_cidrs[0].cluster_cidr.to_string(),
        "10.244.0.0/16"
    );
    assert!(ipam.service_cidrs.is_empty());
    assert_eq!(cli.compat.controllers, ["*", "-cloud-node"]);
    assert_eq!(cli.compat.validate(&cli.controller), Ok(()));
    assert!(cli.controller.leader_elect);
    assert_eq!(cli.logging.verbosity, 4);
    assert_eq!(
        nodeipam::logging::filter_for_verbosity(cli.logging.verbosity),
        "info,nodeipam=debug,nodeipam_controller=debug,kube_client::client::builder=off"
    );
    assert_eq!(
        ignored_names(&parsed),
        BTreeSet::from([
            "cloud-config",
            "cloud-provider",
            "cluster-name",
            "configure-cloud-routes",
            "route-reconciliation-period",
        ])
    );
    assert_eq!(cli.serving.secure_port, 10267);
    // No diagnostic: 10.244.0.0/16 overlaps no well-known service range.
    let sizing = nodeipam::node_pools::Sizing::range_allocator(&ipam);
    assert!(nodeipam::diagnostics::config_findings(&ipam, &sizing).is_empty());
}

/// The kube-controller-manager beside that CCM: allocation off (the CCM allocates), feature gates,
/// the removed `--pod-eviction-timeout` and `--profiling=false` accepted.
#[test]
fn azure_kcm_command_line_parses_with_allocation_off() {
    let argv =
        manifest_command("fixtures/commandlines/cloud-provider-azure-kube-controller-manager.yaml");
    let parsed = parse(&argv);
    let cli = &parsed.cli;
    assert!(!cli.ipam.allocate_node_cidrs);
    assert_eq!(cli.logging.verbosity, 2);
    assert_eq!(
        cli.controller.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kubelet/kubeconfig"))
    );
    let names = ignored_names(&parsed);
    for name in [
        "feature-gates",
        "pod-eviction-timeout",
        "profiling",
        "terminated-pod-gc-threshold",
    ] {
        assert!(names.contains(name), "{name}: {names:?}");
    }
    let gates = parsed
        .ignored
        .iter()
        .find(|f| f.name == "feature-gates")
        .expect("listed");
    assert_eq!(
        gates.to_string(),
        "--feature-gates=LocalStorageCapacityIsolation=true,ServiceNodeExclusion=true"
    );
}

/// pflag's forms: every `strconv.ParseBool` spelling, `--flag value` and `--flag=value`, `-v N`,
/// `--v=N`, `-vN`, `_` in names, Go integer syntax, a repeated flag's last value.
#[test]
fn pflag_value_forms() {
    let argv = |args: &[&str]| {
        std::iter::once("nodeipam-controller")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for (text, want) in [
        ("True", true),
        ("TRUE", true),
        ("1", true),
        ("t", true),
        ("T", true),
        ("False", false),
        ("0", false),
        ("f", false),
        ("F", false),
        ("FALSE", false),
    ] {
        let flag = format!("--allocate-node-cidrs={text}");
        let parsed = parse(&argv(&[&flag, "--leader-elect=0"]));
        assert_eq!(parsed.cli.ipam.allocate_node_cidrs, want, "{flag}");
        assert!(!parsed.cli.controller.leader_elect);
        // An ignored boolean takes the same forms.
        let profiling = format!("--profiling={text}");
        assert_eq!(parse(&argv(&[&profiling])).ignored[0].values, [text]);
    }
    assert!(flags::parse_from(argv(&["--allocate-node-cidrs=yes"])).is_err());
    assert!(flags::parse_from(argv(&["--profiling=maybe"])).is_err());
    for form in [
        &["-v", "2"][..],
        &["-v=2"],
        &["-v2"],
        &["--v=2"],
        &["--v", "2"],
    ] {
        assert_eq!(parse(&argv(form)).cli.logging.verbosity, 2, "{form:?}");
    }
    let parsed = parse(&argv(&[
        "--cluster-cidr",
        "10.0.0.0/16",
        "--cluster_cidr=10.244.0.0/16",
        "--node_cidr_mask_size=0x1a",
        "--kube-api-burst=0o40",
        "--concurrent_rc_syncs",
        "5",
        "--logging-format",
        "json",
    ]));
    assert_eq!(
        parsed.cli.ipam.cluster_cidr, "10.244.0.0/16",
        "the last one wins"
    );
    assert_eq!(parsed.cli.ipam.node_cidr_mask_size, Some(26));
    assert_eq!(parsed.cli.controller.kube_api_burst, 32);
    assert_eq!(parsed.cli.logging.logging_format, LogFormat::Json);
    assert_eq!(parsed.ignored[0].to_string(), "--concurrent-rc-syncs=5");
    // cloud-provider-azure's name for the format flag.
    assert_eq!(
        parse(&argv(&["--log-format=json"]))
            .cli
            .logging
            .logging_format,
        LogFormat::Json
    );
    // List flags append, as pflag's stringSlice: the second --controllers disables nodeipam.
    let parsed = parse(&argv(&["--controllers=*", "--controllers", "-nodeipam"]));
    assert_eq!(parsed.cli.compat.controllers, ["*", "-nodeipam"]);
    assert!(parsed.cli.compat.validate(&parsed.cli.controller).is_err());
    // Without leader election the lock type is not checked (kcm checks it only with it).
    let parsed = parse(&argv(&[
        "--leader-elect=false",
        "--leader-elect-resource-lock=configmaps",
    ]));
    assert_eq!(parsed.cli.compat.validate(&parsed.cli.controller), Ok(()));
}

/// What ignoring would change is refused: exit 2, one line naming the flag and saying why.
#[test]
fn flags_that_would_change_allocation_exit_2() {
    let base = [
        "--cluster-cidr=10.244.0.0/16",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--secure-port=0",
    ];
    for (flag, names) in [
        ("--controllers=*,-nodeipam", "--controllers"),
        ("--controllers=*,-node-ipam-controller", "--controllers"),
        ("--controllers=route,service", "--controllers"),
        (
            "--leader-elect-resource-lock=endpointsleases",
            "--leader-elect-resource-lock",
        ),
        (
            "--leader-elect-resource-name=kube-controller-manager",
            "--leader-elect-resource-name",
        ),
        (
            "--node-filter-requirements=pool=a",
            "--node-filter-requirements",
        ),
    ] {
        for plan in [false, true] {
            let mut args: Vec<&str> = base.to_vec();
            args.push(flag);
            let fixture = path("fixtures/nodes/05-aws-4nodes-no-podcidr.json");
            if plan {
                args.insert(0, "plan");
                args.push(&fixture);
            }
            let out = run(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
            assert!(
                lines[0].starts_with("error: ") && lines[0].contains(names),
                "{stderr}"
            );
            assert!(out.stdout.is_empty());
        }
    }
}

/// A kcm command line pasted into `plan` gives the plan of its bare IPAM flags, and notes the
/// ignored flags on stderr.
#[test]
fn plan_accepts_the_kubeadm_command_line() {
    let fixture = path("fixtures/nodes/05-aws-4nodes-no-podcidr.json");
    let kcm = manifest_command("fixtures/commandlines/kubeadm-kube-controller-manager.yaml");
    let mut args: Vec<&str> = vec!["plan", &fixture];
    args.extend(kcm.iter().skip(1).map(String::as_str));
    let pasted = run(&args);
    let bare = run(&[
        "plan",
        "--cluster-cidr=10.244.0.0/16",
        "--service-cluster-ip-range=10.96.0.0/12",
        &fixture,
    ]);
    assert_eq!(
        pasted.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&pasted.stderr)
    );
    assert_eq!(pasted.stdout, bare.stdout);
    let stderr = String::from_utf8_lossy(&pasted.stderr);
    assert!(
        stderr.starts_with("note: ignoring 8 kube-controller-manager flags: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        bare.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
}

/// docs/kcm-flags.md's flag table is exactly the rendered table of every kcm/ccm flag.
#[test]
fn readme_flag_table_lists_every_flag() {
    let readme = std::fs::read_to_string(path("docs/kcm-flags.md")).expect("docs/kcm-flags.md");
    let begin = "<!-- kcm-flags:begin -->\n";
    let end = "<!-- kcm-flags:end -->";
    let start = readme
        .find(begin)
        .expect("docs/kcm-flags.md has the flag table markers")
        + begin.len();
    let stop = readme[start..].find(end).expect("end marker") + start;
    let table = flags::kcm::markdown_table();
    assert!(
        readme[start..stop] == table,
        "docs/kcm-flags.md's flag table is out of date; replace it with:\n{table}"
    );
    for flag in flags::kcm::KCM_FLAGS {
        let cell = if flag.name == "v" {
            "`--v`".to_owned()
        } else {
            format!("`--{}`", flag.name)
        };
        assert!(readme[start..stop].contains(&cell), "{cell}");
    }
}

/// Every implemented flag of the table is a real argument; every other one is accepted hidden.
#[test]
fn table_and_command_agree() {
    let command = flags::command();
    let longs: BTreeSet<String> = command
        .get_arguments()
        .flat_map(|a| {
            a.get_long()
                .into_iter()
                .chain(a.get_all_aliases().into_iter().flatten())
                .map(str::to_owned)
        })
        .collect();
    for flag in flags::kcm::KCM_FLAGS {
        assert!(longs.contains(flag.name), "--{} is not accepted", flag.name);
    }
}

/// The table lists every flag the command line takes, kcm's and ours (`from` = `ours`): no
/// visible argument is missing from it, and none of our own flags is ignored.
#[test]
fn every_visible_flag_is_in_the_table() {
    let command = flags::command();
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if ["help", "version"].contains(&long) {
            continue;
        }
        let flag =
            flags::kcm::lookup(long).unwrap_or_else(|| panic!("--{long} is not in the table"));
        assert!(
            matches!(flag.handling, flags::kcm::Handling::Implemented(_)),
            "--{long} is a real argument, so implemented"
        );
    }
    let ours: Vec<&str> = flags::kcm::KCM_FLAGS
        .iter()
        .filter(|f| f.source == flags::kcm::Source::Ours)
        .map(|f| f.name)
        .collect();
    assert_eq!(
        ours,
        [
            "allow-node-mask-label",
            "deleted-node-cidr-quarantine",
            "health-probe-bind-address",
            "metrics-bind-address",
            "node-cidr-mask-size-rule",
            "node-cidr-mask-size-rules-file",
            "node-cidr-update-workers",
            "node-mask-label-range",
            "node-selector",
        ]
    );
}

/// The node-pool flags follow the kcm conventions: pflag booleans, `_` in names, `--flag value`,
/// repeated rules appended in order (a repeated scalar's last value wins), and all of them global
/// so that `plan` takes them after the subcommand.
#[test]
fn node_pool_flags_take_pflag_forms() {
    let argv = |args: &[&str]| {
        std::iter::once("nodeipam-controller")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for (form, want) in [
        (&["--allow-node-mask-label"][..], true),
        (&["--allow-node-mask-label=True"], true),
        (&["--allow_node_mask_label=1"], true),
        (&["--allow-node-mask-label=t"], true),
        (&["--allow-node-mask-label=F"], false),
        (&["--allow-node-mask-label=FALSE"], false),
        (&[], false),
    ] {
        let parsed = parse(&argv(form));
        assert_eq!(parsed.cli.ipam.allow_node_mask_label, want, "{form:?}");
        assert!(parsed.ignored.is_empty(), "{form:?}");
    }
    assert!(flags::parse_from(argv(&["--allow-node-mask-label=yes"])).is_err());
    let fixture = path("fixtures/nodes/03-aks-kubenet-3nodes.json");
    let parsed = parse(&argv(&[
        "plan",
        &fixture,
        "--cidr-allocator-type",
        "CloudAllocator",
        "--node_cidr_mask_size_rule",
        "agentpool=agentpool:ipv4=23",
        "--node-cidr-mask-size-rule=kubernetes.azure.com/agentpool=small:ipv4=26",
        "--allow-node-mask-label=T",
        "--node-mask-label-range=ipv4=20-22",
        "--node_mask_label_range",
        "ipv4=22-26",
    ]));
    assert!(matches!(parsed.cli.command, Some(flags::Command::Plan(_))));
    let pools = parsed.cli.ipam.node_pools().expect("valid node-pool flags");
    let rules: Vec<&str> = pools.rules.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(
        rules,
        [
            "agentpool=agentpool:ipv4=23",
            "kubernetes.azure.com/agentpool=small:ipv4=26"
        ]
    );
    assert!(pools.allow_mask_label);
    assert_eq!(pools.label_range.ipv4, Some((22, 26)), "the last one wins");
}

#[test]
fn help_version_and_completions() {
    let help = run(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "RUST_LOG",
        "POD_NAME",
        "Exit status:",
        "2  bad flags",
        "completion bash|zsh|fish",
        "--logging-format",
        "-v, --v <LEVEL>",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
    let version = run(&["--version"]);
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        text.starts_with(&format!(
            "nodeipam-controller {} (git ",
            env!("CARGO_PKG_VERSION")
        )) && text.contains(", rustc 1."),
        "{text}"
    );
    for (shell, needle) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef nodeipam-controller"),
        ("fish", "complete -c nodeipam-controller"),
    ] {
        let out = run(&["completion", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(needle), "{shell}: {script}");
        assert!(script.contains("cluster-cidr"), "{shell}");
    }
    assert_eq!(run(&["completion", "powershell"]).status.code(), Some(2));
}

/// The controller's JSON log lines up to its first request to the API server (a plain listener of
/// the test, whose port is returned), started with `args` and `--master` naming that listener.
fn lines_before_first_request(args: &[&str]) -> (Vec<Value>, String, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let master = format!("--master=http://127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(args)
        .arg(&master)
        .env_remove("RUST_LOG")
        .env("POD_NAME", "nodeipam-test")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let (stream, _) = listener.accept().expect("the controller connects");
    let mut first = String::new();
    let mut request = BufReader::new(stream);
    let _ = request.read_line(&mut first);
    // Killed while its first request is still open: a connection closed first would let it log
    // the failed request (lines that are not "before the first request").
    let _ = child.kill();
    let output = child.wait_with_output().expect("exits");
    drop(request);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    (lines, stderr, port)
}

/// The start-up line and the ignored-flag line, as JSON with klog's field names, before the first
/// request reaches the API server.
#[test]
fn startup_line_in_json() {
    let (lines, stderr, port) = lines_before_first_request(&[
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
        "--service-cluster-ip-range=10.96.0.0/12",
        "--leader-elect=false",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=127.0.0.1:0",
        "--logging-format=json",
        "--secure-port=0",
        "--tls-min-version=VersionTLS13",
        "--profiling=false",
        "--node-selector=example.com/cni in (overlay), !legacy",
        "-v",
        "2",
    ]);
    let start = lines
        .iter()
        .find(|l| l["msg"] == "starting nodeipam-controller")
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    assert_eq!(start["v"], 0);
    assert!(start["ts"].as_f64().is_some(), "{start}");
    assert!(
        start["caller"]
            .as_str()
            .is_some_and(|c| c.contains("startup.rs:")),
        "{start}"
    );
    assert!(
        start["version"]
            .as_str()
            .is_some_and(|v| v.starts_with(env!("CARGO_PKG_VERSION"))),
        "{start}"
    );
    assert_eq!(start["allocator"], "RangeAllocator");
    assert_eq!(
        start["cluster_cidrs"],
        "10.244.0.0/16 (/24, 256 blocks), fd00:10:244::/56 (/64, 256 blocks)"
    );
    assert!(start.get("node_pool_rules").is_none(), "{start}");
    assert!(start.get("mask_labels").is_none(), "{start}");
    // Canonical form.
    assert_eq!(
        start["node_selector"],
        "example.com/cni in (overlay),!legacy"
    );
    assert_eq!(start["service_cidrs"], "10.96.0.0/12");
    assert_eq!(start["api_server"], format!("http://127.0.0.1:{port}/"));
    assert_eq!(start["kube_api_qps"], 20.0);
    assert_eq!(start["kube_api_burst"], 30);
    assert!(
        start["leader_election"]
            .as_str()
            .is_some_and(|l| l.starts_with("off")),
        "{start}"
    );
    assert_eq!(start["metrics"], "off");
    assert_eq!(start["health"], "127.0.0.1:0");
    let ignored = lines
        .iter()
        .find(|l| {
            l["msg"]
                .as_str()
                .is_some_and(|m| m.starts_with("ignoring 2 kube-controller-manager flags"))
        })
        .unwrap_or_else(|| panic!("no ignored-flag line: {stderr}"));
    let msg = ignored["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("--tls-min-version=VersionTLS13") && msg.contains("--profiling=false"),
        "{msg}"
    );
    println!("{stderr}");
}

/// With CloudAllocator the start-up line names the allocator, the rules in the order they are
/// tried, the mask labels' range and each cluster CIDR's sizes and grid; the warning about a rule
/// keyed on a label a kubelet may set follows it, with the other start-up diagnostics.
#[test]
fn startup_line_names_the_node_pools() {
    let (lines, stderr, _) = lines_before_first_request(&[
        "--cluster-cidr=10.244.0.0/16",
        "--service-cluster-ip-range=10.96.0.0/12",
        "--leader-elect=false",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--secure-port=0",
        "--logging-format=json",
        "--cidr-allocator-type=CloudAllocator",
        "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
        "--node-cidr-mask-size-rule=node-restriction.kubernetes.io/pool=small:ipv4=26",
        "--allow-node-mask-label=true",
        "--node-mask-label-range=ipv4=22-27",
    ]);
    let start = lines
        .iter()
        .position(|l| l["msg"] == "starting nodeipam-controller")
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    let line = &lines[start];
    assert_eq!(line["allocator"], "CloudAllocator");
    assert_eq!(
        line["cluster_cidrs"],
        "10.244.0.0/16 (/24, 256 blocks; sizes /22 to /27 on a /27 grid of 2048 blocks)"
    );
    assert_eq!(
        line["node_pool_rules"],
        "--node-cidr-mask-size-rule #1 \"agentpool=big:ipv4=23\"; --node-cidr-mask-size-rule #2 \"node-restriction.kubernetes.io/pool=small:ipv4=26\""
    );
    assert_eq!(line["mask_labels"], "IPv4 /22 to /27");
    let warnings: Vec<&str> = lines[start..]
        .iter()
        .filter(|l| l["level"] == "warning")
        .filter_map(|l| l["msg"].as_str())
        .collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    assert!(
        warnings[0].starts_with("--node-cidr-mask-size-rule #1 \"agentpool=big:ipv4=23\" keys on label agentpool, which a kubelet may set"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("--allow-node-mask-label: "),
        "{warnings:?}"
    );
}

fn plan_notes(file: &str, flags: &[&str], stdin: Option<&str>) -> (i32, String) {
    let fixture = path(&format!("fixtures/nodes/{file}"));
    let mut args = vec!["plan", "-o", "json"];
    args.extend_from_slice(flags);
    args.push(if stdin.is_some() { "-" } else { &fixture });
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut pipe = child.stdin.take().expect("stdin");
    let text = stdin.unwrap_or_default().to_owned();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut pipe, text.as_bytes()));
    let out = child.wait_with_output().expect("wait");
    let _ = writer.join();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each diagnostic shows in `plan` as a note (the per-Node ones name the Node).
#[test]
fn diagnostics_are_plan_notes() {
    // R05: an IPv6 /64 cluster CIDR with the default /64 mask.
    let (code, notes) = plan_notes(
        "10-minikube-single-node-no-podcidr.json",
        &["--cluster-cidr=fd00:1:2:3::/64"],
        None,
    );
    assert_eq!(code, 0, "{notes}");
    assert!(
        notes.contains(
            "note: R05: cluster CIDR fd00:1:2:3::/64 with node mask /64 holds a single block"
        ),
        "{notes}"
    );
    // R05 under CloudAllocator: the master's rule gives it a /80 of the /64 (served, exit 0),
    // and the note says what a Node of the default /64 would do.
    let (code, notes) = plan_notes(
        "10-minikube-single-node-no-podcidr.json",
        &[
            "--cluster-cidr=fd00:1:2:3::/64",
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rule=node-role.kubernetes.io/master=:ipv6=80",
        ],
        None,
    );
    assert_eq!(code, 0, "{notes}");
    assert!(
        notes.starts_with("note: R05: cluster CIDR fd00:1:2:3::/64 with node mask /64 holds a single block of the default size: Nodes that node-pool rules or mask labels size get blocks down to /80"),
        "{notes}"
    );
    assert_eq!(notes.lines().count(), 1, "{notes}");
    // R10: the k0s Node written IPv6-first, against an IPv4-first configuration.
    let (code, notes) = plan_notes(
        "12-k0s-dualstack-ipv6-primary-partial.json",
        &[
            "--cluster-cidr=10.244.0.0/16,fd00::/104",
            "--node-cidr-mask-size-ipv6=110",
            "--service-cluster-ip-range=10.96.0.0/12",
        ],
        None,
    );
    assert_eq!(code, 0, "{notes}");
    assert!(notes.contains("note: R10: Node worker-1 has podCIDRs [fd00::/110,10.244.0.0/24] in the other family order"), "{notes}");
    // R11: three IPv4-only AKS Nodes under a dual-stack configuration.
    let (code, notes) = plan_notes(
        "03-aks-kubenet-3nodes.json",
        &[
            "--cluster-cidr=10.244.0.0/16,fd00::/48",
            "--service-cluster-ip-range=10.96.0.0/12",
        ],
        None,
    );
    assert_eq!(code, 0, "{notes}");
    assert!(
        notes.contains("note: R11: 3 Nodes (aks-agentpool-11223344-vmss000000"),
        "{notes}"
    );
    assert!(
        notes.contains("will never get one from fd00::/48"),
        "{notes}"
    );
    // R13: no service range, and the cluster CIDR covers kubeadm's default service subnet.
    let (_, notes) = plan_notes(
        "05-aws-4nodes-no-podcidr.json",
        &["--cluster-cidr=10.0.0.0/8"],
        None,
    );
    assert!(notes.contains("note: R13: no --service-cluster-ip-range is given, and cluster CIDR 10.0.0.0/8 overlaps 10.96.0.0/12"), "{notes}");
    // R08: the GCE Node with its podCIDR written with host bits (the Node object is real; only
    // spec.podCIDR changes).
    let text = std::fs::read_to_string(path(
        "fixtures/nodes/22-gce-notready-single-node-podcidr.json",
    ))
    .expect("fixture");
    let mut list: Value = serde_json::from_str(&text).expect("JSON");
    list["items"][0]["spec"]["podCIDR"] = Value::from("10.244.0.2/24");
    let (code, notes) = plan_notes(
        "-",
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--service-cluster-ip-range=10.96.0.0/12",
        ],
        Some(&list.to_string()),
    );
    assert_eq!(code, 0, "{notes}");
    assert!(notes.contains("note: R08: Node kubernetes-node-861h has podCIDR \"10.244.0.2/24\", which is not canonical: the controller reserves 10.244.0.0/24"), "{notes}");
    // The node-pool warning (a rule keyed on a label a kubelet may set) is a note too, after the
    // diagnostics.
    let (code, notes) = plan_notes(
        "03-aks-kubenet-3nodes.json",
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--service-cluster-ip-range=10.96.0.0/12",
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rule=agentpool=agentpool:ipv4=23",
        ],
        None,
    );
    assert_eq!(code, 0, "{notes}");
    assert_eq!(
        notes,
        "note: --node-cidr-mask-size-rule #1 \"agentpool=agentpool:ipv4=23\" keys on label agentpool, which a kubelet may set on its own Node (the NodeRestriction admission plugin does not protect it): a compromised node can claim this rule's block size\n"
    );
}

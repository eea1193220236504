//! Tests of the command line: parsing, defaults, validation messages.

use std::net::SocketAddr;

use super::*;
use crate::node_pools::NodePools;

#[test]
fn go_durations() {
    let cases = [
        ("15s", Some(Duration::from_secs(15))),
        ("1m30s", Some(Duration::from_secs(90))),
        ("500ms", Some(Duration::from_millis(500))),
        ("1.5s", Some(Duration::from_millis(1500))),
        ("0", Some(Duration::ZERO)),
        ("2h", Some(Duration::from_secs(7200))),
        ("", None),
        ("15", None),
        ("s", None),
        ("15x", None),
        ("-1s", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_go_duration(text).ok(), want, "{text}");
    }
}

#[test]
fn mask_size_and_duration_messages_echo_what_was_meant() {
    for flag in [
        "--node-cidr-mask-size=-1",
        "--node-cidr-mask-size-ipv4=-1",
        "--node-cidr-mask-size-ipv6=129",
    ] {
        let error = Cli::try_parse_from(["nodeipam-controller", "--cluster-cidr=10.0.0.0/8", flag])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("is not a mask size: a prefix length in bits"),
            "{flag}: {error}"
        );
    }
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--cluster-cidr=10.0.0.0/8",
        "--node-cidr-mask-size-ipv6=128",
        "--leader-elect-lease-duration=0s",
    ])
    .expect("parses: the range is checked by validation");
    assert_eq!(cli.ipam.node_cidr_mask_size_ipv6, Some(128));
    let error = cli.controller.validate().err().unwrap_or_default();
    assert!(
        error.starts_with("--leader-elect-lease-duration=0s must be between 1s"),
        "{error}"
    );
}

#[test]
fn defaults_match_kube_controller_manager() {
    let cli = Cli::try_parse_from(["nodeipam-controller", "--cluster-cidr=10.244.0.0/16"])
        .expect("parses");
    assert!(cli.ipam.allocate_node_cidrs);
    assert_eq!(cli.ipam.cidr_allocator_type, RANGE_ALLOCATOR);
    assert_eq!(cli.controller.kube_api_qps, 20.0);
    assert_eq!(cli.controller.kube_api_burst, 30);
    assert!(
        cli.controller.leader_elect,
        "kube-controller-manager elects a leader by default"
    );
    assert_eq!(cli.controller.node_cidr_update_workers, 30);
    assert_eq!(
        cli.controller.leader_elect_lease_duration,
        Duration::from_secs(15)
    );
    assert_eq!(
        cli.controller.leader_elect_renew_deadline,
        Duration::from_secs(10)
    );
    assert_eq!(
        cli.controller.leader_elect_retry_period,
        Duration::from_secs(2)
    );
    assert_eq!(
        cli.controller.leader_elect_resource_namespace,
        "kube-system"
    );
    assert_eq!(
        cli.controller.leader_elect_resource_name,
        DEFAULT_LEASE_NAME
    );
}

/// `--deleted-node-cidr-quarantine` (ours): 10 s by default, a Go duration, `0` turns it off;
/// the controller's config takes it.
#[test]
fn deleted_node_cidr_quarantine_is_a_go_duration() {
    let parse = |args: &[&str]| {
        let mut all = vec!["nodeipam-controller", "--cluster-cidr=10.244.0.0/16"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|cli| cli.controller.deleted_node_cidr_quarantine)
    };
    assert_eq!(parse(&[]).unwrap(), Duration::from_secs(10));
    assert_eq!(
        parse(&["--deleted-node-cidr-quarantine=1m30s"]).unwrap(),
        Duration::from_secs(90)
    );
    assert_eq!(
        parse(&["--deleted-node-cidr-quarantine", "0"]).unwrap(),
        Duration::ZERO
    );
    assert!(parse(&["--deleted-node-cidr-quarantine=10"]).is_err());
    assert!(parse(&["--deleted-node-cidr-quarantine=-1s"]).is_err());
    assert_eq!(
        crate::controller::DEFAULT_DELETION_QUARANTINE,
        Duration::from_secs(10)
    );
}

#[test]
fn go_style_booleans() {
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--allocate-node-cidrs=false",
        "--leader-elect",
    ])
    .expect("parses");
    assert!(!cli.ipam.allocate_node_cidrs);
    assert!(cli.controller.leader_elect);
}

#[test]
fn bad_flags_are_rejected() {
    for args in [
        vec!["--cidr-allocator-type=IPAMFromCluster"],
        vec!["--node-mask-label-range=ipv4=26-23"],
        vec!["--kube-api-qps=0"],
        vec!["--kube-api-burst=0"],
        vec!["--node-cidr-mask-size=300"],
        vec!["--leader-elect-lease-duration=soon"],
        vec!["--metrics-bind-address=nowhere"],
        vec!["--node-cidr-update-workers=0"],
        vec!["--node-cidr-update-workers=lots"],
    ] {
        let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
        assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
    }
}

/// KEP-2593's type is accepted as upstream spelled it (and nothing close to it is); it keeps the
/// RangeAllocator's sizing, so the node-pool flags still need `CloudAllocator`.
#[test]
fn the_multi_cidr_allocator_type_is_accepted_with_range_allocator_sizing() {
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--cidr-allocator-type=MultiCIDRRangeAllocator",
    ])
    .expect("parses");
    assert_eq!(cli.ipam.cidr_allocator_type, MULTI_CIDR_ALLOCATOR);
    assert_eq!(
        cli.ipam.node_pools().expect("no rules"),
        NodePools::default()
    );
    let error = Cli::try_parse_from([
        "nodeipam-controller",
        "--cidr-allocator-type=MultiCIDRRangeAllocator",
        "--allow-node-mask-label",
    ])
    .expect("parses")
    .ipam
    .node_pools()
    .expect_err("needs CloudAllocator")
    .to_string();
    assert!(
        error.contains("needs --cidr-allocator-type=CloudAllocator"),
        "{error}"
    );
    for wrong in ["MultiCIDRAllocator", "multicidrrangeallocator"] {
        let argv = [
            "nodeipam-controller".to_owned(),
            format!("--cidr-allocator-type={wrong}"),
        ];
        let error = Cli::try_parse_from(argv).expect_err(wrong).to_string();
        assert!(
            error.contains("MultiCIDRRangeAllocator are supported"),
            "{error}"
        );
    }
}

#[test]
fn node_pool_flags() {
    let parse = |args: &[&str]| {
        let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
        Cli::try_parse_from(argv).expect("parses").ipam.node_pools()
    };
    let pools = parse(&[
        "--cidr-allocator-type=CloudAllocator",
        "--node-cidr-mask-size-rule",
        "kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64",
        "--node-cidr-mask-size-rule=agentpool=small:ipv4=26",
        "--allow-node-mask-label",
        "--node-mask-label-range=ipv4=22-26",
    ])
    .expect("valid");
    let texts: Vec<&str> = pools.rules.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64",
            "agentpool=small:ipv4=26"
        ]
    );
    assert!(pools.allow_mask_label);
    assert_eq!(pools.label_range.ipv4, Some((22, 26)));
    assert_eq!(
        parse(&[]).expect("no rules"),
        NodePools::default(),
        "RangeAllocator by default"
    );
    for flag in [
        "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
        "--allow-node-mask-label",
        "--node-cidr-mask-size-rules-file=/nonexistent",
    ] {
        let error = parse(&[flag])
            .expect_err("needs CloudAllocator")
            .to_string();
        assert!(
            error.contains("needs --cidr-allocator-type=CloudAllocator"),
            "{error}"
        );
    }
    let error = parse(&[
        "--cidr-allocator-type=CloudAllocator",
        "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
        "--node-cidr-mask-size-rule=agentpool",
    ])
    .expect_err("bad second rule")
    .to_string();
    assert!(
        error.starts_with("--node-cidr-mask-size-rule #2 \"agentpool\""),
        "{error}"
    );
    let error = parse(&[
        "--cidr-allocator-type=CloudAllocator",
        "--node-cidr-mask-size-rules-file=/nonexistent/rules",
    ])
    .expect_err("missing file")
    .to_string();
    assert!(error.contains("/nonexistent/rules"), "{error}");
}

/// `--leader-elect-renew-deadline`'s help says what the leader does: it renews every retry
/// period (it said the leader renewed once 5s of the 15s Lease were left).
#[test]
fn renew_deadline_help_says_when_the_leader_renews() {
    use clap::CommandFactory;
    let command = Cli::command();
    let help = command
        .get_arguments()
        .find(|a| a.get_id() == "leader_elect_renew_deadline")
        .and_then(|a| a.get_help())
        .map(ToString::to_string)
        .expect("documented flag");
    assert!(
        help.contains("renews every --leader-elect-retry-period (2s by default)"),
        "{help}"
    );
    assert!(!help.contains("5s of its 15s"), "{help}");
}

/// `--leader-elect True` (value apart) is refused naming the flag and `--leader-elect=True`;
/// it blamed `True` as a subcommand, or as `plan`'s file.
#[test]
fn boolean_value_given_apart_names_the_flag() {
    for argv in [
        vec![
            "nodeipam-controller",
            "--leader-elect",
            "True",
            "--cluster-cidr=10.0.0.0/16",
        ],
        vec!["nodeipam-controller", "plan", "--leader-elect", "True"],
        vec!["nodeipam-controller", "--allocate-node-cidrs", "false"],
    ] {
        let error = parse_from(argv.clone())
            .map(|_| ())
            .expect_err("refused")
            .to_string();
        let flag = argv
            .iter()
            .find(|a| a.starts_with("--") && !a.contains('='))
            .unwrap();
        let value = argv[argv.iter().position(|a| a == flag).unwrap() + 1];
        assert!(
            error.contains(&format!(
                "{flag} {value}: a boolean flag takes its value after '=' ({flag}={value})"
            )),
            "{argv:?}: {error}"
        );
    }
    // `=` forms, and a flag alone before another flag or `plan`'s file, are fine.
    for argv in [
        vec![
            "nodeipam-controller",
            "--leader-elect=True",
            "--cluster-cidr=10.0.0.0/16",
        ],
        vec![
            "nodeipam-controller",
            "--leader-elect",
            "--cluster-cidr=10.0.0.0/16",
        ],
        vec![
            "nodeipam-controller",
            "plan",
            "--leader-elect",
            "nodes.json",
        ],
    ] {
        assert!(parse_from(argv.clone()).is_ok(), "{argv:?}");
    }
}

/// `--controllers` that leaves nodeipam out: the message says what to change — remove the
/// entry that disables it, or add it when nothing names it (it said "remove -nodeipam" for
/// `--controllers=bootstrapsigner`, which has none).
#[test]
fn controllers_without_nodeipam_say_what_to_change() {
    let error = |controllers: &str| {
        let cli = Cli::try_parse_from(["nodeipam-controller", controllers]).expect("parses");
        cli.compat.validate(&cli.controller).expect_err("refused")
    };
    assert_eq!(
        error("--controllers=bootstrapsigner"),
        "--controllers=bootstrapsigner does not enable the node IPAM controller (nodeipam): it names neither nodeipam nor *, and this process is that controller; add nodeipam (or *) here, or leave --controllers out"
    );
    assert_eq!(
        error("--controllers=*,-node-ipam-controller"),
        "--controllers=*,-node-ipam-controller does not enable the node IPAM controller (nodeipam), and this process is that controller: remove -node-ipam-controller here (keep it on kube-controller-manager)"
    );
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--controllers=bootstrapsigner,nodeipam",
    ])
    .expect("parses");
    assert_eq!(cli.compat.validate(&cli.controller), Ok(()));
}

#[test]
fn bind_addresses() {
    assert_eq!(parse_bind_address("0"), Ok(BindAddress(None)));
    assert_eq!(
        parse_bind_address(":9090"),
        Ok(BindAddress(Some(SocketAddr::from(([0, 0, 0, 0], 9090)))))
    );
}

#[test]
fn config_errors_name_the_flag() {
    // Two IPv4 cluster CIDRs are accepted since issue 18 (kcm refuses them); two that overlap
    // are not, and the error names both.
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--cluster-cidr=10.244.0.0/16,10.244.128.0/17",
    ])
    .expect("parses");
    let err = cli
        .ipam
        .validate()
        .expect_err("two overlapping IPv4 cluster CIDRs");
    assert!(
        err.to_string()
            .contains("--cluster-cidr entries 1 (10.244.0.0/16) and 2 (10.244.128.0/17) overlap"),
        "{err}"
    );
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--cluster-cidr=10.244.0.0/16,10.245.0.0/16",
    ])
    .expect("parses");
    assert!(cli.ipam.validate().is_ok());
}

/// Issue 31, item 4: the plain, unauthenticated ports are off unless given (kcm serves metrics and
/// probes only on its secure port); given, they take the address as written.
#[test]
fn the_plain_ports_are_off_by_default() {
    let cli = Cli::try_parse_from(["nodeipam-controller"]).expect("parses");
    assert_eq!(cli.controller.metrics_bind_address, BindAddress(None));
    assert_eq!(cli.controller.health_probe_bind_address, BindAddress(None));
    let cli = Cli::try_parse_from([
        "nodeipam-controller",
        "--metrics-bind-address=127.0.0.1:8080",
        "--health-probe-bind-address=:8081",
    ])
    .expect("parses");
    let loopback: SocketAddr = "127.0.0.1:8080".parse().expect("address");
    let every: SocketAddr = "0.0.0.0:8081".parse().expect("address");
    assert_eq!(
        cli.controller.metrics_bind_address,
        BindAddress(Some(loopback))
    );
    assert_eq!(
        cli.controller.health_probe_bind_address,
        BindAddress(Some(every))
    );
}

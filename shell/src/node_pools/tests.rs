#![allow(clippy::unwrap_used)]

use super::*;

fn flag(index: usize) -> RuleOrigin {
    RuleOrigin::Flag { index }
}

fn rule(text: &str) -> MaskRule {
    MaskRule::parse(text, flag(1)).unwrap()
}

fn config(cluster: &str, masks: (Option<u8>, Option<u8>, Option<u8>)) -> IpamConfig {
    nodeipam_core::config::validate(
        cluster,
        "",
        nodeipam_core::NodeMaskFlags {
            node_cidr_mask_size: masks.0,
            node_cidr_mask_size_ipv4: masks.1,
            node_cidr_mask_size_ipv6: masks.2,
        },
    )
    .unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The labels of the AKS fixture's Nodes (`fixtures/nodes/03-aks-kubenet-3nodes.json`).
fn aks_labels() -> BTreeMap<String, String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/nodes/03-aks-kubenet-3nodes.json"
    );
    let list: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::from_value(list["items"][0]["metadata"]["labels"].clone()).unwrap()
}

#[test]
fn rule_syntax_accepts_the_documented_forms() {
    /// Text → (key, value, ipv4, ipv6).
    type Case = (
        &'static str,
        (&'static str, &'static str, Option<u8>, Option<u8>),
    );
    let cases: &[Case] = &[
        (
            "kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64",
            (
                "kubernetes.azure.com/agentpool",
                "bigpool",
                Some(23),
                Some(64),
            ),
        ),
        (
            "agentpool=agentpool:ipv4=26",
            ("agentpool", "agentpool", Some(26), None),
        ),
        (
            "  eks.amazonaws.com/nodegroup=gpu:ipv6=60  ",
            ("eks.amazonaws.com/nodegroup", "gpu", None, Some(60)),
        ),
        (
            "node-role.kubernetes.io/agent=:ipv6=62,ipv4=25",
            ("node-role.kubernetes.io/agent", "", Some(25), Some(62)),
        ),
        (
            "node-restriction.kubernetes.io/pool=Big_1.x:ipv4=0",
            (
                "node-restriction.kubernetes.io/pool",
                "Big_1.x",
                Some(0),
                None,
            ),
        ),
    ];
    for (text, (key, value, ipv4, ipv6)) in cases {
        let got = rule(text);
        assert_eq!(
            (
                got.label_key.as_str(),
                got.label_value.as_str(),
                got.ipv4,
                got.ipv6
            ),
            (*key, *value, *ipv4, *ipv6),
            "{text}"
        );
        assert_eq!(got.text, text.trim());
    }
}

#[test]
fn rule_syntax_errors_name_the_rule_and_the_fault() {
    let cases: &[(&str, &str)] = &[
        ("agentpool=big", "no ':' found"),
        ("agentpool:ipv4=23", "no '=' found"),
        ("agentpool=big:", "expected ipv4=N and/or ipv6=M"),
        ("agentpool=big:ipv4", "is not ipv4=N or ipv6=M"),
        ("agentpool=big:ipv5=23", "\"ipv5\" is not a family"),
        ("agentpool=big:ipv4=23,ipv4=24", "ipv4 is given twice"),
        ("agentpool=big:ipv4=x", "is not a mask size"),
        ("agentpool=big:ipv4=-1", "is not a mask size"),
        ("agentpool=big:ipv4=129", "is not a mask size"),
        ("agentpool=big:ipv4=0023", "is not a mask size"),
        (
            "=big:ipv4=23",
            "invalid label key \"\": name part must be non-empty",
        ),
        (
            "Bad_Prefix/x=big:ipv4=23",
            "prefix part must be a lowercase DNS subdomain",
        ),
        ("/x=big:ipv4=23", "prefix part must be non-empty"),
        ("a/=big:ipv4=23", "name part must be non-empty"),
        (
            "-pool=big:ipv4=23",
            "must start and end with an alphanumeric",
        ),
        ("pool=big!:ipv4=23", "invalid label value \"big!\""),
        ("pool=a b:ipv4=23", "invalid label value \"a b\""),
    ];
    for (text, fault) in cases {
        let error = MaskRule::parse(text, flag(3)).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "--node-cidr-mask-size-rule #3 {:?}: ",
                text.trim()
            )),
            "{error}"
        );
        assert!(error.contains(fault), "{text}: {error} lacks {fault:?}");
    }
    let long = format!("{}=v:ipv4=23", "a".repeat(64));
    assert!(
        MaskRule::parse(&long, flag(1))
            .unwrap_err()
            .to_string()
            .contains("must be no more than 63 characters")
    );
}

#[test]
fn rules_file_keeps_order_skips_comments_and_names_the_line() {
    let path = Path::new("/etc/nodeipam/rules");
    let text = "# node pools\n\nagentpool=big:ipv4=23\n   # indented comment\n  agentpool=small:ipv4=26  \n";
    let rules = parse_rules_file(path, text).unwrap();
    let got: Vec<(&str, usize)> = rules
        .iter()
        .map(|r| match &r.origin {
            RuleOrigin::File { line, .. } => (r.text.as_str(), *line),
            RuleOrigin::Flag { .. } => ("flag?", 0),
        })
        .collect();
    assert_eq!(
        got,
        [("agentpool=big:ipv4=23", 3), ("agentpool=small:ipv4=26", 5)]
    );
    let error = parse_rules_file(path, "agentpool=big:ipv4=23\nagentpool=small\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(
            "--node-cidr-mask-size-rules-file /etc/nodeipam/rules line 2 \"agentpool=small\":"
        ),
        "{error}"
    );
    assert_eq!(parse_rules_file(path, "\n# nothing\n").unwrap(), []);
}

#[test]
fn label_range_syntax() {
    assert_eq!(
        LabelRange::parse("ipv4=23-26,ipv6=56-64").unwrap(),
        LabelRange {
            ipv4: Some((23, 26)),
            ipv6: Some((56, 64))
        }
    );
    assert_eq!(
        LabelRange::parse("ipv6=64-64").unwrap(),
        LabelRange {
            ipv4: None,
            ipv6: Some((64, 64))
        }
    );
    for (text, fault) in [
        ("ipv4=26-23", "must not be finer"),
        ("ipv4=23", "is not MIN-MAX"),
        ("", "expected ipv4=N"),
        ("ipv4=23-x", "not a mask size"),
    ] {
        let error = LabelRange::parse(text).unwrap_err();
        assert!(error.contains(fault), "{text}: {error}");
    }
}

/// The grid is the finest configured size, the coarsest the largest block; errors name the rule.
#[test]
fn sizing_fixes_the_grid_and_checks_every_mask() {
    let v4 = config("10.244.0.0/16", (None, None, None));
    let pools = NodePools {
        rules: vec![
            MaskRule::parse("agentpool=big:ipv4=23", flag(1)).unwrap(),
            MaskRule::parse("agentpool=small:ipv4=26", flag(2)).unwrap(),
        ],
        ..NodePools::default()
    };
    let sizing = pools.sizing(&v4).unwrap();
    assert_eq!(
        sizing.sets(),
        [SetSizing {
            cluster_cidr: "10.244.0.0/16".parse().unwrap(),
            default_mask: 24,
            grid_mask: 26,
            coarsest_mask: 23,
            label_range: None,
        }]
    );
    // Without rules: the range allocator's sizing.
    assert_eq!(
        NodePools::default().sizing(&v4).unwrap(),
        Sizing::range_allocator(&v4)
    );
    let bad = |text: &str, index: usize| NodePools {
        rules: vec![MaskRule::parse(text, flag(index)).unwrap()],
        ..NodePools::default()
    };
    let cases: &[(NodePools, &IpamConfig, &str)] = &[
        (
            bad("agentpool=big:ipv4=15", 2),
            &v4,
            "--node-cidr-mask-size-rule #2 \"agentpool=big:ipv4=15\": /15 does not fit cluster CIDR 10.244.0.0/16: a node CIDR mask size must be between 16 and 32",
        ),
        (
            bad("agentpool=big:ipv4=33", 1),
            &v4,
            "/33 does not fit cluster CIDR 10.244.0.0/16",
        ),
        (
            bad("agentpool=big:ipv6=64", 1),
            &v4,
            "--node-cidr-mask-size-rule #1 \"agentpool=big:ipv6=64\" sets an IPv6 size but no IPv6 --cluster-cidr is configured",
        ),
        (
            NodePools {
                label_range: LabelRange {
                    ipv4: Some((23, 26)),
                    ipv6: None,
                },
                ..NodePools::default()
            },
            &v4,
            "--node-mask-label-range has no effect without --allow-node-mask-label",
        ),
        (
            NodePools {
                allow_mask_label: true,
                label_range: LabelRange {
                    ipv4: Some((12, 26)),
                    ipv6: None,
                },
                ..NodePools::default()
            },
            &v4,
            "--node-mask-label-range: /12 does not fit",
        ),
    ];
    for (pools, config, want) in cases {
        let error = pools.sizing(config).unwrap_err().to_string();
        assert!(error.contains(want), "{error}\n  lacks {want}");
    }
    // The finest grid for an IPv6 /40 is /64 (2^24 blocks): /65 is refused.
    let v6 = config("fd00::/40", (None, None, None));
    let error = bad("pool=x:ipv6=65", 1)
        .sizing(&v6)
        .unwrap_err()
        .to_string();
    assert!(error.contains("between 40 and 64"), "{error}");
}

#[test]
fn resolve_label_then_first_matching_rule_then_default() {
    let dual = config("10.244.0.0/16,fd00:10:244::/56", (None, None, None));
    let pools = NodePools {
        rules: vec![
            MaskRule::parse("kubernetes.azure.com/agentpool=big:ipv4=23", flag(1)).unwrap(),
            MaskRule::parse("agentpool=agentpool:ipv4=25,ipv6=62", flag(2)).unwrap(),
            MaskRule::parse("agentpool=agentpool:ipv4=26", flag(3)).unwrap(),
        ],
        allow_mask_label: true,
        label_range: LabelRange {
            ipv4: Some((22, 26)),
            ipv6: None,
        },
        ..NodePools::default()
    };
    let sizing = pools.sizing(&dual).unwrap();
    assert_eq!(
        (sizing.sets()[0].grid_mask, sizing.sets()[1].grid_mask),
        (26, 64)
    );
    // The IPv6 label range defaults to the configured sizes: /62 … /64.
    assert_eq!(sizing.sets()[1].label_range, Some((62, 64)));
    let masks = |l: &BTreeMap<String, String>| {
        sizing
            .resolve(l)
            .unwrap()
            .iter()
            .map(|m| (m.prefix_len, m.source))
            .collect::<Vec<_>>()
    };
    // The AKS fixture's Nodes carry agentpool=agentpool: rule 2 (index 1), not rule 3.
    assert_eq!(
        masks(&aks_labels()),
        [(25, MaskSource::Rule(1)), (62, MaskSource::Rule(1))]
    );
    // Rule 1 names only IPv4: IPv6 gets the default, not a later rule's size.
    assert_eq!(
        masks(&labels(&[
            ("kubernetes.azure.com/agentpool", "big"),
            ("agentpool", "agentpool")
        ])),
        [(23, MaskSource::Rule(0)), (64, MaskSource::Default)]
    );
    assert_eq!(
        masks(&labels(&[("agentpool", "other")])),
        [(24, MaskSource::Default), (64, MaskSource::Default)]
    );
    // A label wins over the rules, per family.
    assert_eq!(
        masks(&labels(&[
            ("agentpool", "agentpool"),
            (MASK_LABEL_IPV4, "22")
        ])),
        [(22, MaskSource::Label), (62, MaskSource::Rule(1))]
    );
    let refused = [
        (
            MASK_LABEL_IPV4,
            "21",
            LabelError::OutOfRange {
                label: MASK_LABEL_IPV4,
                value: 21,
                min: 22,
                max: 26,
            },
        ),
        (
            MASK_LABEL_IPV6,
            "56",
            LabelError::OutOfRange {
                label: MASK_LABEL_IPV6,
                value: 56,
                min: 62,
                max: 64,
            },
        ),
        (
            MASK_LABEL_IPV4,
            "big",
            LabelError::NotANumber {
                label: MASK_LABEL_IPV4,
                value: "big".to_owned(),
            },
        ),
    ];
    for (key, value, want) in refused {
        assert_eq!(sizing.resolve(&labels(&[(key, value)])), Err(want));
    }
    // Without --allow-node-mask-label the labels are ignored.
    let no_labels = NodePools {
        allow_mask_label: false,
        label_range: LabelRange::default(),
        ..pools.clone()
    }
    .sizing(&dual)
    .unwrap();
    assert_eq!(
        no_labels.resolve(&labels(&[(MASK_LABEL_IPV4, "nonsense")])),
        Ok(vec![
            NodeMask {
                prefix_len: 24,
                source: MaskSource::Default
            },
            NodeMask {
                prefix_len: 64,
                source: MaskSource::Default
            }
        ])
    );
    assert_eq!(
        sizing.label_keys(),
        [
            "agentpool",
            "kubernetes.azure.com/agentpool",
            MASK_LABEL_IPV4,
            MASK_LABEL_IPV6
        ]
    );
    assert_eq!(
        no_labels.label_keys(),
        ["agentpool", "kubernetes.azure.com/agentpool"]
    );
}

/// NodeRestriction's rule, by example (admission.go `getForbiddenLabels`, `IsKubeletLabel`).
#[test]
fn which_labels_a_kubelet_may_set() {
    let cases = [
        ("agentpool", true),
        ("kubernetes.azure.com/agentpool", true),
        ("eks.amazonaws.com/nodegroup", true),
        ("cloud.google.com/gke-nodepool", true),
        (MASK_LABEL_IPV4, true),
        ("node.kubernetes.io/instance-type", true),
        ("kubernetes.io/hostname", true),
        ("topology.kubernetes.io/zone", true),
        ("pool.kubelet.kubernetes.io/x", true),
        ("node-restriction.kubernetes.io/pool", false),
        ("example.node-restriction.kubernetes.io/pool", false),
        ("node-role.kubernetes.io/agent", false),
        ("kubernetes.io/role", false),
        ("example.k8s.io/pool", false),
    ];
    for (key, want) in cases {
        assert_eq!(kubelet_may_set(key), want, "{key}");
    }
    let pools = NodePools {
        rules: vec![
            MaskRule::parse("node-restriction.kubernetes.io/pool=big:ipv4=23", flag(1)).unwrap(),
            MaskRule::parse("agentpool=big:ipv4=23", flag(2)).unwrap(),
        ],
        ..NodePools::default()
    };
    let warnings = pools
        .sizing(&config("10.244.0.0/16", (None, None, None)))
        .unwrap()
        .warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("--node-cidr-mask-size-rule #2"),
        "{warnings:?}"
    );
}

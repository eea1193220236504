//! Tests of ClusterCIDR reading, node selector matching and KEP-2593's serving order.

use serde_json::{Value, json};

use super::*;

fn object(name: &str, spec: Value) -> ClusterCidrObject {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("parses")
}

fn pool(name: &str, spec: Value) -> ClusterCidrPool {
    ClusterCidrPool::from_object(&object(name, spec)).expect("a valid ClusterCIDR")
}

/// The Nodes of a real fixture: `(name, labels)`.
fn fixture_nodes(file: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
    let list: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["metadata"]["name"].as_str().unwrap().to_owned(),
                serde_json::from_value(n["metadata"]["labels"].clone()).unwrap(),
            )
        })
        .collect()
}

fn names(order: &[PoolChoice<'_>]) -> Vec<String> {
    order
        .iter()
        .map(|c| match c {
            PoolChoice::ClusterCidr(p) => p.name.clone(),
            PoolChoice::Flags => "--cluster-cidr".to_owned(),
        })
        .collect()
}

fn selector(expressions: Value) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": expressions}]})
}

#[test]
fn the_crds_valid_objects_are_pools() {
    // The objects the real kube-apiserver stores (real_apiserver's crd test).
    let v4 = pool(
        "v4-only",
        json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16"}),
    );
    assert_eq!(
        (v4.ipv4, v4.ipv6, v4.block_count()),
        (Some("10.245.0.0/16".parse().unwrap()), None, 256)
    );
    let v6 = pool(
        "v6-only",
        json!({"perNodeHostBits": 64, "ipv6": "fd00:10:245::/48"}),
    );
    assert_eq!(v6.block_count(), 65_536);
    let dual = pool(
        "dual",
        json!({"perNodeHostBits": 6, "ipv4": "10.246.0.0/20", "ipv6": "fd00:10:246::/104",
               "nodeSelector": selector(json!([{"key": "kubernetes.azure.com/mode", "operator": "Exists"}]))}),
    );
    // 2^(32-6-20) = 64 IPv4 blocks, 2^(128-6-104) = 2^18 IPv6 blocks: the smaller counts.
    assert_eq!(dual.block_count(), 64);
    assert_eq!(
        dual.node_mask_size(dual.ipv4.unwrap()),
        26,
        "6 host bits: /26 blocks"
    );
    assert!(dual.has_selector() && !v4.has_selector());
    let widest = pool(
        "2-to-the-24",
        json!({"perNodeHostBits": 4, "ipv4": "16.0.0.0/4"}),
    );
    assert_eq!(widest.block_count(), 1 << 24);
}

#[test]
fn what_the_crd_refuses_the_controller_refuses_too() {
    let cases = [
        json!({"perNodeHostBits": 8}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.1/16"}),
        json!({"perNodeHostBits": 8, "ipv4": "010.247.0.0/16"}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0"}),
        json!({"perNodeHostBits": 8, "ipv4": "fd00::/64"}),
        json!({"perNodeHostBits": 8, "ipv6": "10.0.0.0/8"}),
        json!({"perNodeHostBits": 8, "ipv6": "::ffff:10.0.0.0/104"}),
        json!({"perNodeHostBits": 3, "ipv4": "10.247.0.0/16"}),
        json!({"ipv4": "10.247.0.0/16"}),
        json!({"perNodeHostBits": 9, "ipv4": "10.247.0.0/24"}),
        json!({"perNodeHostBits": 80, "ipv6": "fd00::/64"}),
        json!({"perNodeHostBits": 4, "ipv4": "32.0.0.0/3"}),
        json!({"perNodeHostBits": 64, "ipv6": "fd00::/39"}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": selector(json!([{"key": "a", "operator": "In"}]))}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": selector(json!([{"key": "a", "operator": "Matches", "values": ["x"]}]))}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": selector(json!([{"key": "a", "operator": "Exists", "values": ["x"]}]))}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": selector(json!([{"key": "a", "operator": "Gt", "values": ["ten"]}]))}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": selector(json!([{"key": "-bad-", "operator": "Exists"}]))}),
        json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16",
               "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}]}}),
    ];
    for spec in cases {
        let refused = ClusterCidrPool::from_object(&object("p", spec.clone()));
        let message = refused.as_ref().map_err(ToString::to_string);
        assert!(refused.is_err(), "{spec}: accepted");
        assert!(!message.unwrap_err().is_empty(), "{spec}");
    }
}

#[test]
fn node_selectors_read_as_the_scheduler_reads_them() {
    let aks = fixture_nodes("03-aks-kubenet-3nodes.json");
    let (name, labels) = &aks[0];
    let agentpool = labels
        .get("agentpool")
        .expect("this AKS fixture names its agent pool in the label agentpool")
        .clone();
    let matches = |spec_selector: Value| {
        pool(
            "p",
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16", "nodeSelector": spec_selector}),
        )
        .matching_requirements(labels, name)
    };
    let requirement = |key: &str, operator: &str, values: &[&str]| json!({"key": key, "operator": operator, "values": values});
    let exists = |key: &str| json!({"key": key, "operator": "Exists"});
    assert_eq!(
        matches(selector(json!([requirement(
            "agentpool",
            "In",
            &[&agentpool]
        )]))),
        Some(1)
    );
    assert_eq!(
        matches(selector(json!([
            requirement("agentpool", "In", &[&agentpool]),
            exists("kubernetes.io/os"),
            requirement("no-such-label", "NotIn", &["x"]),
            json!({"key": "no-such-label", "operator": "DoesNotExist"}),
        ]))),
        Some(4),
        "NotIn and DoesNotExist hold for an absent label"
    );
    assert_eq!(
        matches(selector(json!([requirement(
            "agentpool",
            "NotIn",
            &[&agentpool]
        ),]))),
        None
    );
    // Terms are ORed (upstream's allocator ANDed them: #116419); the count is the best term's.
    let terms = json!({"nodeSelectorTerms": [
        {"matchExpressions": [exists("no-such-label")]},
        {"matchExpressions": [exists("kubernetes.io/os"), exists("kubernetes.io/arch")]},
        {"matchExpressions": [exists("kubernetes.io/os")]},
    ]});
    assert_eq!(matches(terms), Some(2));
    assert_eq!(
        matches(json!({"nodeSelectorTerms": [{}]})),
        None,
        "an empty term matches nothing"
    );
    assert_eq!(matches(json!({"nodeSelectorTerms": []})), None);
    let by_name = json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [name]}]}]});
    assert_eq!(matches(by_name), Some(1));
    let numeric = |operator: &str, bound: &str| {
        let mut with_pods = labels.clone();
        with_pods.insert("example.com/max-pods".into(), "110".into());
        pool(
            "p",
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16",
                   "nodeSelector": selector(json!([requirement("example.com/max-pods", operator, &[bound])]))}),
        )
        .matching_requirements(&with_pods, name)
    };
    assert_eq!(numeric("Gt", "100"), Some(1));
    assert_eq!(numeric("Gt", "110"), None);
    assert_eq!(numeric("Lt", "111"), Some(1));
}

#[test]
fn kep_2593_order_most_requirements_fewest_blocks_smaller_blocks_then_name() {
    let nodes = fixture_nodes("03-aks-kubenet-3nodes.json");
    let (name, labels) = &nodes[0];
    let os = json!({"key": "kubernetes.io/os", "operator": "Exists"});
    let arch = json!({"key": "kubernetes.io/arch", "operator": "Exists"});
    let pools = vec![
        // Fallbacks (no selector): the smaller one first, after the flag CIDRs.
        pool(
            "fallback-big",
            json!({"perNodeHostBits": 8, "ipv4": "10.250.0.0/16"}),
        ),
        pool(
            "fallback-small",
            json!({"perNodeHostBits": 8, "ipv4": "10.251.0.0/20"}),
        ),
        // One requirement, 256 blocks of /24.
        pool(
            "one-wide",
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16", "nodeSelector": selector(json!([os]))}),
        ),
        // One requirement, 16 blocks: fewer blocks first.
        pool(
            "one-narrow",
            json!({"perNodeHostBits": 8, "ipv4": "10.246.0.0/20", "nodeSelector": selector(json!([os]))}),
        ),
        // One requirement, 16 blocks of /26: the same count, smaller blocks first.
        pool(
            "one-narrow-small",
            json!({"perNodeHostBits": 6, "ipv4": "10.246.16.0/22", "nodeSelector": selector(json!([os]))}),
        ),
        // The same again under another name: the name breaks the tie.
        pool(
            "a-one-narrow-small",
            json!({"perNodeHostBits": 6, "ipv4": "10.246.32.0/22", "nodeSelector": selector(json!([os]))}),
        ),
        // Two requirements: first, whatever its size.
        pool(
            "two",
            json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16", "nodeSelector": selector(json!([os, arch]))}),
        ),
        // Not matching: never tried.
        pool(
            "other",
            json!({"perNodeHostBits": 8, "ipv4": "10.248.0.0/16",
                              "nodeSelector": selector(json!([{"key": "no-such-label", "operator": "Exists"}]))}),
        ),
    ];
    assert_eq!(
        names(&serving_order(&pools, labels, name)),
        [
            "two",
            "a-one-narrow-small",
            "one-narrow-small",
            "one-narrow",
            "one-wide",
            "--cluster-cidr",
            "fallback-small",
            "fallback-big",
        ]
    );
    // A pool being deleted serves no new Node.
    let mut deleting = pools.clone();
    deleting[6].deleting = true;
    deleting[0].deleting = true;
    let order = names(&serving_order(&deleting, labels, name));
    assert!(!order.contains(&"two".to_owned()) && !order.contains(&"fallback-big".to_owned()));
    // No ClusterCIDR at all: only the flag CIDRs, exactly as without the feature.
    assert_eq!(names(&serving_order(&[], labels, name)), ["--cluster-cidr"]);
}

#[test]
fn every_fixture_node_gets_a_deterministic_order() {
    let pools = vec![
        pool(
            "linux",
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16",
                             "nodeSelector": selector(json!([{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]))}),
        ),
        pool(
            "spare",
            json!({"perNodeHostBits": 8, "ipv4": "10.250.0.0/16"}),
        ),
    ];
    let mut reversed = pools.clone();
    reversed.reverse();
    for file in [
        "01-k3s-single-node-flannel-hostgw.json",
        "03-aks-kubenet-3nodes.json",
        "05-aws-4nodes-no-podcidr.json",
        "07-eks-2nodes-no-podcidr.json",
        "20-gke-preemptible-single-node-podcidr.json",
    ] {
        for (name, labels) in fixture_nodes(file) {
            let order = names(&serving_order(&pools, &labels, &name));
            assert_eq!(
                order,
                names(&serving_order(&reversed, &labels, &name)),
                "{file} {name}"
            );
            let linux = labels.get("kubernetes.io/os").map(String::as_str) == Some("linux");
            let expected: &[&str] = if linux {
                &["linux", "--cluster-cidr", "spare"]
            } else {
                &["--cluster-cidr", "spare"]
            };
            assert_eq!(order, expected, "{file} {name}");
        }
    }
}

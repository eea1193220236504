//! Issue 32 item 1 (chaos seed 41789, made deterministic): the finalizer of a ClusterCIDR being
//! deleted must not come off while a Node holds a block inside its ranges, however late its
//! removal commits.
//!
//! `pool-2` and `pool-3` have identical ranges (`10.120.0.0/20`, /24 blocks), selectors `grp=a` and
//! `grp=b`; `pool-3` holds nothing. Its PATCHes are held 1.5 s by the sandbox before they are
//! applied (`delayMs`, within the 2 s request timeout; on a real server API Priority and Fairness
//! queueing or a slow etcd does the same). `pool-3` is deleted and, once the request that removes
//! its finalizer has arrived (decided on 0 holders), 12 `grp=a` Nodes arrive 50 ms apart: `pool-2`
//! serves them, inside `pool-3`'s range. A commit observer keeps every Node's podCIDRs in commit
//! order and, at the commit that takes `pool-3`'s finalizer off, counts the Nodes holding a block
//! inside `10.120.0.0/20`: it must be 0 (the Nodes wait for the removal's outcome).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nodeipam_tests::sandbox::{
    ChangeType, Commit, FaultAction, FaultRule, LateAnswer, LateWriteOutcome, Resource, Sandbox,
    Verb,
};
use serde_json::{Value, json};

use super::common::{
    WAIT, cluster_cidr_writer_passed, create_cluster_cidr, delete_cluster_cidr, has_finalizer,
    init_tracing, node_like, spawn, template_node, wait_cluster_cidr, with_cluster_cidrs,
};

/// What the observer saw: each Node's podCIDRs now, and the holders counted at each commit that
/// removed `pool-3`'s finalizer.
#[derive(Debug, Default)]
struct Seen {
    pod_cidrs: BTreeMap<String, Vec<String>>,
    holders_at_removal: Vec<Vec<String>>,
}

/// Whether `cidr` (text) lies inside `10.120.0.0/20`.
fn inside_pool_range(cidr: &str) -> bool {
    let Some((addr, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(addr), Ok(len)) = (addr.parse::<std::net::Ipv4Addr>(), len.parse::<u8>()) else {
        return false;
    };
    len >= 20 && u32::from(addr) & 0xffff_f000 == u32::from(std::net::Ipv4Addr::new(10, 120, 0, 0))
}

fn observe(seen: &Mutex<Seen>, commit: &Commit<'_>) {
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    match commit.resource {
        Resource::Nodes => {
            let name = commit.key.name.clone();
            if commit.change == ChangeType::Deleted {
                seen.pod_cidrs.remove(&name);
            } else {
                let cidrs = commit.after["spec"]["podCIDRs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(str::to_owned))
                    .collect();
                seen.pod_cidrs.insert(name, cidrs);
            }
        }
        Resource::ClusterCidrs if commit.key.name == "pool-3" => {
            let had = has_finalizer(commit.before);
            let has = commit.change != ChangeType::Deleted && has_finalizer(Some(commit.after));
            if had && !has {
                let holders = seen
                    .pod_cidrs
                    .iter()
                    .filter(|(_, cidrs)| cidrs.iter().any(|c| inside_pool_range(c)))
                    .map(|(name, _)| name.clone())
                    .collect();
                seen.holders_at_removal.push(holders);
            }
        }
        _ => {}
    }
}

/// Whether a logged request body is a JSON patch that sets `metadata.finalizers` without ours.
fn removes_finalizer(body: Option<&Value>) -> bool {
    body.and_then(Value::as_array).is_some_and(|ops| {
        ops.iter().any(|op| {
            op["path"] == "/metadata/finalizers"
                && op["value"].as_array().is_some_and(|f| {
                    !f.iter()
                        .any(|f| f == nodeipam::controller::cluster_cidrs::FINALIZER)
                })
        })
    })
}

fn pool(selector: &str) -> Value {
    json!({
        "ipv4": "10.120.0.0/20",
        "perNodeHostBits": 8,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "grp", "operator": "In", "values": [selector]}
        ]}]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_removal_answered_late_never_commits_while_a_node_holds_a_block_of_its_range() {
    init_tracing();
    let sb = Sandbox::start(Value::Null).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let observer = {
        let seen = seen.clone();
        sb.on_commit(Arc::new(move |commit: &Commit<'_>| observe(&seen, commit)))
    };
    create_cluster_cidr(&sb, "pool-2", pool("a")).await;
    create_cluster_cidr(&sb, "pool-3", pool("b")).await;
    let running = spawn(&sb, with_cluster_cidrs("10.10.0.0/16", None));
    running.wait_allocating(&sb).await;
    for name in ["pool-2", "pool-3"] {
        assert!(
            wait_cluster_cidr(&sb, name, has_finalizer).await,
            "{name} got no finalizer"
        );
    }
    // Every write to pool-3 from now on is applied 800 ms after it arrives.
    sb.inject(FaultRule {
        verb: Some(Verb::Patch),
        resource: Some(Resource::ClusterCidrs),
        name: Some("pool-3".to_owned()),
        times: 1000,
        action: FaultAction::Delay(Duration::from_millis(1500)),
    });
    delete_cluster_cidr(&sb, "pool-3").await;
    // The removal decided (no Node holds a block yet) and on its way: the Nodes come now.
    assert!(
        sb.wait_until(WAIT, |sb| sb
            .requests_of(Verb::Patch, Resource::ClusterCidrs)
            .iter()
            .any(
                |r| r.name.as_deref() == Some("pool-3") && removes_finalizer(r.body.as_ref())
            ))
        .await,
        "pool-3's finalizer removal was never sent"
    );
    let template = template_node("05-aws-4nodes-no-podcidr.json");
    for i in 0..12 {
        let mut node = node_like(&template, &format!("grp-a-{i:02}"));
        node["metadata"]["labels"]["grp"] = json!("a");
        sb.create_node(node).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The removal was decided on 0 holders and is on its way: it commits (whether the Nodes
    // waited for it or not), and then the Nodes are served from pool-2.
    assert!(
        wait_cluster_cidr(&sb, "pool-3", |o| o.is_none()).await,
        "pool-3's finalizer removal never committed"
    );
    let served = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        sb.nodes()
            .iter()
            .filter(|n| {
                n["spec"]["podCIDRs"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty())
            })
            .count()
    };
    assert!(
        sb.wait_until(WAIT, |sb| served(sb) == 12).await,
        "every grp=a Node is served from pool-2 ({} are)",
        served(&sb)
    );
    sb.remove_commit_observer(observer);
    let _ = running.stop().await;
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(seen.holders_at_removal.len(), 1, "{seen:?}");
    assert_eq!(
        seen.holders_at_removal,
        [Vec::<String>::new()],
        "pool-3's finalizer came off while these Nodes held a block of its range"
    );
}

/// The same race past the client's deadline: `pool-3`'s removal (decided on 0 holders, its
/// last holder just deleted) is answered 504 after 100 ms and committed 4 s after it arrived
/// (a sandbox late write: the request timeout is 2 s), and every later PATCH of `pool-3` gets a
/// 500 (so no other write of ours changes its `resourceVersion` by chance). The 12 `grp=a` Nodes
/// that arrive meanwhile must not get blocks of its range before that late commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_whose_answer_was_lost_never_commits_while_a_node_holds_a_block_of_its_range() {
    init_tracing();
    let sb = Sandbox::start(Value::Null).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let observer = {
        let seen = seen.clone();
        sb.on_commit(Arc::new(move |commit: &Commit<'_>| observe(&seen, commit)))
    };
    create_cluster_cidr(&sb, "pool-2", pool("a")).await;
    create_cluster_cidr(&sb, "pool-3", pool("b")).await;
    let running = spawn(&sb, with_cluster_cidrs("10.10.0.0/16", None));
    running.wait_allocating(&sb).await;
    assert!(wait_cluster_cidr(&sb, "pool-3", has_finalizer).await);
    // One Node holds a block of pool-3, so its deletion waits.
    let template = template_node("05-aws-4nodes-no-podcidr.json");
    let mut holder = node_like(&template, "grp-b-holder");
    holder["metadata"]["labels"]["grp"] = json!("b");
    sb.create_node(holder).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| sb.node("grp-b-holder").is_some_and(|n| {
            n["spec"]["podCIDRs"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
        }))
        .await
    );
    delete_cluster_cidr(&sb, "pool-3").await;
    // Everything the controller wanted to write to pool-3 as deleted and held has been answered.
    cluster_cidr_writer_passed(&sb, "pool-9", "10.130.0.0/24").await;
    sb.inject(FaultRule {
        verb: Some(Verb::Patch),
        resource: Some(Resource::ClusterCidrs),
        name: Some("pool-3".to_owned()),
        times: 1,
        action: FaultAction::LateWrite {
            commit_after: Duration::from_secs(4),
            answer: LateAnswer::Timeout {
                after: Duration::from_millis(100),
            },
        },
    });
    sb.inject(FaultRule {
        verb: Some(Verb::Patch),
        resource: Some(Resource::ClusterCidrs),
        name: Some("pool-3".to_owned()),
        times: 1000,
        action: FaultAction::Status(500),
    });
    sb.delete_node("grp-b-holder").unwrap();
    let removal = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        sb.requests_of(Verb::Patch, Resource::ClusterCidrs)
            .into_iter()
            .find(|r| r.name.as_deref() == Some("pool-3") && removes_finalizer(r.body.as_ref()))
    };
    assert!(
        sb.wait_until(WAIT, |sb| removal(sb).is_some()).await,
        "pool-3's finalizer removal was never sent"
    );
    for i in 0..12 {
        let mut node = node_like(&template, &format!("grp-a-{i:02}"));
        node["metadata"]["labels"]["grp"] = json!("a");
        sb.create_node(node).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The late removal has run (its commit, or its refusal).
    assert!(
        sb.wait_until(WAIT, |sb| removal(sb).is_some_and(|r| !matches!(
            r.late_write,
            None | Some(LateWriteOutcome::Pending)
        )))
        .await,
        "the late removal never ran"
    );
    assert!(
        wait_cluster_cidr(&sb, "pool-3", |o| o.is_none()).await,
        "pool-3 was never removed"
    );
    let served = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        sb.nodes()
            .iter()
            .filter(|n| {
                n["spec"]["podCIDRs"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty())
            })
            .count()
    };
    assert!(
        sb.wait_until(WAIT, |sb| served(sb) == 12).await,
        "every grp=a Node is served from pool-2 ({} are)",
        served(&sb)
    );
    sb.remove_commit_observer(observer);
    let _ = running.stop().await;
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert_eq!(
        seen.holders_at_removal,
        [Vec::<String>::new()],
        "pool-3's finalizer came off while these Nodes held a block of its range"
    );
}

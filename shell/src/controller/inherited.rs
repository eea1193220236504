//! A new leader's first duty: the write intents its predecessor left in the Lease (issue 30).

use std::sync::{Mutex, PoisonError};

use nodeipam_core::Cidr;

use super::Health;
use super::informer::NodeCache;
use crate::leader::{WriteIntent, WriteIntents};
use crate::metrics as m;
use crate::reconcile::Allocator;

/// How the inherited intents were resolved at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Inherited {
    /// Reserved for their unserved Nodes as writes in doubt (and sent again).
    pub(super) reserved: usize,
    /// Settled: the Node has podCIDRs, is gone, or is another object now.
    pub(super) settled: usize,
    /// Could not be reserved (see the error log): their write may land on blocks held otherwise.
    pub(super) conflicting: usize,
}

/// Reserves, after the start-up occupy and before the first allocation, the blocks of every write
/// a predecessor may still land: each intent inherited with the Lease whose Node is listed with
/// the intent's uid and that the start-up occupy left without a record becomes a write in doubt
/// ([`Allocator::seed_write_in_doubt`]); every other intent can no longer change anything and
/// leaves the Lease. Logs each one, and publishes the pool figures (gauges and health) as the
/// seeding left them: a reserved block counts as used from now on, and the write that later
/// shows it applied changes no figure (found by the chaos suite, seed 21: an exhausted pool whose
/// reported usage stayed at the start-up occupy's, 11 blocks short, once a takeover inherited 11
/// unsent intents of Nodes decided ahead).
///
/// The informer's cache runs ahead of the allocator: a watch event that arrived after the start-up
/// occupy (the predecessor's late write committing, say) already shows the Node's podCIDRs here,
/// while the allocator has not occupied them — that happens when a worker decides the event,
/// after the first allocations have started. So whether the Node has podCIDRs is read from the
/// allocator (a record made by the start-up occupy), never from the cache: an intent settled on
/// the cache's word left its block free for another Node until the event was decided (chaos seed
/// 18, two Nodes with one block). The reservation stands until the Node's event is decided (its
/// podCIDRs are then occupied, whatever they are).
pub(super) fn seed_inherited_intents(
    allocator: &Mutex<Allocator>,
    cache: &NodeCache,
    intents: &WriteIntents,
    health: &Health,
) -> Inherited {
    let inherited = intents.inherited();
    let mut outcome = Inherited::default();
    let mut allocator = allocator.lock().unwrap_or_else(PoisonError::into_inner);
    for intent in &inherited {
        let listed = cache
            .get(intent.node.as_str())
            .map(|(key, node)| node.view(&key));
        let same_object = listed
            .as_ref()
            .is_some_and(|n| n.uid.as_deref() == intent.uid.as_deref());
        // A record from the start-up occupy: the Node was listed with podCIDRs, which are immutable
        // (the write can only repeat them or be refused).
        let occupied = allocator.held(&intent.node).is_some();
        let Some(view) = listed.filter(|_| same_object && !occupied) else {
            tracing::info!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), "inherited write intent settled: the Node was listed with podCIDRs, is gone or is another object");
            intents.settle(&intent.node);
            outcome.settled += 1;
            continue;
        };
        let seeded = parse(intent).and_then(|cidrs| allocator.seed_write_in_doubt(&view, &cidrs));
        match seeded {
            Ok(metrics) => {
                metrics.iter().for_each(m::apply);
                tracing::warn!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), "inherited a write in doubt from the previous leader: its pod CIDRs stay reserved for the Node and are sent again");
                outcome.reserved += 1;
            }
            Err(reason) => {
                tracing::error!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), %reason, "inherited write intent cannot be reserved: if the previous leader's write still lands, it gives these pod CIDRs to the Node although this replica does not hold them for it");
                outcome.conflicting += 1;
            }
        }
    }
    let pools = allocator.pool_stats();
    m::set_pool_gauges(&pools, allocator.skipped_count());
    health.set_pools(pools);
    outcome
}

/// The intent's podCIDRs, parsed (we write canonical text; anything else is an error).
fn parse(intent: &WriteIntent) -> Result<Vec<Cidr>, String> {
    intent
        .pod_cidrs
        .iter()
        .map(|text| {
            text.parse::<Cidr>()
                .map_err(|e| format!("podCIDR {text:?} of the intent: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::controller::node::SlimNode;
    use crate::test_support::{allocator, assigned, cidr, node_view};

    fn listed(cache: &NodeCache, name: &str, pod_cidrs: &[&str]) {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs},
        }))
        .expect("test Node");
        cache.apply(&SlimNode::from_node(&node));
    }

    fn inherited(node: &str, pod_cidr: &str) -> WriteIntents {
        let intents = WriteIntents::new();
        let intent = WriteIntent {
            node: node.to_owned(),
            uid: Some(format!("uid-{node}")),
            pod_cidrs: vec![pod_cidr.to_owned()],
        };
        intents.inherit(BTreeMap::from([(node.to_owned(), intent)]));
        intents
    }

    /// Chaos seed 18: the predecessor's late write committed after the start-up occupy's list, so
    /// the cache shows the Node's podCIDRs while the allocator has not occupied them. The block
    /// must stay the Node's until its event is decided, never be handed to the next Node.
    #[test]
    fn an_intent_whose_write_the_cache_shows_after_the_startup_occupy_keeps_its_block() {
        let cache = NodeCache::new();
        listed(&cache, "late", &["10.0.0.0/24"]);
        let allocator = Mutex::new(allocator("10.0.0.0/16"));
        let intents = inherited("late", "10.0.0.0/24");
        let outcome = seed_inherited_intents(&allocator, &cache, &intents, &Health::new());
        assert_eq!(outcome.reserved, 1, "{outcome:?}");
        assert!(intents.contains("late"), "the write is still in doubt");
        let mut allocator = allocator.into_inner().expect("lock");
        assert_eq!(allocator.held("late"), Some(&[cidr("10.0.0.0/24")][..]));
        assert_eq!(
            assigned(&mut allocator, &node_view("next", &[])),
            vec![cidr("10.0.1.0/24")]
        );
        // The Node's event, decided: the write landed, the block is the Node's for good.
        let decision = allocator.decide(&node_view("late", &["10.0.0.0/24"]));
        assert!(
            matches!(decision.action, crate::reconcile::Action::Keep { .. }),
            "{decision:?}"
        );
        assert!(!allocator.is_pending("late"));
    }

    #[test]
    fn an_intent_of_a_node_listed_with_podcidrs_or_gone_leaves_the_lease() {
        let cache = NodeCache::new();
        listed(&cache, "served", &["10.0.0.0/24"]);
        let allocator = Mutex::new(allocator("10.0.0.0/16"));
        {
            let mut a = allocator.lock().expect("lock");
            let views = [node_view("served", &["10.0.0.0/24"])];
            let _ = a.startup_occupy(&views);
        }
        for node in ["served", "gone"] {
            let intents = inherited(node, "10.0.0.0/24");
            let outcome = seed_inherited_intents(&allocator, &cache, &intents, &Health::new());
            assert_eq!(outcome.settled, 1, "{node}: {outcome:?}");
            assert!(intents.is_empty(), "{node}");
        }
    }
}

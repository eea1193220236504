//! The naive model shared by the ClusterCIDR property tests (`reconcile/cluster_cidrs/`
//! `model_tests.rs`, single-stack, and `dual_stack_model_tests.rs`): the pools the model gives the
//! allocator, how a new Node is served, a sync that must not change what Nodes hold, and the
//! recount of a pool's usage over the blocks held. Each test keeps its own strategies (`Spec`,
//! `Op`): the seeds saved in `shell/proptest-regressions` replay through them.

use std::collections::BTreeMap;

use nodeipam_core::{Cidr, Family};
use serde_json::{Value, json};

use super::{assign, cluster_cidr_pool, node_view};
use crate::cluster_cidr::ClusterCidrPool;
use crate::cluster_cidr::status::PoolState;
use crate::reconcile::{Allocator, ClusterCidrSync};

/// A change to the pools the model gives the allocator, by the test's pool index.
pub(crate) enum PoolChange {
    /// The pool created (or replaced, with a new spec).
    Add(usize, ClusterCidrPool),
    /// Marked deleting (serves no new Node); nothing if it is not there.
    Delete(usize),
    /// Gone.
    Remove(usize),
}

/// The pools given to the allocator, by the test's index, deleting or not.
#[derive(Default)]
pub(crate) struct Pools(BTreeMap<usize, ClusterCidrPool>);

impl Pools {
    /// Applies `change`.
    pub(crate) fn apply(&mut self, change: PoolChange) {
        match change {
            PoolChange::Add(i, pool) => {
                self.0.insert(i, pool);
            }
            PoolChange::Delete(i) => {
                if let Some(pool) = self.0.get_mut(&i) {
                    pool.deleting = true;
                }
            }
            PoolChange::Remove(i) => {
                self.0.remove(&i);
            }
        }
    }

    /// Every pool, deleting or not.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &ClusterCidrPool> {
        self.0.values()
    }

    /// The pools that may serve a new Node (not deleting).
    pub(crate) fn live(&self) -> impl Iterator<Item = &ClusterCidrPool> {
        self.iter().filter(|p| !p.deleting)
    }
}

/// Pool `p<index>` with spec `body`; with `selector`, it selects only Nodes labelled `role=a`.
pub(crate) fn model_pool(index: usize, mut body: Value, selector: bool) -> ClusterCidrPool {
    if selector {
        body["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "role", "operator": "In", "values": ["a"]}]}]});
    }
    cluster_cidr_pool(&format!("p{index}"), body)
}

/// The name of the model's Node number `node`.
pub(crate) fn node_name(node: u8) -> String {
    format!("n{node}")
}

/// Node `name` arriving without podCIDRs (labelled `role=a` if `labelled`): the blocks it was
/// assigned and confirmed, or `None` when it was not served.
pub(crate) fn serve_new(
    allocator: &mut Allocator,
    name: &str,
    labelled: bool,
) -> Option<Vec<Cidr>> {
    let mut view = node_view(name, &[]);
    if labelled {
        view.labels.insert("role".into(), "a".into());
    }
    assign(allocator, &view).ok()
}

/// What the allocator holds for each of `names`, in order.
fn holdings<'a>(
    allocator: &Allocator,
    names: impl IntoIterator<Item = &'a String>,
) -> Vec<Option<Vec<Cidr>>> {
    names
        .into_iter()
        .map(|n| allocator.held(n).map(<[Cidr]>::to_vec))
        .collect()
}

/// Gives the allocator `pools`, asserting that what it holds for `names` did not change.
pub(crate) fn sync_keeping(
    allocator: &mut Allocator,
    pools: &Pools,
    names: &[&String],
) -> ClusterCidrSync {
    let list: Vec<ClusterCidrPool> = pools.iter().cloned().collect();
    let before = holdings(allocator, names.iter().copied());
    let sync = allocator.sync_cluster_cidrs(&list);
    assert_eq!(
        before,
        holdings(allocator, names.iter().copied()),
        "a sync changed what Nodes hold"
    );
    sync
}

/// Whether `block` lies in `range` with a block size of `mask`.
pub(crate) fn taken_from(block: Cidr, range: Cidr, mask: u8) -> bool {
    block.family() == range.family()
        && block.prefix_len() == mask
        && mask >= range.prefix_len()
        && range.overlaps(&block)
}

/// The blocks of `mask` bits in `range`.
pub(crate) fn blocks(range: Cidr, mask: u8) -> impl Iterator<Item = Cidr> {
    let count = 1u128 << (mask - range.prefix_len());
    let host_bits = u32::from(range.family().max_prefix_len() - mask);
    let base = range.network_bits();
    (0..count).map(move |i| {
        let bits = base | (i << host_bits);
        let address = match range.family() {
            Family::V4 => std::net::IpAddr::V4(std::net::Ipv4Addr::from(bits as u32)),
            Family::V6 => std::net::IpAddr::V6(std::net::Ipv6Addr::from(bits)),
        };
        Cidr::new(address, mask).expect("block")
    })
}

/// Asserts `pool`'s reported usage, per range it has, against a recount: of the blocks of its
/// size in the range, `used` those any of `held` overlaps, `capacity` all of them, `free` the
/// rest. Panics if the allocator does not know the pool or refused it. Returns the holders it
/// reports while deleting (`None` while it serves).
pub(crate) fn check_usage(
    allocator: &Allocator,
    pool: &ClusterCidrPool,
    held: &[Cidr],
) -> Option<usize> {
    let Some(state) = allocator.cluster_cidr_state(&pool.name) else {
        panic!("{} unknown", pool.name);
    };
    let (usage, holders) = match state {
        PoolState::Serving { usage } => (usage, None),
        PoolState::Deleting { usage, holders } => (usage, Some(holders)),
        // Every spec of the models fits 2^24 blocks and 64 sets.
        PoolState::Invalid { message } => panic!("{} refused: {message}", pool.name),
    };
    for range in [pool.ipv4, pool.ipv6].into_iter().flatten() {
        let mask = pool.node_mask_size(range);
        let capacity = blocks(range, mask).count() as u64;
        let used = blocks(range, mask)
            .filter(|b| held.iter().any(|h| h.overlaps(b)))
            .count() as u64;
        let Some((_, u)) = usage.iter().find(|(f, _)| *f == range.family()) else {
            panic!("{} has no {:?} usage", pool.name, range.family());
        };
        assert_eq!(u.used, used, "{} {range} used", pool.name);
        assert_eq!(u.capacity, capacity, "{} {range} capacity", pool.name);
        assert_eq!(u.free, capacity - used, "{} {range} free", pool.name);
    }
    holders
}

//! Allocator benchmarks, workloads W1–W5 of the allocation-core issue, W6 (pool ranges of a
//! shared set, issue 18) and W7 (several cluster CIDRs per family, issue 18 §1). Results in
//! BENCHMARKS.md.
//!
//! Run: `cargo bench -p nodeipam-core --bench allocator`
//!
//! Random choices use SplitMix64 and a partial Fisher–Yates selection over 0..n, seed 2 for
//! W2/W2b and seed 4 for W4, used in selection order.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use nodeipam_core::{
    BlockRequest, Cidr, CidrSet, MAX_CLUSTER_CIDRS, Placement, Pool, PoolRange, storage_words_for,
};

struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The first `k` of a partial Fisher–Yates shuffle of 0..n with SplitMix64(seed).
fn select(n: u32, k: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64 { state: seed };
    let mut a: Vec<u32> = (0..n).collect();
    for i in 0..k {
        let j = i + (rng.next() % (n as u64 - i as u64)) as usize;
        a.swap(i, j);
    }
    a.truncate(k);
    a
}

type Set = CidrSet<Vec<u64>>;

/// Baseline: upstream's algorithm (kube-controller-manager `CidrSet.AllocateNext`): test one bit
/// at a time from the cursor, wrapping. Here on a flat `Vec<u64>` (upstream uses `big.Int.Bit`,
/// which is slower still), so the comparison isolates the search strategy.
#[derive(Clone)]
struct LinearScan {
    used: Vec<u64>,
    block_count: u32,
    next_candidate: u32,
}

impl LinearScan {
    fn full(block_count: u32) -> LinearScan {
        LinearScan {
            used: vec![u64::MAX; block_count.div_ceil(64) as usize],
            block_count,
            next_candidate: 0,
        }
    }

    fn allocate_next(&mut self) -> Option<u32> {
        let mut candidate = self.next_candidate;
        for _ in 0..self.block_count {
            let (word, bit) = ((candidate / 64) as usize, candidate % 64);
            if self.used[word] >> bit & 1 == 0 {
                self.used[word] |= 1 << bit;
                self.next_candidate = (candidate + 1) % self.block_count;
                return Some(candidate);
            }
            candidate = (candidate + 1) % self.block_count;
        }
        None
    }

    fn release(&mut self, block_index: u32) {
        self.used[(block_index / 64) as usize] &= !(1 << (block_index % 64));
    }
}

fn new_set(cluster: &str, mask: u8) -> Set {
    let cidr: Cidr = cluster.parse().expect("bench CIDR");
    CidrSet::new(
        cidr,
        mask,
        vec![0; storage_words_for(cidr.prefix_len(), mask)],
    )
    .expect("bench set")
}

fn full_set(cluster: &str, mask: u8) -> Set {
    let mut set = new_set(cluster, mask);
    while set.allocate_next().is_ok() {}
    set
}

fn blocks(set: &Set, indices: &[u32]) -> Vec<Cidr> {
    indices
        .iter()
        .map(|&i| set.block_cidr(i).expect("in range"))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocator");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(30);

    // W1: 10.0.0.0/8 with /24 (65,536 blocks): allocate until full.
    group.throughput(Throughput::Elements(65_536));
    group.bench_function("W1_fill_ipv4_65536", |b| {
        b.iter_batched_ref(
            || new_set("10.0.0.0/8", 24),
            |set| {
                for _ in 0..65_536 {
                    black_box(set.allocate_next().ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    group.throughput(Throughput::Elements(1));
    let mut full = full_set("10.0.0.0/8", 24);
    group.bench_function("W1_allocate_on_full", |b| {
        b.iter(|| black_box(full.allocate_next().is_err()))
    });

    // W2: from full, release a pseudo-random 10% (6,553), then allocate them back.
    let picks = blocks(&full, &select(65_536, 6_553, 2));
    group.throughput(Throughput::Elements(6_553));
    group.bench_function("W2_release_6553_then_allocate", |b| {
        b.iter_batched_ref(
            || full.clone(),
            |set| {
                for cidr in &picks {
                    black_box(set.release(*cidr).ok());
                }
                for _ in 0..picks.len() {
                    black_box(set.allocate_next().ok());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W2b: from full, 10,000 × (release one random block, allocate one).
    let churn = blocks(&full, &select(65_536, 10_000, 2));
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("W2b_churn_10000_pairs", |b| {
        b.iter_batched_ref(
            || full.clone(),
            |set| {
                for cidr in &churn {
                    black_box(set.release(*cidr).ok());
                    black_box(set.allocate_next().ok());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W2b baseline: the same churn with upstream's bit-by-bit scan.
    let churn_indices = select(65_536, 10_000, 2);
    group.bench_function("W2b_churn_10000_pairs_upstream_linear_scan", |b| {
        b.iter_batched_ref(
            || LinearScan::full(65_536),
            |set| {
                for &index in &churn_indices {
                    set.release(index);
                    black_box(set.allocate_next());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W3: fd00::/48 with /64 (65,536 blocks): allocate until full.
    group.throughput(Throughput::Elements(65_536));
    group.bench_function("W3_fill_ipv6_65536", |b| {
        b.iter_batched_ref(
            || new_set("fd00::/48", 64),
            |set| {
                for _ in 0..65_536 {
                    black_box(set.allocate_next().ok());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W4: occupy 5,000 random /24s on a fresh W1 set, then 5,000 allocations.
    let fresh = new_set("10.0.0.0/8", 24);
    let occupied = blocks(&fresh, &select(65_536, 5_000, 4));
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("W4_occupy_5000_then_allocate_5000", |b| {
        b.iter_batched_ref(
            || fresh.clone(),
            |set| {
                for cidr in &occupied {
                    black_box(set.occupy(*cidr).ok());
                }
                for _ in 0..5_000 {
                    black_box(set.allocate_next().ok());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W5: 10.244.0.0/16 with /24: fill, release block 128, allocate once.
    let block_128: Cidr = "10.244.128.0/24".parse().expect("bench CIDR");
    group.throughput(Throughput::Elements(1));
    // Steady state: the set is full again after each release + allocate pair.
    let mut set = full_set("10.244.0.0/16", 24);
    group.bench_function("W5_release_128_allocate_once", |b| {
        b.iter(|| {
            black_box(set.release(block_128).ok());
            black_box(set.allocate_next().ok())
        })
    });

    // W6: W1 through a pool range over the whole cluster CIDR (`allocate_block_within`, one
    // grid block from the range's cursor): the cost of the range layer against W1.
    let whole: Cidr = "10.0.0.0/8".parse().expect("bench CIDR");
    let one_block = BlockRequest {
        prefix_len: 24,
        placement: Placement::NextFromCursor,
    };
    group.throughput(Throughput::Elements(65_536));
    group.bench_function("W6_fill_ipv4_65536_within_range", |b| {
        b.iter_batched_ref(
            || (new_set("10.0.0.0/8", 24), PoolRange::new(whole)),
            |(set, range)| {
                for _ in 0..65_536 {
                    black_box(set.allocate_block_within(range, one_block).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });

    // W6b: overlapping pools: on the W1 set with every other /24 taken by the default pool, a
    // labelled pool of /26 blocks on a /26 grid fills its 10.128.0.0/12 (16,384 /26s free).
    let labelled: Cidr = "10.128.0.0/12".parse().expect("bench CIDR");
    let mut half = new_set("10.0.0.0/8", 26);
    let mut default = PoolRange::new(whole);
    let mut taken = 0u32;
    while taken < 32_768 {
        let request = BlockRequest {
            prefix_len: 24,
            placement: Placement::NextFromCursor,
        };
        if let Ok(block) = half.allocate_block_within(&mut default, request) {
            // Skip the next /24: every other one stays free.
            default = PoolRange::with_cursor(whole, block.first_block_index + 8);
        }
        taken += 1;
    }
    let small = BlockRequest {
        prefix_len: 26,
        placement: Placement::NextFromCursor,
    };
    group.throughput(Throughput::Elements(16_384));
    group.bench_function("W6b_fill_16384_within_half_used_range", |b| {
        b.iter_batched_ref(
            || (half.clone(), PoolRange::new(labelled)),
            |(set, range)| {
                for _ in 0..16_384 {
                    black_box(set.allocate_block_within(range, small).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    several_cluster_cidrs(&mut group);
    group.finish();
}

/// W7: several cluster CIDRs of one family (issue 18 §1), through `Pool` as the controller
/// calls it (one request per family).
fn several_cluster_cidrs(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    type Sets = Pool<Vec<u64>, MAX_CLUSTER_CIDRS>;
    let one_block = [BlockRequest {
        prefix_len: 24,
        placement: Placement::NextFromCursor,
    }];
    // W7a: W1 through a pool of one set (the baseline of W7b).
    group.throughput(Throughput::Elements(65_536));
    group.bench_function("W7a_pool_fill_ipv4_65536_one_set", |b| {
        b.iter_batched_ref(
            || Sets::from_sets([new_set("10.0.0.0/8", 24)]).expect("pool"),
            |pool| {
                for _ in 0..65_536 {
                    black_box(pool.allocate_node_blocks(&one_block).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    // W7b: the same 65,536 blocks from a second set, the first (65,536 blocks) full.
    group.bench_function("W7b_pool_fill_second_of_two_first_full", |b| {
        b.iter_batched_ref(
            || {
                Sets::from_sets([full_set("10.0.0.0/8", 24), new_set("11.0.0.0/8", 24)])
                    .expect("pool")
            },
            |pool| {
                for _ in 0..65_536 {
                    black_box(pool.allocate_node_blocks(&one_block).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    // W7c: the worst case of the order rule: the first set (a /8 on a /26 grid, 262,144 blocks)
    // has every other /26 free, so no /25 anywhere; 16,384 /25 requests (first fit) each search
    // the whole first set before the second serves them.
    let mut fragmented = new_set("10.0.0.0/8", 26);
    let mut index = 0u32;
    while let Ok(cidr) = fragmented.block_cidr(index) {
        let _ = fragmented.occupy(cidr);
        index += 2;
    }
    let big = [BlockRequest {
        prefix_len: 25,
        placement: Placement::FirstFit,
    }];
    group.throughput(Throughput::Elements(16_384));
    group.bench_function("W7c_pool_16384_25s_past_a_fragmented_first_set", |b| {
        b.iter_batched_ref(
            || Sets::from_sets([fragmented.clone(), new_set("11.0.0.0/8", 26)]).expect("pool"),
            |pool| {
                for _ in 0..16_384 {
                    black_box(pool.allocate_node_blocks(&big).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

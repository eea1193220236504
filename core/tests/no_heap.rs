#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test.
//! Counts heap allocations made by allocator operations on an array-backed set: there must be
//! none. (The no_std proof binary in `core/nostd-proof` shows the same at link time.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use nodeipam_core::{BlockRequest, Cidr, CidrSet, Placement, Pool, storage_words_for};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator, only counting calls.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn allocator_operations_do_not_touch_the_heap() {
    let v4: Cidr = "10.0.0.0/16".parse().unwrap();
    let v6: Cidr = "fd00::/56".parse().unwrap();
    let block: Cidr = "10.0.7.0/24".parse().unwrap();
    let block6: Cidr = "fd00:0:0:7::/64".parse().unwrap();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let s4 = CidrSet::new(v4, 24, [0u64; storage_words_for(16, 24)]).unwrap();
    let s6 = CidrSet::new(v6, 64, [0u64; storage_words_for(56, 64)]).unwrap();
    let mut pool = Pool::new(s4, Some(s6)).unwrap();
    let mut served = 0;
    while pool.allocate_node().is_ok() {
        served += 1;
    }
    pool.release(block).unwrap();
    pool.occupy(block).unwrap();
    pool.release_node(&[block6, block]).unwrap();
    let again = pool.allocate_node().unwrap();
    pool.release_node(&[block6, block]).unwrap();
    let sized = pool
        .allocate_node_blocks(&[
            BlockRequest {
                prefix_len: 24,
                placement: Placement::NextFromCursor,
            },
            BlockRequest {
                prefix_len: 64,
                placement: Placement::FirstFit,
            },
        ])
        .unwrap();
    let largest = pool.sets()[0].largest_free_block();
    let config = nodeipam_core::config::validate(
        "10.0.0.0/16,fd00::/56",
        "10.96.0.0/12",
        Default::default(),
    )
    .unwrap();
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "heap allocations during allocator calls");
    assert_eq!(served, 256);
    assert_eq!((again[0].cidr, again[1].cidr), (block, block6));
    assert_eq!(config.cluster_cidrs.len(), 2);
    assert_eq!((sized[0].cidr, sized[1].cidr), (block, block6));
    assert_eq!(largest, None);
}

//! `nodeipam::malloc::fix_mmap_threshold` does what its doc says: after it, glibc no longer raises
//! its mmap threshold when a large mapped block is freed, so a later 2 MiB block still gets its
//! own mapping (and goes back to the kernel when freed). Without the call, freeing the 8 MiB
//! block below raises the threshold to 8 MiB and the 2 MiB block comes from the heap: this test
//! fails (checked by removing the call).
//!
//! Its own test binary (one process, one test): glibc's counters are process-wide.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

/// Bytes in blocks malloc served with their own mapping (`mallinfo2().hblkhd`).
fn mapped_bytes() -> usize {
    // SAFETY: `mallinfo2` takes no arguments and returns a plain struct by value; glibc documents
    // it as MT-Safe (`mallinfo(3)`, ATTRIBUTES, with "init" and "const:mallopt" notes only).
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    info.hblkhd
}

#[test]
fn a_freed_large_block_does_not_raise_the_mmap_threshold() {
    assert!(nodeipam::malloc::fix_mmap_threshold(), "glibc accepts it");
    // A large block, mapped (above every threshold glibc starts with), then freed: glibc's dynamic
    // adjustment would now raise the threshold to its size.
    let large = vec![1u8; 8 << 20];
    std::hint::black_box(&large);
    drop(large);
    let before = mapped_bytes();
    let block = vec![1u8; 2 << 20];
    std::hint::black_box(&block);
    let grew = mapped_bytes().saturating_sub(before);
    assert!(
        grew >= 2 << 20,
        "the 2 MiB block was not mapped on its own (mapped bytes grew by {grew})"
    );
    drop(block);
    assert!(
        mapped_bytes() <= before,
        "the freed block's mapping is returned at once"
    );
}

//! The C allocator's one setting we change: glibc malloc's mmap threshold, fixed at 128 KiB.
//!
//! Why: glibc raises the threshold at run time (up to 32 MiB on 64-bit) to the size of every
//! mmapped block that is freed (`malloc/malloc.c`, "dynamic mmap threshold"). The informer's cache
//! and the allocator's index are hash tables that grow by doubling (at 150,000 Nodes the last
//! steps are 6, 12 and 24 MiB tables), so after the first table is freed every later table of
//! up to that size comes from the heap instead of its own mapping, and the freed old tables stay
//! resident as free lists that the many small per-Node blocks fill only in part. With the
//! threshold fixed, every block of 128 KiB or more is its own mapping, returned to the kernel the
//! moment it is freed. Measured at 150,000 Nodes (BENCHMARKS.md, "150,000 Nodes: the peak RSS
//! goal"): the peak RSS fell by ~6 MiB with the index pre-sized, with no measurable CPU cost.
//!
//! 128 KiB is glibc's own initial value (`DEFAULT_MMAP_THRESHOLD_MIN`); setting it only turns the
//! dynamic adjustment off (`mallopt(3)`: "setting M_MMAP_THRESHOLD … disables the dynamic
//! adjustment"). Other C libraries (musl) and other systems are left as they are.

/// The fixed mmap threshold, bytes: glibc's initial default (`DEFAULT_MMAP_THRESHOLD_MIN`).
pub const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Fixes glibc malloc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (see the module doc). Call it
/// once, first thing in `main`. Returns whether the setting was applied: `false` where the C
/// library is not glibc (nothing to do), or if glibc refused it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn fix_mmap_threshold() -> bool {
    // SAFETY: `mallopt` takes two plain integers and reads or writes no memory of ours. glibc
    // documents it as MT-Safe (`mallopt(3)`, ATTRIBUTES; it takes the main arena's lock), so it is
    // sound whatever other threads exist, and an accepted value only changes which allocations
    // are served by their own mapping: every pointer malloc returns stays valid either way.
    #[allow(unsafe_code)]
    let accepted = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    // mallopt returns 1 on success, 0 on error.
    accepted == 1
}

/// Not glibc: nothing to do (see the module doc); returns `false`.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn fix_mmap_threshold() -> bool {
    false
}

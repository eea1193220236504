//! The C allocator's one setting we change: glibc malloc's mmap threshold, fixed at 1 MiB.
//!
//! Why: glibc raises the threshold at run time (up to 32 MiB on 64-bit) to the size of every
//! mmapped block that is freed (`malloc/malloc.c`, "dynamic mmap threshold"). The informer's cache
//! and the allocator's index are hash tables that grow by doubling (at 150,000 Nodes the last
//! steps are 6, 12 and 24 MiB tables), so after the first large table is freed every later table
//! of up to that size comes from the heap instead of its own mapping, and the freed old tables
//! stay resident as free lists that the many small per-Node blocks fill only in part. With the
//! threshold fixed, every block of 1 MiB or more is its own mapping, returned to the kernel the
//! moment it is freed. Measured at 150,000 Nodes (BENCHMARKS.md, "150,000 Nodes: the peak RSS
//! goal"): 6–7 MiB less peak RSS.
//!
//! Why 1 MiB and not glibc's initial 128 KiB: at 128 KiB the controller used ~10 % more CPU at
//! 50,000 Nodes (blocks between 128 KiB and 1 MiB it allocates and frees again and again were
//! mapped and unmapped each time; which ones was not profiled), at 1 MiB it did not; the tables
//! that matter are far larger than 1 MiB. Setting the threshold turns
//! the dynamic adjustment off (`mallopt(3)`: "setting M_MMAP_THRESHOLD … disables the dynamic
//! adjustment"). Other C libraries (musl) and other systems are left as they are, and so is a
//! threshold the operator chose: `GLIBC_TUNABLES` naming `glibc.malloc.mmap_threshold`, or the
//! older `MALLOC_MMAP_THRESHOLD_` environment variable ([`operator_chose_threshold`]).

/// The fixed mmap threshold, bytes (see the module doc for why this value).
pub const MMAP_THRESHOLD_BYTES: i32 = 1024 * 1024;

/// Whether the environment already sets glibc's mmap threshold: `GLIBC_TUNABLES` (colon-separated
/// `name=value` pairs) with `glibc.malloc.mmap_threshold`, or `MALLOC_MMAP_THRESHOLD_` (glibc's
/// older variable). `var` reads one variable (`std::env::var` in `main`; a map in tests).
pub fn operator_chose_threshold(var: impl Fn(&str) -> Option<String>) -> bool {
    let tunable = var("GLIBC_TUNABLES").is_some_and(|t| {
        t.split(':')
            .any(|pair| pair.split('=').next() == Some("glibc.malloc.mmap_threshold"))
    });
    tunable || var("MALLOC_MMAP_THRESHOLD_").is_some()
}

/// Fixes glibc malloc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (see the module doc), unless
/// the operator set one ([`operator_chose_threshold`]). Call it once, first thing in `main`.
/// Returns whether the setting was applied: `false` where the C library is not glibc (nothing to
/// do), where the operator chose a threshold, or if glibc refused it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn fix_mmap_threshold() -> bool {
    if operator_chose_threshold(|name| std::env::var(name).ok()) {
        return false;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_threshold_is_left_alone() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(!operator_chose_threshold(env(&[])));
        assert!(!operator_chose_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2"
        )])));
        assert!(operator_chose_threshold(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=4194304"
        )])));
        assert!(operator_chose_threshold(env(&[(
            "MALLOC_MMAP_THRESHOLD_",
            "65536"
        )])));
    }
}

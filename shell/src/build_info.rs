//! What `--version` prints: the crate version, the git commit it was built from and the rustc that
//! built it (set by `build.rs`; `unknown` outside a git checkout).

/// The git commit (short hash, `-dirty` if the work tree had changes), or `unknown`.
pub const GIT_COMMIT: &str = env!("NODEIPAM_GIT_COMMIT");

/// `rustc --version` of the compiler that built this binary.
pub const RUSTC_VERSION: &str = env!("NODEIPAM_RUSTC_VERSION");

/// `0.1.0 (git 1a2b3c4, rustc 1.95.0 (…))`.
pub const VERSION_TEXT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("NODEIPAM_GIT_COMMIT"),
    ", ",
    env!("NODEIPAM_RUSTC_VERSION"),
    ")"
);

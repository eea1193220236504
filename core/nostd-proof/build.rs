//! Links the C library: with `#![no_main]` and no `std`, the C runtime's `_start` (crt1.o, linked
//! by the system `cc`) calls our `main` through `__libc_start_main`, which lives in libc.

fn main() {
    println!("cargo:rustc-link-lib=c");
    println!("cargo:rerun-if-changed=build.rs");
}

//! Records the git commit and the rustc version for `--version` (`build_info`).

use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    let commit = output("git", &["rev-parse", "--short=12", "HEAD"])
        .map(|hash| {
            let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
            if dirty { format!("{hash}-dirty") } else { hash }
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version =
        output(&rustc, &["--version"]).unwrap_or_else(|| "rustc unknown".to_owned());
    println!("cargo:rustc-env=NODEIPAM_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=NODEIPAM_RUSTC_VERSION={rustc_version}");
    // Rebuild when HEAD moves (a worktree's HEAD lives in its own git dir).
    for path in ["HEAD", "index"] {
        if let Some(file) = output("git", &["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    if let Some(head_ref) = output("git", &["symbolic-ref", "-q", "HEAD"])
        && let Some(file) = output("git", &["rev-parse", "--git-path", &head_ref])
    {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

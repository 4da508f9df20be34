//! Build script: the git commit and its date that `flow version` and `flow --version`
//! report, so a binary found on a host can be traced to its source.
//!
//! `FLOW_GIT_COMMIT` (for builds outside a git checkout, e.g. a Docker context without
//! `.git`) wins over asking git; without either the commit is `unknown`. The script
//! reruns when HEAD moves, not on every source change.

use std::process::Command;

/// `git ARGS` from the package root, trimmed; `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FLOW_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    // Only files that exist: cargo treats a `rerun-if-changed` path that is missing as
    // always stale, so a checkout whose refs are loose (no `packed-refs`) or packed (no
    // loose branch file) would rebuild the binary on every `cargo build`.
    let watch = |path: String| {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    };
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        watch(format!("{common}/packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(format!("{common}/{branch}"));
        }
    }
    let commit = std::env::var("FLOW_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let date = git(&["log", "-1", "--format=%cs"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FLOW_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=FLOW_GIT_DATE={date}");
}

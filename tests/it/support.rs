//! Helpers shared by the end-to-end tests: run the real binary, find repository files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (where `workflows/` lives).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A `flow` command run from the repository root with a clean flow environment.
pub fn flow() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flow"));
    cmd.current_dir(repo());
    for (key, _) in std::env::vars() {
        if key.starts_with("FLOW_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Runs a command and returns its output, failing the test if it cannot start.
pub fn output(cmd: &mut Command) -> Output {
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run {cmd:?}: {e}"),
    }
}

/// Text of stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Text of stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Sorted files of a directory with the given extension.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

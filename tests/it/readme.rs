//! The README's promises about itself: its second set-up command is exactly the test
//! command CI runs, so a new user runs what CI runs.

use crate::support::repo;

#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let setup = readme
        .split("## Set up")
        .nth(1)
        .and_then(|s| s.split("```sh").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a sh block under ## Set up");
    let commands: Vec<&str> = setup
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands.len(),
        2,
        "exactly two set-up commands: {commands:?}"
    );
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let last = ci
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    assert_eq!(
        commands[1], last,
        ".ci/run must end with the README's test command"
    );
    let script = std::fs::read_to_string(repo().join(".ci/test")).expect(".ci/test");
    assert!(
        script.contains("cargo install --locked cargo-nextest"),
        "the test command installs the runner it needs"
    );
}

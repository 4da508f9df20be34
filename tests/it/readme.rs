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

/// The metric names `text` mentions (`flow_…`), a histogram's series named by its
/// metric (`_bucket`, `_count`, `_sum` dropped).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let re = regex::Regex::new(r"flow_[a-z_]+[a-z]").expect("regex");
    re.find_iter(text)
        .map(|m| {
            let name = m.as_str();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name)
                .to_string()
        })
        .collect()
}

#[test]
fn the_dashboard_and_alerts_use_exactly_the_metrics_the_readme_lists() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let table: String = readme
        .split("### Metrics, health and logs")
        .nth(1)
        .expect("the metrics section")
        .lines()
        .skip_while(|l| !l.starts_with("| metric"))
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').nth(1).unwrap_or_default().to_string() + "\n")
        .collect();
    let listed = metric_names(&table);
    assert!(listed.len() > 15, "the table was read: {listed:?}");

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    let shown = metric_names(&exprs.join("\n"));
    assert_eq!(shown, listed, "a panel per README metric, and no other");

    let alerts_text = std::fs::read_to_string(repo().join("docs/alerts.yml")).expect("alerts");
    let alerts: serde_json::Value = yaml_serde::from_str(&alerts_text).expect("alerts.yml is YAML");
    let rules = alerts["groups"][0]["rules"].as_array().expect("rules");
    let used: Vec<String> = rules
        .iter()
        .map(|r| r["expr"].as_str().expect("an expr").to_string())
        .collect();
    let unknown: Vec<String> = metric_names(&used.join("\n"))
        .difference(&listed)
        .cloned()
        .collect();
    assert!(
        unknown.is_empty(),
        "alerts on unlisted metrics: {unknown:?}"
    );
    assert!(
        used.iter()
            .any(|e| e.contains("flow_oldest_in_doubt_seconds")),
        "the in-doubt alert is there"
    );
}

/// Every guarantee names the tests that prove it, and the names stay true: each file a
/// guarantee cites exists, and each test it names in parentheses (a snake_case name)
/// is a function in that file — so renaming or deleting a proof fails here, not in a
/// reader's search.
#[test]
fn every_guarantee_names_tests_that_exist() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let start = readme
        .find("## The guarantees")
        .expect("the guarantees section");
    let end = start + readme[start..].find("\n### ").expect("its end");
    let section = &readme[start..end];
    let mut guarantees = Vec::new();
    let mut current = String::new();
    for line in section.lines() {
        if line.len() > 2 && line.as_bytes()[0].is_ascii_digit() && line[1..].starts_with(". ") {
            guarantees.push(std::mem::take(&mut current));
        }
        current.push_str(line);
        current.push(' ');
    }
    guarantees.push(current);
    let guarantees: Vec<String> = guarantees.into_iter().skip(1).collect();
    assert!(guarantees.len() >= 9, "{} guarantees", guarantees.len());
    for (i, g) in guarantees.iter().enumerate() {
        let n = i + 1;
        let cited: Vec<&str> = g
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|t| t.ends_with(".rs"))
            .collect();
        assert!(!cited.is_empty(), "guarantee {n} names no test file: {g}");
        for file in &cited {
            let text = std::fs::read_to_string(repo().join(file))
                .unwrap_or_else(|e| panic!("guarantee {n} cites {file}: {e}"));
            // `file` (name, name): the names right after it.
            let after = g
                .split(&format!("`{file}`"))
                .nth(1)
                .unwrap_or_default()
                .trim_start();
            let Some(list) = after.strip_prefix('(').and_then(|l| l.split(')').next()) else {
                continue;
            };
            for name in list.split(',').map(str::trim) {
                let is_fn = name.contains('_')
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit());
                if is_fn {
                    assert!(
                        text.contains(&format!("fn {name}(")),
                        "guarantee {n} names `{name}` in {file}, which has no such function"
                    );
                }
            }
        }
    }
}

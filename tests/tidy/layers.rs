//! The engine's layers: every top-level module of `engine/src` belongs to one, and a
//! module's code imports only its own layer and the layers below it, so the house can
//! be read bottom-up (ARCHITECTURE.md, "Layers"). Import circles between files are
//! `imports.rs`'s rule; this one is about floors.

use std::path::Path;

use super::imports::{module_of, references, without_test_items};
use super::{files, read, report};

/// The layers, bottom first, with their modules: the one place a module's floor is
/// written down (a new module is refused until it is placed here).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "support",
        &[
            "backoff",
            "duration_text",
            "fault",
            "host_pattern",
            "item_id",
            "json_line",
            "lease",
            "read_limited",
            "role",
            "secrets",
            "sign",
            "telemetry",
        ],
    ),
    (
        "language",
        &["workflow", "plan", "schema", "diagram", "inputs"],
    ),
    (
        "core",
        &[
            "retry",
            "snapshot",
            "gateway",
            "executor",
            "approval",
            "policy",
            "reconcile",
            "redrive",
            "connections",
        ],
    ),
    (
        "services",
        &["config", "daemon", "events", "schedule", "retention"],
    ),
    ("faces", &["view", "runtime", "cli", "serve", "mcp"]),
];

/// The floor of top-level module `m` (`None`: not placed).
fn floor(m: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&m))
}

/// The imports of a file of `module` that reach a floor above its own, as
/// `crate::path` (`[]` when its module is not placed: the placement check names it).
fn upward(text: &str, module: &[String]) -> Vec<String> {
    let Some(own) = module.first().and_then(|m| floor(m)) else {
        return Vec::new();
    };
    references(text, module)
        .into_iter()
        .filter(|p| p.first().and_then(|m| floor(m)).is_some_and(|f| f > own))
        .map(|p| format!("crate::{}", p.join("::")))
        .collect()
}

/// Every module `engine/src/lib.rs` declares is placed on exactly one floor, and each
/// file imports only its own floor and those below (test items may reach anywhere).
#[test]
fn the_engine_imports_only_down_its_layers() {
    // The rule can fail: a language file that reaches the services, as the parser did
    // when it read the scheduler's field checks.
    let planted = upward(
        "use crate::schedule::fields::Written;\nuse crate::plan::Plan;",
        &["workflow".to_string(), "parse".to_string()],
    );
    assert_eq!(planted, ["crate::schedule::fields::Written"]);
    assert!(upward("use crate::workflow::Workflow;", &["serve".to_string()]).is_empty());

    let src = Path::new("engine/src");
    let lib = read(&src.join("lib.rs"));
    let mut offenders = Vec::new();
    for line in lib.lines() {
        let Some(name) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .and_then(|r| r.strip_suffix(';'))
        else {
            continue;
        };
        let placed = LAYERS.iter().filter(|(_, ms)| ms.contains(&name)).count();
        if placed != 1 {
            offenders.push(format!(
                "module `{name}` is on {placed} layers of tests/tidy/layers.rs (place it on one)"
            ));
        }
    }
    for path in files("engine/src", ".rs") {
        if path.ends_with("main.rs") || path.ends_with("lib.rs") {
            continue;
        }
        let module = module_of(src, &path);
        let text = without_test_items(&read(&path));
        for p in upward(&text, &module) {
            let (from, to) = (&module[0], p.split("::").nth(1).unwrap_or_default());
            offenders.push(format!(
                "{}: `{p}` — {from} ({}) imports {to} ({}), a layer above",
                path.display(),
                LAYERS[floor(from).unwrap_or(0)].0,
                LAYERS[floor(to).unwrap_or(0)].0,
            ));
        }
    }
    report("imports up the engine's layers", &offenders);
}

//! Schedules a workflow file carries (`schedules:`), stored with `flow schedules apply`:
//! daemons fire them from the ledger with the file gone — two daemons, one of them with
//! a `flow.toml` of its own schedules that must not prune them — one run per tick;
//! applying the file without one removes it and its ticks stop; what apply cannot own
//! (an id `flow.toml` or another workflow holds) or check (a bad cron, inputs the
//! workflow does not take) is refused with its position and nothing is stored.

use std::time::Duration;

use serde_json::Value;

use crate::daemon::Daemon;
use crate::schedules::{history, one_run_per_tick, seconds, tick_runs};
use crate::support::{Backend, TestDb, output, stderr, stdout};

/// A workflow `ticker` carrying `schedules` (YAML list items), one node.
fn workflow(schedules: &str) -> String {
    format!(
        "name: ticker\ninputs:\n  at: {{ type: string, required: true }}\nschedules:\n{schedules}tools:\n  echo: {{ kind: function, function: core.echo }}\nnodes:\n  a: {{ tool: echo, with: {{ at: \"${{{{ inputs.at }}}}\" }} }}\n"
    )
}

const EVERY: &str = "  - id: every\n    cron: \"* * * * * *\"\n    overlap: allow\n    catchup_window: 30s\n    inputs: { at: \"${{ schedule.time }}\" }\n";
const DAILY: &str =
    "  - id: daily\n    cron: \"0 2 * * *\"\n    timezone: Europe/Paris\n    inputs: { at: x }\n";

/// `flow schedules apply FILE --json` as `by`: `(exit code, {id: change}, stderr)`.
fn apply(db: &TestDb, file: &str, by: &str) -> (Option<i32>, Vec<(String, String)>, String) {
    let out = output(
        db.flow()
            .args(["schedules", "apply", file, "--json", "--by", by]),
    );
    let changes = serde_json::from_str::<Value>(&stdout(&out))
        .ok()
        .and_then(|v| v["schedules"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("id"), s("change"))
        })
        .collect();
    (out.status.code(), changes, stderr(&out))
}

/// The schedules `flow schedules --json` lists as `(id, declared_in)`, with
/// `FLOW_CONFIG` = `config` when given.
fn listed(db: &TestDb, config: Option<&str>) -> Vec<(String, String)> {
    let mut cmd = db.flow();
    if let Some(c) = config {
        cmd.env("FLOW_CONFIG", c);
    }
    let out = output(cmd.args(["schedules", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).expect("json");
    list.as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap_or_default().to_string();
            (f("id"), f("declared_in"))
        })
        .collect()
}

fn fired_from_the_ledger(backend: Backend) {
    let ctx = format!("{backend:?}");
    let db = TestDb::new(backend);
    db.write("ticker.yaml", &workflow(&format!("{EVERY}{DAILY}")));
    let (code, changes, err) = apply(&db, "ticker.yaml", "alice");
    assert_eq!(code, Some(0), "{ctx}: {err}");
    assert_eq!(
        changes,
        [
            ("every".into(), "added".into()),
            ("daily".into(), "added".into())
        ],
        "{ctx}"
    );
    // The daemons never read the file: the ledger holds its text.
    std::fs::remove_file(db.dir.path().join("ticker.yaml")).expect("rm");
    // One daemon has a flow.toml of its own schedule: its sync must not prune ours.
    db.write("other.yaml", &workflow(""));
    db.write(
        "own.toml",
        "[[schedules]]\nid = \"own\"\nworkflow = \"other.yaml\"\ncron = \"@daily\"\ninputs = { at = \"y\" }\n",
    );
    let own = db.dir.path().join("own.toml").display().to_string();
    let args = ["--poll-interval", "100ms"];
    // A daemon with no flow.toml schedules fires them alone at first.
    let plain = Daemon::start(&db, "plain", &args, &[]);
    std::thread::sleep(Duration::from_secs(4));
    let alone = tick_runs(&db).len();
    assert!(alone >= 2, "{ctx}: {alone} runs\n{}", plain.log());
    let mut daemons = [
        plain,
        Daemon::start(&db, "own", &args, &[("FLOW_CONFIG", &own)]),
    ];
    std::thread::sleep(Duration::from_secs(4));
    // Applied again without `every`: removed, and its ticks stop.
    db.write("ticker.yaml", &workflow(DAILY));
    let (code, changes, err) = apply(&db, "ticker.yaml", "bob");
    assert_eq!(code, Some(0), "{ctx}: {err}");
    assert!(
        changes.contains(&("every".into(), "removed".into())),
        "{ctx}: {changes:?}"
    );
    assert!(
        changes.contains(&("daily".into(), "changed".into())),
        "{ctx}: {changes:?}"
    );
    let removed_at = chrono::Utc::now().timestamp();
    std::thread::sleep(Duration::from_secs(3));
    for d in &daemons {
        d.signal("-TERM");
    }
    for d in &mut daemons {
        let _ = d.wait(Duration::from_secs(30));
    }
    let logs = || format!("{}\n{}", daemons[0].log(), daemons[1].log());
    let h = history(&db);
    assert!(
        h.iter().any(|e| e.0 == "removed"),
        "{ctx}: {h:?}\n{}",
        logs()
    );
    let fired = one_run_per_tick(&db, &ctx);
    assert!(fired >= 4, "{ctx}: {fired} ticks\n{}", logs());
    let late: Vec<i64> = tick_runs(&db)
        .iter()
        .filter_map(|id| id.rsplit('.').next().map(str::to_string))
        .filter_map(|t| chrono::NaiveDateTime::parse_from_str(&t, "%Y%m%dT%H%M%SZ").ok())
        .map(|t| t.and_utc().timestamp())
        .filter(|t| *t > removed_at + 1)
        .collect();
    assert!(late.is_empty(), "{ctx}: ticks after removal: {late:?}");
    assert!(
        h.iter()
            .filter(|e| e.0 == "started")
            .all(|e| seconds(&e.1) <= removed_at + 1),
        "{ctx}: {h:?}"
    );
    let mut ids = listed(&db, Some(&own));
    ids.sort();
    assert_eq!(
        ids,
        [
            ("daily".to_string(), "workflow".to_string()),
            ("own".to_string(), "flow.toml".to_string())
        ],
        "{ctx}: the flow.toml daemon kept the applied schedule"
    );
}

#[test]
fn applied_schedules_fire_from_the_ledger_and_stop_when_applied_without() {
    fired_from_the_ledger(Backend::Sqlite);
}

#[test]
fn applied_schedules_fire_from_the_ledger_on_postgres() {
    if !crate::support::postgres_available() {
        return;
    }
    fired_from_the_ledger(Backend::Postgres);
}

/// What apply cannot own or check is refused with where it is, and nothing is stored;
/// an applied schedule is paused, resumed and triggered like a flow.toml one.
#[test]
fn apply_refuses_what_it_cannot_own_or_check_and_stores_nothing() {
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "flow.toml",
        "[[schedules]]\nid = \"daily\"\nworkflow = \"t.yaml\"\ncron = \"@daily\"\ninputs = { at = \"y\" }\n",
    );
    db.write("t.yaml", &workflow(DAILY));
    let (code, _, err) = apply(&db, "t.yaml", "alice");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("t.yaml:5:5: schedule `daily` is declared in") && err.contains("flow.toml"),
        "{err}"
    );
    std::fs::remove_file(db.dir.path().join("flow.toml")).expect("rm");
    let bad = workflow("  - id: late\n    cron: \"0 25 * * *\"\n    inputs: { at: x }\n");
    db.write("bad.yaml", &bad);
    let (code, _, err) = apply(&db, "bad.yaml", "alice");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("bad.yaml:6:11: error: schedule `late`: cron"),
        "{err}"
    );
    let unfit = workflow("  - id: unfit\n    cron: \"@hourly\"\n");
    db.write("unfit.yaml", &unfit);
    let (code, _, err) = apply(&db, "unfit.yaml", "alice");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("unfit.yaml:5:5: ") && err.contains("`at`"),
        "{err}"
    );
    assert!(listed(&db, None).is_empty(), "nothing stored");
    // Applied by `ticker`; another workflow may not take the id.
    db.write("t.yaml", &workflow(DAILY));
    assert_eq!(apply(&db, "t.yaml", "alice").0, Some(0));
    db.write(
        "other.yaml",
        &workflow(DAILY).replace("name: ticker", "name: other"),
    );
    let (code, _, err) = apply(&db, "other.yaml", "alice");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("belongs to workflow `ticker`"), "{err}");
    // `remove` settles the clash: then the other workflow may take the id.
    let out = output(
        db.flow()
            .args(["schedules", "remove", "daily", "--by", "dora"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, changes, err) = apply(&db, "other.yaml", "alice");
    assert_eq!(
        (code, changes),
        (Some(0), vec![("daily".into(), "added".into())]),
        "{err}"
    );
    let out = output(
        db.flow()
            .args(["schedules", "remove", "nope", "--by", "dora"]),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    for verb in ["pause", "resume"] {
        let out = output(
            db.flow()
                .args(["schedules", verb, "daily", "--by", "carol"]),
        );
        assert_eq!(out.status.code(), Some(0), "{verb}: {}", stderr(&out));
    }
    let out = output(
        db.flow()
            .args(["schedules", "trigger", "daily", "--by", "carol"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("sched.daily.manual."),
        "{}",
        stdout(&out)
    );
    let out = output(db.flow().args(["schedules", "history", "daily", "--json"]));
    let h: Value = serde_json::from_str(&stdout(&out)).expect("json");
    let outcomes: Vec<&str> = h
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["outcome"].as_str())
        .collect();
    for o in ["paused", "resumed", "triggered"] {
        assert!(outcomes.contains(&o), "{o}: {outcomes:?}");
    }
}

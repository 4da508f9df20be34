//! Schedules through real daemons: a per-second schedule fired by several daemons on
//! one ledger (SQLite file, PostgreSQL), one SIGKILLed and restarted, starts exactly
//! one run per tick with none missing; ticks missed while no daemon ran are recorded,
//! and only those within the catch-up window start; `overlap: skip` records the ticks
//! it skips; the CLI lists, pauses, resumes and triggers; a bad `[[schedules]]` entry
//! is refused with its position.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::Daemon;
use crate::support::{Backend, TestDb, output, stderr, stdout};

/// A `flow.toml` with one schedule `every` of `workflow` (a file in the test dir).
fn config(db: &TestDb, cron: &str, extra: &str, workflow: &str) {
    db.write("w.yaml", workflow);
    db.write(
        "flow.toml",
        &format!(
            "[[schedules]]\nid = \"every\"\nworkflow = \"w.yaml\"\ncron = \"{cron}\"\ninputs = {{ at = \"${{{{ schedule.time }}}}\" }}\n{extra}\n"
        ),
    );
}

const QUICK: &str = "name: tick\ninputs:\n  at: { type: string, required: true }\ntools:\n  echo: { kind: function, function: core.echo }\nnodes:\n  a: { tool: echo, with: { at: \"${{ inputs.at }}\" } }\n";

/// The history of `every`, oldest first, as `(outcome, tick, run, count)`.
pub(crate) fn history(db: &TestDb) -> Vec<(String, String, Option<String>, u64)> {
    let out = output(
        db.flow()
            .args(["schedules", "history", "every", "--limit", "500", "--json"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).expect("json");
    let mut h: Vec<_> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["outcome"].as_str().unwrap_or_default().to_string(),
                e["tick"].as_str().unwrap_or_default().to_string(),
                e["run"].as_str().map(str::to_string),
                e["count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    h.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    h
}

/// The ids of the runs in the ledger that a tick started.
pub(crate) fn tick_runs(db: &TestDb) -> BTreeSet<String> {
    let out = output(db.flow().args(["runs", "--json", "--limit", "1000"]));
    let list: Value = serde_json::from_str(&stdout(&out)).expect("runs json");
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["id"].as_str().or_else(|| r["run_id"].as_str()))
        .filter(|id| id.starts_with("sched.every."))
        .map(str::to_string)
        .collect()
}

pub(crate) fn seconds(tick: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(tick)
        .expect("tick time")
        .timestamp()
}

/// Every started tick has one run, the runs are exactly those, and between the first
/// and the last started tick no second is missing (nothing was recorded missed).
pub(crate) fn one_run_per_tick(db: &TestDb, ctx: &str) -> usize {
    let h = history(db);
    let started: Vec<&(String, String, Option<String>, u64)> =
        h.iter().filter(|e| e.0 == "started").collect();
    assert!(started.len() >= 5, "{ctx}: too few ticks fired: {h:?}");
    assert!(!h.iter().any(|e| e.0 == "missed"), "{ctx}: {h:?}");
    let runs = tick_runs(db);
    let named: BTreeSet<String> = started.iter().filter_map(|e| e.2.clone()).collect();
    assert_eq!(named.len(), started.len(), "{ctx}: one run per tick");
    assert_eq!(
        runs, named,
        "{ctx}: the runs are exactly the started ticks'"
    );
    let secs: Vec<i64> = started.iter().map(|e| seconds(&e.1)).collect();
    for pair in secs.windows(2) {
        assert_eq!(pair[1] - pair[0], 1, "{ctx}: a tick is missing: {secs:?}");
    }
    started.len()
}

fn several_daemons_one_killed(backend: Backend, daemons: usize, seconds_total: u64) {
    let ctx = format!("{backend:?}");
    let db = TestDb::new(backend);
    config(
        &db,
        "* * * * * *",
        "overlap = \"allow\"\ncatchup_window = \"30s\"",
        QUICK,
    );
    let args = ["--poll-interval", "100ms"];
    // The others read the same file by its absolute path: they agree on the schedule.
    let absolute = db.dir.path().join("flow.toml").display().to_string();
    let mut all: Vec<Daemon> = (0..daemons)
        .map(|i| {
            let env: &[(&str, &str)] = if i == 0 {
                &[]
            } else {
                &[("FLOW_CONFIG", &absolute)]
            };
            Daemon::start(&db, &format!("d{i}"), &args, env)
        })
        .collect();
    let start = Instant::now();
    let step = Duration::from_secs(seconds_total) / 4;
    for round in 0..2 {
        std::thread::sleep(step);
        all[0].signal("-KILL");
        let _ = all[0].wait(Duration::from_secs(10));
        std::thread::sleep(step / 2);
        all[0] = Daemon::start(&db, &format!("d0-{round}"), &args, &[]);
    }
    let left = Duration::from_secs(seconds_total).saturating_sub(start.elapsed());
    std::thread::sleep(left);
    for d in &all {
        d.signal("-TERM");
    }
    for d in &mut all {
        let _ = d.wait(Duration::from_secs(30));
    }
    let fired = one_run_per_tick(&db, &ctx);
    assert!(
        !history(&db).iter().any(|e| e.0 == "changed"),
        "{ctx}: daemons reading one file by two paths agree on its definition"
    );
    assert!(
        fired as u64 + 3 >= seconds_total,
        "{ctx}: {fired} ticks in {seconds_total} s (a daemon was always up)"
    );
}

#[test]
fn two_daemons_on_one_sqlite_file_start_one_run_per_tick() {
    several_daemons_one_killed(Backend::Sqlite, 2, 60);
}

#[test]
fn three_postgres_daemons_one_killed_twice_start_one_run_per_tick() {
    if !crate::support::postgres_available() {
        return;
    }
    several_daemons_one_killed(Backend::Postgres, 3, 60);
}

/// No daemon for a while: the ticks older than the window are one `missed` range, the
/// ones within it start, and together they are every tick of the gap.
#[test]
fn ticks_missed_while_no_daemon_ran_are_recorded_and_the_window_catches_up() {
    let db = TestDb::new(Backend::Sqlite);
    config(
        &db,
        "* * * * * *",
        "overlap = \"allow\"\ncatchup_window = \"3s\"",
        QUICK,
    );
    let args = ["--poll-interval", "100ms"];
    let mut d = Daemon::start(&db, "first", &args, &[]);
    std::thread::sleep(Duration::from_millis(2500));
    d.signal("-KILL");
    let _ = d.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(8));
    let mut d = Daemon::start(&db, "second", &args, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    d.signal("-TERM");
    let _ = d.wait(Duration::from_secs(30));
    let h = history(&db);
    let missed: Vec<_> = h.iter().filter(|e| e.0 == "missed").collect();
    assert_eq!(missed.len(), 1, "one range: {h:?}");
    let count = missed[0].3;
    assert!((3..=8).contains(&count), "about 5 of ~10 missed: {h:?}");
    // Every second from the first tick to the last is accounted for, once.
    let mut covered: Vec<i64> = h
        .iter()
        .filter(|e| e.0 == "started")
        .map(|e| seconds(&e.1))
        .collect();
    let first_missed = seconds(&missed[0].1);
    covered.extend(first_missed..first_missed + count as i64);
    covered.sort_unstable();
    for pair in covered.windows(2) {
        assert_eq!(pair[1] - pair[0], 1, "every tick once: {covered:?}\n{h:?}");
    }
    let caught_up = h
        .iter()
        .filter(|e| e.0 == "started" && seconds(&e.1) > first_missed)
        .count();
    assert!(caught_up >= 3, "the window's ticks started: {h:?}");
}

/// `overlap: skip` with a run slower than the interval: the ticks in between are
/// recorded skipped, and two runs of the schedule never overlap.
#[test]
fn overlap_skip_records_the_ticks_it_skips() {
    let db = TestDb::new(Backend::Sqlite);
    let slow = "name: slow\ninputs:\n  at: { type: string, required: true }\ntools:\n  nap: { kind: command, command: [sleep, \"2.5\"] }\nnodes:\n  a: { tool: nap }\n";
    config(&db, "* * * * * *", "overlap = \"skip\"", slow);
    let addr = crate::daemon::free_port();
    let metrics_addr = addr.to_string();
    let args = ["--poll-interval", "100ms", "--metrics-addr", &metrics_addr];
    let mut d = Daemon::start(&db, "d", &args, &[]);
    std::thread::sleep(Duration::from_secs(7));
    let (code, text) = crate::daemon::http_get(addr, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    let counted = |outcome: &str| -> u64 {
        let prefix =
            format!("flow_schedule_ticks_total{{schedule=\"every\",outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(
        counted("started") >= 2 && counted("skipped_overlap") >= 2,
        "the ticks are counted: {text}"
    );
    d.signal("-TERM");
    let _ = d.wait(Duration::from_secs(30));
    let h = history(&db);
    let skipped = h.iter().filter(|e| e.0 == "skipped_overlap").count();
    let started = h.iter().filter(|e| e.0 == "started").count();
    assert!(skipped >= 2 && started >= 2, "{h:?}");
    assert!(
        started <= 4,
        "a 2.5 s run every second starts at most every third tick: {h:?}"
    );
    let metrics_free = output(db.flow().args(["schedules", "--json"]));
    let list: Value = serde_json::from_str(&stdout(&metrics_free)).expect("json");
    assert_eq!(list[0]["last_skip"]["outcome"], "skipped_overlap", "{list}");
}

/// The CLI: list, pause (no tick starts), resume, trigger; a bad entry is refused with
/// its position and nothing is written.
#[test]
fn the_cli_lists_pauses_resumes_and_triggers_and_refuses_bad_entries() {
    let db = TestDb::new(Backend::Sqlite);
    config(&db, "0 2 * * *", "timezone = \"Europe/Paris\"", QUICK);
    let out = output(db.flow().args(["schedules", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(list[0]["id"], "every");
    assert_eq!(list[0]["timezone"], "Europe/Paris");
    let next = list[0]["next_tick"].as_str().expect("a next tick");
    assert!(next.ends_with(":00:00.000Z"), "{next}");
    let paused = output(
        db.flow()
            .args(["schedules", "pause", "every", "--by", "ada"]),
    );
    assert_eq!(paused.status.code(), Some(0), "{}", stderr(&paused));
    let list: Value =
        serde_json::from_str(&stdout(&output(db.flow().args(["schedules", "--json"]))))
            .expect("json");
    assert_eq!(
        (list[0]["paused"].as_bool(), list[0]["next_tick"].is_null()),
        (Some(true), true)
    );
    let resumed = output(
        db.flow()
            .args(["schedules", "resume", "every", "--by", "ada"]),
    );
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let trig = output(
        db.flow()
            .args(["schedules", "trigger", "every", "--by", "ada"]),
    );
    assert_eq!(trig.status.code(), Some(0), "{}", stderr(&trig));
    let run = stdout(&trig).trim().to_string();
    assert!(run.starts_with("sched.every.manual."), "{run}");
    let h = history(&db);
    let kinds: Vec<&str> = h.iter().map(|e| e.0.as_str()).collect();
    for k in ["paused", "resumed", "triggered"] {
        assert!(kinds.contains(&k), "{k}: {h:?}");
    }
    let unknown = output(
        db.flow()
            .args(["schedules", "pause", "nope", "--by", "ada"]),
    );
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));

    for (bad, want) in [
        ("cron = \"61 * * * *\"", "flow.toml:4:"),
        (
            "cron = \"0 2 * * *\"\ntimezone = \"Europe/Pariss\"",
            "Europe/Pariss",
        ),
        ("cron = \"0 2 * * *\"\novershoot = 1", "unknown field"),
        (
            "cron = \"0 2 * * *\"\noverlap = \"queue\"",
            "not one of skip, buffer_one, allow",
        ),
    ] {
        let text = format!("[[schedules]]\nid = \"x\"\nworkflow = \"w.yaml\"\n{bad}\n");
        db.write("flow.toml", &text);
        let out = output(db.flow().args(["schedules"]));
        assert_eq!(out.status.code(), Some(5), "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(want),
            "{bad}: want {want}: {}",
            stderr(&out)
        );
    }
    // A daemon does not start with a schedule whose workflow it cannot use.
    db.write(
        "flow.toml",
        "[[schedules]]\nid = \"x\"\nworkflow = \"gone.yaml\"\ncron = \"@hourly\"\n",
    );
    let out = output(db.flow().args(["daemon", "--exit-when-idle"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("schedule `x`: gone.yaml"),
        "{}",
        stderr(&out)
    );
}

/// The daemon reads a changed `flow.toml` at its next pass: a changed schedule is
/// recorded `changed` and fires by its new cron from its next tick; a new one starts.
#[test]
fn a_changed_flow_toml_takes_effect_at_the_next_tick_without_a_restart() {
    let db = TestDb::new(Backend::Sqlite);
    config(&db, "* * * * * *", "overlap = \"allow\"", QUICK);
    let mut d = Daemon::start(&db, "d", &["--poll-interval", "100ms"], &[]);
    std::thread::sleep(Duration::from_millis(2500));
    let changed_at = chrono::Utc::now().timestamp();
    // A new mtime second for sure, then the new file.
    std::thread::sleep(Duration::from_millis(1100));
    db.write(
        "flow.toml",
        "[[schedules]]\nid = \"every\"\nworkflow = \"w.yaml\"\ncron = \"*/3 * * * * *\"\noverlap = \"allow\"\ninputs = { at = \"${{ schedule.time }}\" }\n\n[[schedules]]\nid = \"other\"\nworkflow = \"w.yaml\"\ncron = \"* * * * * *\"\ninputs = { at = \"x\" }\n",
    );
    std::thread::sleep(Duration::from_secs(7));
    d.signal("-TERM");
    let _ = d.wait(Duration::from_secs(30));
    let h = history(&db);
    assert!(h.iter().any(|e| e.0 == "changed"), "{h:?}\n{}", d.log());
    let late: Vec<i64> = h
        .iter()
        .filter(|e| e.0 == "started" && seconds(&e.1) > changed_at + 2)
        .map(|e| seconds(&e.1))
        .collect();
    assert!(!late.is_empty(), "{h:?}");
    assert!(
        late.iter().all(|s| s % 3 == 0),
        "after the change only every third second: {late:?}"
    );
    let out = output(db.flow().args(["schedules", "history", "other", "--json"]));
    let other: Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert!(
        other
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["outcome"] == "started")),
        "the new schedule fired: {other}"
    );
}

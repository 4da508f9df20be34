//! Retention through the real binary, on both backends: `flow gc` SIGKILLed at random
//! moments leaves every run whole or gone — no row of a deleted run in any table, a
//! tombstone for every key a deleted run sent — keeps a paused run with a call in
//! doubt and a cancelled one with its call still in doubt, and a new run presenting a
//! deleted run's key is refused without a request leaving (the downstream counts).

use std::process::Stdio;
use std::time::Duration;

use flow_adapters::testkit::http::CountingServer;
use rand::Rng;
use sqlx::Connection;

use crate::support::{TestDb, backends, output, run_id, runtime, stderr, stdout};

/// Runs submitted and drained before the kills.
const RUNS: usize = 60;

/// SIGKILLs of `flow gc`.
const KILLS: usize = 12;

fn workflow(url: &str) -> String {
    format!(
        r#"name: pay
inputs:
  n: {{ type: integer, required: true }}
tools:
  echo: {{ kind: function, function: core.echo }}
  pay: {{ kind: http, method: POST, url: "{url}/pay" }}
nodes:
  prepare: {{ tool: echo, with: {{ n: "${{{{ inputs.n }}}}" }} }}
  charge:
    needs: [prepare]
    tool: pay
    idempotency_key: "order-${{{{ inputs.n }}}}"
    with: {{ n: "${{{{ inputs.n }}}}" }}
"#
    )
}

/// One integer asked of the database directly.
async fn scalar(url: &str, sql: &str) -> i64 {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).fetch_one(&mut c).await.expect(url)
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).fetch_one(&mut c).await.expect(url)
    }
}

/// Tables holding rows of one run, with their run column.
const RUN_TABLES: [(&str, &str); 13] = [
    ("steps", "run_id"),
    ("tool_calls", "run_id"),
    ("tool_call_attempts", "run_id"),
    ("usage", "run_id"),
    ("call_probes", "run_id"),
    ("call_reconcile", "run_id"),
    ("approvals", "run_id"),
    ("approval_votes", "run_id"),
    ("waits", "run_id"),
    ("callback_tokens", "run_id"),
    ("fanouts", "run_id"),
    ("run_inputs", "run_id"),
    ("runs", "parent_run_id"),
];

/// Every run is whole or gone: no table holds a row of a run that is not there, every
/// run left has its steps, and every run gone left a tombstone for its key.
async fn whole_or_gone(db: &TestDb, ctx: &str) -> i64 {
    for (table, col) in RUN_TABLES {
        let orphans = scalar(
            &db.url,
            &format!(
                "SELECT COUNT(*) FROM {table} t WHERE t.{col} IS NOT NULL AND NOT EXISTS \
                 (SELECT 1 FROM runs r WHERE r.id = t.{col})"
            ),
        )
        .await;
        assert_eq!(orphans, 0, "{ctx}: rows of deleted runs left in {table}");
    }
    let stepless = scalar(
        &db.url,
        "SELECT COUNT(*) FROM runs r WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id)",
    )
    .await;
    assert_eq!(stepless, 0, "{ctx}: a run lost its steps but not its row");
    let left = scalar(&db.url, "SELECT COUNT(*) FROM runs").await;
    let tombstones = scalar(&db.url, "SELECT COUNT(*) FROM key_tombstones").await;
    let gone = i64::try_from(RUNS + 2).expect("count") - left;
    assert_eq!(
        tombstones, gone,
        "{ctx}: one tombstone per deleted run's key"
    );
    let unmatched = scalar(
        &db.url,
        "SELECT COUNT(*) FROM key_tombstones k WHERE EXISTS (SELECT 1 FROM runs r WHERE r.id = k.run_id)",
    )
    .await;
    assert_eq!(unmatched, 0, "{ctx}: a tombstone of a run still there");
    left
}

/// A run whose `charge` is in doubt: killed after its outbound mark, then resumed.
fn in_doubt(db: &TestDb, file: &std::path::Path, n: usize) -> String {
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(file)
            .args(["--input", &format!("n={n}")])
            .env("FLOW_FAULT", "after_outbound:charge"),
    );
    assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
    let run = run_id(&crashed);
    let resumed = output(db.flow().args(["resume", &run]));
    assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
    run
}

fn fill(db: &TestDb, file: &std::path::Path) -> (String, String) {
    for n in 0..RUNS {
        let out = output(
            db.flow()
                .arg("submit")
                .arg(file)
                .args(["--input", &format!("n={n}")]),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = output(db.flow().args(["daemon", "--exit-when-idle"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let paused = in_doubt(db, file, 1000);
    let cancelled = in_doubt(db, file, 1001);
    let out = output(db.flow().args(["cancel", &cancelled]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (paused, cancelled)
}

#[test]
fn gc_killed_at_random_leaves_every_run_whole_or_gone_and_keys_stay_refused() {
    for backend in backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let file = db.write("pay.yaml", &workflow(&server.url()));
        db.write(
            "flow.toml",
            "[retention]\nruns = \"1s\"\nevents = \"1s\"\nkeys = \"1d\"\n",
        );
        let (paused, cancelled) = fill(&db, &file);
        std::thread::sleep(Duration::from_millis(1_200));
        let dry = output(db.flow().args(["gc", "--dry-run", "--json"]));
        assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
        let report: serde_json::Value = serde_json::from_str(&stdout(&dry)).expect("json");
        assert_eq!(report["runs_deleted"], RUNS, "{report:#}");
        assert_eq!(
            report["runs_kept"], 1,
            "the cancelled run in doubt: {report:#}"
        );
        assert_eq!(
            rt.block_on(whole_or_gone(&db, "dry run")),
            i64::try_from(RUNS + 2).expect("n")
        );
        let mut rng = rand::rng();
        let mut lefts = Vec::new();
        for kill in 0..KILLS {
            // Every other pass is paced (long, killed anywhere in it); the others run
            // flat out and are killed early, inside their first transactions.
            let (args, wait) = if kill % 2 == 0 {
                (vec!["gc", "--rate", "150"], rng.random_range(50..1_500))
            } else {
                (vec!["gc"], rng.random_range(5..60))
            };
            let mut child = db
                .flow()
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn gc");
            std::thread::sleep(Duration::from_millis(wait));
            let _ = child.kill();
            let _ = child.wait();
            let left = rt.block_on(whole_or_gone(&db, &format!("{backend:?} kill {kill}")));
            lefts.push(left);
        }
        eprintln!("{backend:?}: runs left after each kill: {lefts:?}");
        assert!(
            lefts
                .iter()
                .any(|l| *l > 2 && *l < i64::try_from(RUNS + 2).expect("n")),
            "{backend:?}: no kill landed in the middle of a pass: {lefts:?}"
        );
        let out = output(db.flow().args(["gc"]));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let left = rt.block_on(whole_or_gone(&db, "after the last gc"));
        assert_eq!(left, 2, "{backend:?}: only the two runs in doubt stay");
        for run in [&paused, &cancelled] {
            let out = output(db.flow().args(["show", run, "--json"]));
            assert_eq!(
                out.status.code(),
                Some(0),
                "{run} is kept: {}",
                stderr(&out)
            );
        }
        // A new run with a deleted run's key is refused; nothing reaches the downstream.
        let before = server.count("order-7:1");
        assert_eq!(before, 1, "{backend:?}");
        let again = output(db.flow().arg("run").arg(&file).args(["--input", "n=7"]));
        let err = stderr(&again);
        assert_eq!(again.status.code(), Some(1), "{backend:?}: {err}");
        assert!(
            err.contains("idempotency key `order-7` was used by run")
                && err.contains("deleted by retention on"),
            "{backend:?}: {err}"
        );
        assert_eq!(
            server.count("order-7:1"),
            1,
            "{backend:?}: the key was not sent again"
        );
        // A key never used goes through.
        let fresh = output(db.flow().arg("run").arg(&file).args(["--input", "n=99"]));
        assert_eq!(
            fresh.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&fresh)
        );
        drop(db);
        rt.block_on(server.shutdown());
    }
}

/// The runs the ledger holds.
fn runs_left(db: &TestDb) -> usize {
    let out = output(db.flow().args(["runs", "--json", "--limit", "100"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("runs json");
    list.as_array().map_or(0, Vec::len)
}

/// A daemon with `[retention]` deletes finished runs in the background, no faster than
/// `rate` rows per second, and counts what it deleted in `flow_retention_deleted_total`.
#[test]
fn a_daemon_deletes_in_the_background_at_its_rate_and_counts_it() {
    const N: usize = 20;
    const RATE: u64 = 40;
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let file = db.write(
        "note.yaml",
        "name: note\ninputs:\n  n: { type: integer, required: true }\ntools:\n  note: { kind: command, command: [\"true\"] }\nnodes:\n  a: { tool: note }\n",
    );
    db.write(
        "flow.toml",
        &format!("[retention]\nruns = \"1s\"\nevents = \"1s\"\ninterval = \"1s\"\nrate = {RATE}\n"),
    );
    for n in 0..N {
        let out = output(
            db.flow()
                .arg("submit")
                .arg(&file)
                .args(["--input", &format!("n={n}")]),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let addr = crate::daemon::free_port();
    let metrics_addr = addr.to_string();
    let args = ["--poll-interval", "100ms", "--metrics-addr", &metrics_addr];
    let mut d = crate::daemon::Daemon::start(&db, "d", &args, &[]);
    let start = std::time::Instant::now();
    let (mut first_gone, mut all_gone) = (None, None);
    while start.elapsed() < Duration::from_secs(60) {
        let left = runs_left(&db);
        if left < N && first_gone.is_none() {
            first_gone = Some(start.elapsed());
        }
        if left == 0 {
            all_gone = Some(start.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, text) = crate::daemon::http_get(addr, "/metrics").expect("metrics");
    d.signal("-TERM");
    let _ = d.wait(Duration::from_secs(30));
    let log = d.log();
    assert!(
        log.contains("retention on (runs 1s, events 1s), at most 40 rows/s"),
        "{log}"
    );
    let (Some(first), Some(all)) = (first_gone, all_gone) else {
        panic!("the daemon did not delete every run within 60 s: {log}");
    };
    assert_eq!(code, 200);
    let counted = |table: &str| -> u64 {
        let prefix = format!("flow_retention_deleted_total{{table=\"{table}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(counted("runs"), N as u64, "{text}");
    assert!(
        counted("steps") >= N as u64 && counted("tool_calls") >= N as u64,
        "{text}"
    );
    // Paced: the rows of the runs after the first took at least rows / rate seconds.
    let rows: u64 = text
        .lines()
        .filter(|l| l.starts_with("flow_retention_deleted_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    #[allow(clippy::cast_precision_loss)]
    let floor = (rows as f64 / RATE as f64) * 0.6;
    assert!(
        (all - first).as_secs_f64() >= floor,
        "{rows} rows deleted in {:?}, faster than {RATE}/s allows",
        all - first
    );
}

/// A run id a deleted run used, submitted again: refused at submit, naming the deleted
/// run, with nothing sent — its keys (derived from the id) are retired. Issue 49 (12):
/// the new run was accepted and refused node by node, after its first node had sent.
#[test]
fn a_deleted_runs_id_is_refused_at_submit_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let url = server.url();
        let file = db.write(
            "two.yaml",
            &format!(
                "name: two\ntools:\n  pay: {{ kind: http, method: POST, url: \"{url}/pay\" }}\nnodes:\n  a: {{ tool: pay }}\n  b: {{ tool: pay, needs: [a] }}\n"
            ),
        );
        db.write("flow.toml", "[retention]\nruns = \"1s\"\nkeys = \"1d\"\n");
        let id = "run_order_1042";
        let first = output(db.flow().arg("run").arg(&file).args(["--run-id", id]));
        assert_eq!(first.status.code(), Some(0), "{ctx}: {}", stderr(&first));
        assert_eq!(server.total(), 2, "{ctx}");
        std::thread::sleep(Duration::from_millis(1_200));
        let gc = output(db.flow().args(["gc"]));
        assert_eq!(gc.status.code(), Some(0), "{ctx}: {}", stderr(&gc));
        for cmd in ["run", "submit"] {
            let again = output(db.flow().arg(cmd).arg(&file).args(["--run-id", id]));
            let err = stderr(&again);
            assert_eq!(again.status.code(), Some(2), "{ctx} {cmd}: {err}");
            assert!(
                err.contains(&format!(
                    "run id `{id}` was used by a run deleted by retention"
                )),
                "{ctx} {cmd}: {err}"
            );
        }
        assert_eq!(server.total(), 2, "{ctx}: nothing sent under the old id");
        let out = output(db.flow().args(["runs", "--json"]));
        assert_eq!(stdout(&out).trim(), "[]", "{ctx}: no run was created");
    }
}

//! Commands flow prints for an operator to paste repeat the global options that differ
//! from their defaults, so the pasted command reaches the same ledger: here, the line a
//! daemon logs when a run it executed pauses in doubt.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};

use crate::support::{Backend, TestDb, output, runtime, stderr};

#[test]
fn a_daemons_paused_run_line_names_the_ledger_it_came_from() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/pay", Behavior::hold(Duration::from_secs(3)));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "pay.yaml",
        &format!(
            "name: pay\ntools:\n  pay: {{ kind: http, method: POST, url: \"{}/pay\", timeout: 300ms }}\nnodes:\n  charge: {{ tool: pay }}\n",
            server.url()
        ),
    );
    let submitted = output(db.flow().arg("submit").arg(&file));
    assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
    let run = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .to_string();
    let daemon = output(
        db.flow()
            .args(["daemon", "--exit-when-idle", "--poll-interval", "100ms"]),
    );
    assert_eq!(daemon.status.code(), Some(0), "{}", stderr(&daemon));
    let want = format!("see `flow --db {} show {run}`", db.url);
    assert!(
        stderr(&daemon).contains(&want),
        "no `{want}` in:\n{}",
        stderr(&daemon)
    );
    // And the pasted command works from anywhere.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let pasted = output(
        crate::support::flow()
            .current_dir(elsewhere.path())
            .args(["--db", &db.url, "show", &run]),
    );
    assert_eq!(pasted.status.code(), Some(0), "{}", stderr(&pasted));
}

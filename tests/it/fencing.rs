//! A worker that lost its lease never sends: the fence under a pause.
//!
//! Worker A (`flow run`, 2 s leases) marks a call outbound and is paused right there
//! (`FLOW_FAULT=after_outbound:charge` with `FLOW_FAULT_ACTION=stop`: a SIGSTOP, as a GC
//! pause, a debugger or a frozen VM). Its lease runs out; worker B (`flow resume`) takes
//! the run over, finds the call in doubt, and an operator — who sees nothing at the
//! downstream — resolves it: `retry` (B re-sends the same key) or `failed` and then
//! redrives (B sends the next key). Then A is continued, with a 300 s attempt timeout
//! still ahead of it. Before the fence, A sent its stale request when it woke: the same
//! key twice, or two effects under two keys while the ledger said attempt 1 failed. Now
//! A checks its lease by its own monotonic clock before the request is handed to the
//! transport, sends nothing, and stops. The downstream counts requests per key.
//!
//! `FLOW_FENCING_REPS` repeats each case (default 1; the resolution note quotes 20).

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;

use crate::support::{Backend, TestDb, backends, call, output, runtime, show, stderr};

/// One charge, not idempotent, with an attempt timeout far beyond the lease.
fn workflow(url: &str) -> String {
    format!(
        r#"name: pay
tools:
  pay: {{ kind: http, method: POST, url: "{url}/pay" }}
nodes:
  charge:
    tool: pay
    timeout: 300s
    with: {{ amount: 10 }}
"#
    )
}

/// How the operator settles the call B finds in doubt.
#[derive(Debug, Clone, Copy)]
enum Settle {
    /// `--resolve charge=retry`: B sends the same key again.
    Retry,
    /// `--resolve charge=failed`, then `flow redrive` and `flow resume`: B sends key 2.
    FailedThenRedrive,
}

#[test]
fn a_paused_worker_whose_lease_was_taken_over_sends_nothing_when_it_wakes() {
    let reps: u32 = std::env::var("FLOW_FENCING_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for backend in backends() {
        for settle in [Settle::Retry, Settle::FailedThenRedrive] {
            for rep in 0..reps {
                stale_holder(backend, settle, rep);
            }
        }
    }
}

fn stale_holder(backend: Backend, settle: Settle, rep: u32) {
    let ctx = format!("{backend:?} {settle:?} #{rep}");
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&down.url()));

    // A: marks the charge outbound, then stops itself before sending.
    let a_log = db.dir.path().join("a.stderr");
    let mut a = Paused::spawn(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_FAULT", "after_outbound:charge")
            .env("FLOW_FAULT_ACTION", "stop")
            .env("FLOW_LEASE", "2s"),
        &a_log,
    );
    a.wait_stopped(&ctx);
    let run = crate::support::run_id_in_text(&a.said());
    let key1 = format!("{run}:charge:1");
    // Past A's lease (2 s from its last renewal, which came before the mark).
    std::thread::sleep(Duration::from_millis(2_500));

    // B takes the run over and finds the call in doubt; nothing has arrived.
    let taken = output(db.flow().args(["resume", &run]));
    assert_eq!(
        taken.status.code(),
        Some(3),
        "{ctx}: B pauses in doubt\n{}",
        stderr(&taken)
    );
    let found = show(&db, &run);
    assert_eq!(call(&found, "charge")["status"], "in_doubt", "{ctx}");
    // A was stopped, not dead: its lease end is what the person resolving is shown.
    let until = call(&found, "charge")["holder_lease_until"].clone();
    assert!(until.is_string(), "{ctx}: {until}");
    let text = crate::support::stdout(&output(db.flow().args(["show", &run])));
    assert!(
        text.contains("taken over from a worker whose lease"),
        "{ctx}: {text}"
    );
    assert_eq!(down.total(), 0, "{ctx}: the paused worker sent nothing yet");

    // The operator sees nothing at the downstream and settles.
    match settle {
        Settle::Retry => {
            let out = output(
                db.flow()
                    .args(["resume", &run, "--resolve", "charge=retry"]),
            );
            assert_eq!(out.status.code(), Some(0), "{ctx}\n{}", stderr(&out));
        }
        Settle::FailedThenRedrive => {
            let out = output(
                db.flow()
                    .args(["resume", &run, "--resolve", "charge=failed"]),
            );
            assert_eq!(out.status.code(), Some(1), "{ctx}\n{}", stderr(&out));
            let out = output(db.flow().args(["redrive", &run]));
            assert_eq!(out.status.code(), Some(0), "{ctx}\n{}", stderr(&out));
            let out = output(db.flow().args(["resume", &run]));
            assert_eq!(out.status.code(), Some(0), "{ctx}\n{}", stderr(&out));
        }
    }
    assert_eq!(show(&db, &run)["run"]["status"], "succeeded", "{ctx}");

    // A wakes with 300 s of its attempt timeout left.
    let woke = a.resume_and_wait(&ctx);
    let key2 = format!("{run}:charge:2");
    let (want1, want2) = match settle {
        Settle::Retry => (1, 0),
        Settle::FailedThenRedrive => (0, 1),
    };
    assert_eq!(
        (down.count(&key1), down.count(&key2), down.total()),
        (want1, want2, 1),
        "{ctx}: one effect, sent by B alone (A said:\n{woke})"
    );
    assert!(
        woke.contains("not sending: the lease"),
        "{ctx}: A says why it did not send:\n{woke}"
    );
    assert_eq!(show(&db, &run)["run"]["status"], "succeeded", "{ctx}");
}

/// A `flow` child whose stderr goes to a file, so it can be read while the child is
/// stopped.
struct Paused {
    child: Child,
    log: std::path::PathBuf,
}

impl Paused {
    fn spawn(cmd: &mut std::process::Command, log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("stderr file");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn flow");
        Paused {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Waits until the process is stopped (state `T` in /proc).
    fn wait_stopped(&mut self, ctx: &str) {
        let stat = format!("/proc/{}/stat", self.child.id());
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let state = std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_string()))
                .and_then(|rest| rest.chars().next());
            if state == Some('T') {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{ctx}: A exited ({status}) before its pause:\n{}",
                    self.said()
                );
            }
            assert!(
                Instant::now() < until,
                "{ctx}: A never paused:\n{}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Continues the process and waits for it to exit on its own; what it said.
    fn resume_and_wait(&mut self, ctx: &str) -> String {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.said();
            }
            assert!(
                Instant::now() < until,
                "{ctx}: A did not stop after waking:\n{}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn said(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

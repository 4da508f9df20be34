//! Helpers shared by the end-to-end tests: run the real binary, find repository files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::flags;

/// The repository root (where `workflows/` lives).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether committed goldens are to be rewritten: `FLOW_BLESS` on (the same rule as
/// `CI`, `flow_adapters::testkit::flags`). Under CI that is a failure: CI checks the
/// committed files, and a rewrite there would let whatever the code printed pass.
pub fn bless() -> bool {
    let bless = flags::env_flag("FLOW_BLESS");
    assert!(
        !(bless && flags::ci()),
        "FLOW_BLESS is set under CI: CI checks the committed goldens and never rewrites them"
    );
    bless
}

/// Checks the committed file `path` (a golden) against `actual`, after rewriting it
/// with it when [`bless`] says so. `Err` says what differs, for the caller's report.
pub fn golden(path: &Path, actual: &str) -> Result<(), String> {
    if bless() {
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    match std::fs::read_to_string(path) {
        Ok(want) if want == actual => Ok(()),
        Ok(want) => Err(format!("--- want\n{want}--- got\n{actual}")),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// A `flow` command run from the repository root with a clean flow environment.
pub fn flow() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flow"));
    cmd.current_dir(repo());
    // OpenTelemetry's variables too: a collector configured around the test run must
    // not receive (or slow) every test's spans.
    for (key, _) in std::env::vars() {
        if key.starts_with("FLOW_") || key.starts_with("OTEL_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// How long one `flow` command in a test may take before it is called hung: far more
/// than any command here needs (a resume waits at most one 30 s lease), far less than
/// nextest's kill, so a hang fails with evidence instead of a bare timeout.
const CHILD_DEADLINE: Duration = Duration::from_secs(100);

/// Runs a command and returns its output (stdin empty, stdout and stderr captured: a
/// `Stdio` set on `cmd` before is replaced), failing the test if it cannot start or if it
/// runs past [`CHILD_DEADLINE`]; then the panic carries the child's stderr so far, its
/// kernel stack and a backtrace of every thread (gdb), and the child is killed.
pub fn output(cmd: &mut Command) -> Output {
    let started = Instant::now();
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!("cannot run {cmd:?}: {e}"),
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > CHILD_DEADLINE => {
                let pid = child.id();
                let evidence = hang_evidence(pid);
                let _ = child.kill();
                let _ = child.wait();
                let err = stderr.join().unwrap_or_default();
                panic!(
                    "{cmd:?} (pid {pid}) still running after {CHILD_DEADLINE:?}; killed.\n\
                     --- its stderr ---\n{}\n{evidence}",
                    String::from_utf8_lossy(&err)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("cannot wait for {cmd:?}: {e}"),
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Reads a child's pipe to the end on a thread (so a full pipe never blocks the child).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

/// What a hung process is doing: its state, its kernel stacks, the test databases'
/// PostgreSQL sessions (waits and blockers) and gdb's backtrace of every thread. Best
/// effort: each part says why it is missing.
fn hang_evidence(pid: u32) -> String {
    let mut out = String::new();
    let read = |path: String| {
        std::fs::read_to_string(&path).unwrap_or_else(|e| format!("({path}: {e})\n"))
    };
    out.push_str("--- /proc status ---\n");
    out.push_str(&read(format!("/proc/{pid}/status")));
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.filter_map(Result::ok) {
            let tid = task.file_name().to_string_lossy().into_owned();
            out.push_str(&format!(
                "--- task {tid} ({}) wchan {} ---\n{}",
                read(format!("/proc/{pid}/task/{tid}/comm")).trim(),
                read(format!("/proc/{pid}/task/{tid}/wchan")).trim(),
                read(format!("/proc/{pid}/task/{tid}/stack")),
            ));
        }
    }
    // A `flow` waiting on PostgreSQL: which backends wait, on what, behind whom.
    let sql = "SELECT pid, datname, state, wait_event_type, wait_event, \
               pg_blocking_pids(pid) AS blocked_by, left(query, 120) AS query \
               FROM pg_stat_activity WHERE backend_type = 'client backend' \
               AND datname LIKE 'flow_it_%'";
    match pg_client("psql")
        .args(["-d", "test", "-c", sql])
        .stdin(Stdio::null())
        .output()
    {
        Ok(ps) => {
            out.push_str("--- PostgreSQL sessions of the tests ---\n");
            out.push_str(&String::from_utf8_lossy(&ps.stdout));
            out.push_str(&String::from_utf8_lossy(&ps.stderr));
        }
        Err(e) => out.push_str(&format!("(psql: {e})\n")),
    }
    match Command::new("gdb")
        .args([
            "-batch",
            "-nx",
            "-p",
            &pid.to_string(),
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .output()
    {
        Ok(gdb) => {
            out.push_str("--- gdb ---\n");
            out.push_str(&String::from_utf8_lossy(&gdb.stdout));
            out.push_str(&String::from_utf8_lossy(&gdb.stderr));
        }
        Err(e) => out.push_str(&format!("(gdb: {e})\n")),
    }
    out
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

/// The two ledger backends every behaviour is tested on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in a temp dir.
    Sqlite,
    /// A fresh database on the local PostgreSQL server.
    Postgres,
}

/// The PostgreSQL server's admin URL (database `test`).
pub fn postgres_admin() -> (String, String) {
    let host = std::env::var("FLOW_TEST_PG_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("FLOW_TEST_PG_PORT").unwrap_or_else(|_| "5432".into());
    (host, port)
}

/// A PostgreSQL client program (`psql`, `pg_dump`) pointed at the test server as its
/// superuser: the arguments every test that reaches the server by hand needs.
pub fn pg_client(program: &str) -> Command {
    let (host, port) = postgres_admin();
    let mut cmd = Command::new(program);
    cmd.args(["-h", &host, "-p", &port, "-U", "postgres"]);
    cmd
}

fn psql(sql: &str) -> Result<(), String> {
    let out = pg_client("psql")
        .args(["-d", "test", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether PostgreSQL answers. Without it a local run skips the PostgreSQL half loudly;
/// under `CI` (`flags::ci`) that is a failure.
pub fn postgres_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| match psql("SELECT 1") {
        Ok(()) => true,
        Err(e) => {
            assert!(!flags::ci(), "CI is set but PostgreSQL is not reachable: {e}");
            eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n!! PostgreSQL is not reachable ({e}).\n!! SKIPPING the PostgreSQL half of the end-to-end tests. CI always runs it.\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
            false
        }
    })
}

/// The backends to run a test on: SQLite always, PostgreSQL when it answers.
pub fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::Sqlite];
    if postgres_available() {
        b.push(Backend::Postgres);
    }
    b
}

/// A ledger for one test: a temp dir (also the working directory of `flow`) and a
/// database URL. A PostgreSQL database is dropped when this goes away.
pub struct TestDb {
    /// Working directory for the `flow` processes of this test.
    pub dir: tempfile::TempDir,
    /// `--db` URL.
    pub url: String,
    pg_name: Option<String>,
}

impl TestDb {
    /// A fresh ledger on `backend`.
    pub fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        match backend {
            Backend::Sqlite => {
                let url = format!("sqlite://{}", dir.path().join("flow.db").display());
                Self {
                    dir,
                    url,
                    pg_name: None,
                }
            }
            Backend::Postgres => {
                let name = format!(
                    "flow_it_{}",
                    ulid::Ulid::generate().to_string().to_lowercase()
                );
                psql(&format!("CREATE DATABASE {name}"))
                    .unwrap_or_else(|e| panic!("create database: {e}"));
                let (host, port) = postgres_admin();
                let url = format!("postgres://postgres@{host}:{port}/{name}");
                Self {
                    dir,
                    url,
                    pg_name: Some(name),
                }
            }
        }
    }

    /// `flow --db <url>` run in this test's directory.
    pub fn flow(&self) -> Command {
        let mut cmd = flow();
        cmd.current_dir(self.dir.path())
            .env("FLOW_DATABASE_URL", &self.url);
        cmd
    }

    /// Writes a file into the test directory and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            let _ = psql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// Asserts that `db` holds no run: a SQLite ledger that was never created holds none
/// (read commands do not create it, so that is checked first), else `flow runs --json`
/// lists none. Tests of refused commands use it to show nothing was written.
pub fn no_runs(db: &TestDb) {
    if let Some(path) = db.url.strip_prefix("sqlite://")
        && !Path::new(path).exists()
    {
        let out = output(db.flow().args(["runs", "--json"]));
        assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
        assert!(!Path::new(path).exists(), "flow runs created {path}");
        return;
    }
    let out = output(db.flow().args(["runs", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("runs --json: {e}"));
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");
}

/// A multi-thread tokio runtime for test servers that must keep serving while the test
/// thread waits on child processes.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
}

/// The run id printed on stderr as `run <id> started` (in `--log-format json`, the
/// `message` of a JSON line).
pub fn run_id(out: &Output) -> String {
    run_id_in_text(&stderr(out))
}

/// [`run_id`] from stderr text (a file a child process writes, say).
pub fn run_id_in_text(err: &str) -> String {
    err.lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| l.to_string())
        })
        .find_map(|l| {
            l.strip_prefix("run ")
                .and_then(|r| r.split_whitespace().next())
                .filter(|id| id.starts_with("run_"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no run id in stderr:\n{err}"))
}

/// `flow show RUN --json` as a value.
pub fn show(db: &TestDb, run: &str) -> serde_json::Value {
    let out = output(db.flow().args(["show", run, "--json"]));
    assert_eq!(out.status.code(), Some(0), "show failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("show --json is not JSON ({e}): {}", stdout(&out)))
}

/// The tool call of `node` in a `show --json` object.
pub fn call<'a>(show: &'a serde_json::Value, node: &str) -> &'a serde_json::Value {
    show["tool_calls"]
        .as_array()
        .and_then(|calls| calls.iter().find(|c| c["tool_call_id"] == node))
        .unwrap_or_else(|| panic!("no call for {node} in {show:#}"))
}

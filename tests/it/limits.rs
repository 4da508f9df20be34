//! Bounded reads and input limits through the real binary: endless streams (`/dev/zero`,
//! a FIFO) named as the workflow, `--inputs-file`, `--config` or `--secrets-file` are
//! refused within the 1 MiB limit in bounded time; deeply nested inputs files are
//! refused at once; oversize and duplicate `--input`s are refused before anything is
//! written.
//!
//! The children run under `ulimit -v` (4 GiB): a regression that reads a stream to its
//! end then fails fast with an allocation failure instead of taking the machine's
//! memory until the OOM killer acts.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::{Backend, TestDb, backends, no_runs, output, stderr};

/// Within this, every refusal here must have happened (they take milliseconds).
const BOUND: Duration = Duration::from_secs(5);

const WORKFLOW: &str = r#"name: limits
inputs:
  s: { type: string }
  t: { type: string }
  o: { type: object }
tools:
  echo: { kind: function, function: core.echo }
nodes:
  a: { tool: echo, with: { s: "${{ inputs.s }}" } }
"#;

/// `cmd` (a `flow` command) run under a 4 GiB address-space limit.
fn capped(cmd: &Command) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("ulimit -v 4194304 && exec \"$0\" \"$@\"")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        sh.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

/// Runs `args` under the cap, returning the output and how long it took.
fn timed(db: &TestDb, args: &[&str]) -> (Output, Duration) {
    let mut cmd = db.flow();
    cmd.args(args);
    let started = Instant::now();
    let out = output(&mut capped(&cmd));
    (out, started.elapsed())
}

fn assert_refused(out: &Output, took: Duration, what: &str, path: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert!(took < BOUND, "{what} took {took:?}");
    assert!(err.contains("1048576 bytes"), "{what}: the limit: {err}");
    assert!(err.contains(path), "{what}: the path: {err}");
}

#[test]
fn dev_zero_is_refused_at_the_limit_wherever_it_is_named() {
    let db = TestDb::new(Backend::Sqlite);
    let wf = db.write("wf.yaml", WORKFLOW);
    let wf = wf.to_str().expect("utf-8 path");
    let cases: [(&str, Vec<&str>); 6] = [
        ("validate", vec!["validate", "/dev/zero"]),
        ("run", vec!["run", "/dev/zero"]),
        ("submit", vec!["submit", "/dev/zero"]),
        (
            "--inputs-file",
            vec!["run", wf, "--inputs-file", "/dev/zero"],
        ),
        ("--config", vec!["--config", "/dev/zero", "run", wf]),
        (
            "--secrets-file",
            vec!["--secrets-file", "/dev/zero", "run", wf],
        ),
    ];
    for (what, args) in cases {
        let (out, took) = timed(&db, &args);
        assert_refused(&out, took, what, "/dev/zero");
        eprintln!("{what}: refused /dev/zero in {took:?}");
    }
    no_runs(&db);
}

/// A FIFO fed `len` bytes of `fill` by a thread; the thread ends when the reader closes.
fn fifo(dir: &Path, name: &str, fill: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
    let path = dir.join(name);
    let status = Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo");
    let writer_path = path.clone();
    let writer = std::thread::spawn(move || {
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&writer_path) {
            // The reader stops at the limit and closes: EPIPE here is expected.
            let _ = f.write_all(&fill);
        }
    });
    (path.display().to_string(), writer)
}

#[test]
fn a_fifo_fed_past_the_limit_is_refused_and_one_within_it_is_read() {
    let db = TestDb::new(Backend::Sqlite);
    // 3 MiB of YAML comments: valid text, just too much of it.
    let (big, writer) = fifo(db.dir.path(), "big.yaml", b"# filler\n".repeat(350_000));
    let (out, took) = timed(&db, &["validate", &big]);
    assert_refused(&out, took, "validate FIFO", &big);
    writer.join().expect("writer thread");

    let wf = db.write("wf.yaml", WORKFLOW);
    let (inputs, writer) = fifo(db.dir.path(), "inputs.yaml", b"# filler\n".repeat(350_000));
    let (out, took) = timed(
        &db,
        &["run", wf.to_str().expect("path"), "--inputs-file", &inputs],
    );
    assert_refused(&out, took, "--inputs-file FIFO", &inputs);
    writer.join().expect("writer thread");

    let (small, writer) = fifo(db.dir.path(), "small.yaml", WORKFLOW.as_bytes().to_vec());
    let (out, _) = timed(&db, &["validate", &small]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    writer.join().expect("writer thread");
    no_runs(&db);
}

#[test]
fn a_deeply_nested_inputs_file_is_refused_at_once() {
    let db = TestDb::new(Backend::Sqlite);
    let wf = db.write("wf.yaml", WORKFLOW);
    let deep = 100_000;
    let files = [
        (
            "deep.json",
            format!("{{\"o\": {}{}}}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            "deep.yaml",
            format!("o:\n  k: {}{}\n", "{a: ".repeat(deep), "}".repeat(deep)),
        ),
        (
            "block.yaml",
            format!("o:\n  k:\n    {}x\n", "- ".repeat(deep)),
        ),
    ];
    for (name, text) in files {
        let path = db.write(name, &text);
        let (out, took) = timed(
            &db,
            &[
                "run",
                wf.to_str().expect("path"),
                "--inputs-file",
                path.to_str().expect("path"),
            ],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
        assert!(err.contains("nested more than 64"), "{name}: {err}");
        eprintln!("{name}: refused in {took:?}");
    }
    no_runs(&db);
}

#[test]
fn oversize_inputs_are_refused_before_anything_is_written() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let wf = db.write("wf.yaml", WORKFLOW);
        let wf = wf.to_str().expect("path");
        // One argument may hold at most 128 KiB (Linux), so the total is made of several.
        let chunk = format!("{{\"k\": \"{}\"}}", "x".repeat(120 * 1024));
        let third = "y".repeat(120 * 1024);
        let inputs = db.write("in.json", &format!("{{\"o\": {chunk}}}"));
        let mut big_file = String::from("{\"o\": {");
        for i in 0..7 {
            big_file.push_str(&format!("\"k{i}\": \"{third}\","));
        }
        big_file.push_str("\"end\": 1}}");
        let big_inputs = db.write("big.json", &big_file);
        for command in ["run", "submit"] {
            let (out, took) = timed(
                &db,
                &[
                    command,
                    wf,
                    "--inputs-file",
                    big_inputs.to_str().expect("path"),
                    "--input",
                    &format!("s={third}"),
                    "--input",
                    &format!("t={third}"),
                ],
            );
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{backend:?} {command}: {err}");
            assert!(took < BOUND, "{took:?}");
            assert!(
                err.contains("over the limit of 1048576 bytes"),
                "{backend:?} {command}: {err}"
            );
        }
        no_runs(&db);
        // Under the limit: accepted.
        let out = output(db.flow().args([
            "run",
            wf,
            "--inputs-file",
            inputs.to_str().expect("path"),
            "--input",
            &format!("s={third}"),
        ]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    }
}

#[test]
fn a_duplicate_input_is_refused() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let wf = db.write("wf.yaml", WORKFLOW);
        for command in ["run", "submit"] {
            let out = output(db.flow().args([
                command,
                wf.to_str().expect("path"),
                "--input",
                "s=first",
                "--input",
                "s=second",
            ]));
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{backend:?} {command}: {err}");
            assert!(err.contains("`s` is given twice"), "{err}");
        }
        no_runs(&db);
    }
}

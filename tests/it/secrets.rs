//! Secrets never reach disk or logs: not the database files, not `flow show --json`,
//! not logs at `RUST_LOG=trace`, not stored errors — even when the downstream echoes
//! the secret back.

use flow_adapters::testkit::http::{Behavior, CountingServer, EchoEncoding};

use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};

pub(crate) const SECRET: &str = "sk_live_Zq8v3N1xT7pW";

/// A downstream that echoes the secret back, and a second call quoting it (also used by
/// the events test: no secret in any event).
pub(crate) fn workflow(url: &str) -> String {
    format!(
        r#"name: secretive
tools:
  api:
    kind: http
    method: POST
    url: "{url}/echo"
    headers: {{ Authorization: "Bearer ${{{{ secrets.API_TOKEN }}}}" }}
  rejecting:
    kind: http
    method: POST
    url: "{url}/reject"
nodes:
  call:
    tool: api
    with: {{ token_in_body: "${{{{ secrets.API_TOKEN }}}}", note: "x-${{{{ secrets.API_TOKEN }}}}-y" }}
  denied:
    needs: [call]
    tool: rejecting
    with: {{ echoed: "${{{{ nodes.call.output }}}}", secret: "${{{{ secrets.API_TOKEN }}}}" }}
    continue_on_error: true
"#
    )
}

fn files_with(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                hits.push(path.display().to_string());
            }
        }
    }
    hits
}

#[test]
fn a_secret_appears_nowhere_even_when_echoed() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    // The echo document returns the request body, and a 400 body is quoted in errors.
    server.set(
        "/reject",
        Behavior::Json {
            status: 400,
            body: serde_json::json!({ "error": format!("bad token {SECRET}") }),
        },
    );
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("RUST_LOG", "trace"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The downstream did get the real value.
    let log = server.log();
    assert!(
        log.iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}"))),
        "the secret was not sent"
    );
    assert!(
        log.iter().any(|r| r.body.to_string().contains(SECRET)),
        "the secret was not in the body"
    );
    // Nothing flow wrote holds it.
    assert!(!stdout(&out).contains(SECRET), "stdout leaks the secret");
    assert!(stderr(&out).len() > 1000, "trace logs expected");
    assert!(!stderr(&out).contains(SECRET), "logs leak the secret");
    let run = run_id(&out);
    let s = show(&db, &run).to_string();
    assert!(!s.contains(SECRET), "show --json leaks the secret: {s}");
    assert!(
        s.contains("$secret"),
        "show should say where a secret was: {s}"
    );
    let human = output(db.flow().args(["show", &run]));
    assert!(!stdout(&human).contains(SECRET));
    assert!(
        files_with(db.dir.path(), SECRET).is_empty(),
        "database files leak the secret: {:?}",
        files_with(db.dir.path(), SECRET)
    );
    // Also after a crash that leaves the WAL un-checkpointed.
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("FLOW_FAULT", "after_complete:denied"),
    );
    assert_eq!(crashed.status.code(), None);
    assert!(
        files_with(db.dir.path(), SECRET).is_empty(),
        "database files leak the secret after a crash: {:?}",
        files_with(db.dir.path(), SECRET)
    );
}

#[test]
fn a_missing_secret_is_refused_before_anything_is_sent_or_written() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    // Node 1 needs no secret and would POST at once; node 2 needs one that is not set.
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: two-step
tools:
  post: {{ kind: http, method: POST, url: "{url}/first" }}
  api:
    kind: http
    method: POST
    url: "{url}/second"
    headers: {{ Authorization: "Bearer ${{{{ secrets.LATER_TOKEN }}}}" }}
nodes:
  first: {{ tool: post, with: {{ n: 1 }} }}
  second: {{ tool: api, needs: [first], with: {{ n: 2 }} }}
"#,
            url = server.url()
        ),
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("LATER_TOKEN")
            && err.contains("FLOW_SECRET_LATER_TOKEN")
            && err.contains("--secrets-file"),
        "{err}"
    );
    assert_eq!(server.total(), 0, "nothing may be sent");
    crate::support::no_runs(&db);
    // With the secret, the same file runs.
    let ok = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_LATER_TOKEN", "now-set-value"),
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(server.total(), 2);
}

/// A secret shorter than the documented minimum (5 bytes) cannot be scrubbed without
/// mangling output: every command that loads secrets refuses it at start with exit 2,
/// naming the secret and never its value, before the ledger is opened.
#[test]
fn a_secret_under_five_bytes_is_refused_at_start_by_name() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = crate::support::repo().join("workflows/hello.yaml");
    let hello = hello.display().to_string();
    db.write("secrets.env", "FILE_PIN=Zq9x\n");
    for (args, env) in [
        (vec!["run", &hello], Some("Zq9x")),
        (vec!["daemon", "--exit-when-idle"], Some("Zq9x")),
        (
            vec!["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"],
            Some("Zq9x"),
        ),
        (vec!["events", "dispatch", "--once"], Some("Zq9x")),
        (vec!["--secrets-file", "secrets.env", "run", &hello], None),
    ] {
        let mut cmd = db.flow();
        cmd.args(&args);
        if let Some(value) = env {
            cmd.env("FLOW_SECRET_PIN", value);
        }
        let out = output(&mut cmd);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let name = if env.is_some() { "PIN" } else { "FILE_PIN" };
        assert!(
            err.contains(&format!("secret `{name}` is shorter than 5 bytes")),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("Zq9x"),
            "{args:?}: the value was shown: {err}"
        );
        assert!(
            !db.dir.path().join("flow.db").exists(),
            "{args:?}: the ledger was opened"
        );
    }
    // Five bytes is enough.
    let ok = output(
        db.flow()
            .args(["run", &hello])
            .env("FLOW_SECRET_PIN", "Zq9xy"),
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
}

#[test]
fn resume_checks_every_secret_before_it_claims() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    // The first node's call completes, then the process dies.
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("FLOW_FAULT", "after_complete:call"),
    );
    assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
    let run = run_id(&crashed);
    let sent = server.total();
    let before = show(&db, &run);
    let out = output(db.flow().args(["resume", &run]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("FLOW_SECRET_API_TOKEN"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.total(), sent, "nothing more may be sent");
    assert_eq!(show(&db, &run), before, "nothing may be written");
}

#[test]
fn secrets_file_provides_values_and_the_environment_wins() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let secrets = db.write("secrets.env", "API_TOKEN=from-file-value\n");
    let out = output(
        db.flow()
            .arg("--secrets-file")
            .arg(&secrets)
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        server
            .log()
            .iter()
            .any(|r| r.header("authorization") == Some("Bearer from-file-value"))
    );
    let bad = db.write("bad.env", "API_TOKEN from-file-value-broken\n");
    let out = output(
        db.flow()
            .arg("--secrets-file")
            .arg(&bad)
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(
        !stderr(&out).contains("from-file-value-broken"),
        "{}",
        stderr(&out)
    );
}

/// The secret shapes of the matrix: each has characters some encoding changes.
const SHAPES: &[(&str, &str)] = &[
    ("QUOTE", "hunter\"2-quoted"),
    ("BACKSLASH", r"back\slash\\path"),
    ("B64CHARS", "AbC+dEf/GhI="),
    ("UNICODE", "pässwörd€"),
    ("NEWLINE", "first line\nsecond-line"),
    ("HTML", "<tag>&'amp'x"),
    ("SPACES", "open sesame now"),
    ("SHORT", "s3Kr1t"),
];

/// JSON string escaping (serde_json's), without the quotes.
fn json_escaped(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_string()
}

/// Rust `Debug` escaping without the quotes (tracing's text logs quote field values so).
fn debug_escaped(s: &str) -> String {
    let quoted = format!("{s:?}");
    quoted[1..quoted.len() - 1].to_string()
}

fn percent(s: &str, plus: bool, upper: bool) -> String {
    let mut out = String::new();
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b))
            }
            b' ' if plus => out.push('+'),
            _ if upper => out.push_str(&format!("%{b:02X}")),
            _ => out.push_str(&format!("%{b:02x}")),
        }
    }
    out
}

fn html_escaped(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The base64 characters that encode `s` alone wherever it sits in a longer text: for
/// each of the three alignments, the characters whose bits all come from `s`.
fn base64_cores(s: &str) -> Vec<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut cores = Vec::new();
    for k in 0..3usize {
        let mut bytes = vec![0u8; k];
        bytes.extend_from_slice(s.as_bytes());
        let bits = bytes.len() * 8;
        let first = (8 * k).div_ceil(6);
        let last = bits / 6; // exclusive
        let core: String = (first..last)
            .map(|i| {
                let bit = i * 6;
                let mut v = 0usize;
                for j in 0..6 {
                    let byte = bytes[(bit + j) / 8];
                    v = (v << 1) | usize::from((byte >> (7 - (bit + j) % 8)) & 1);
                }
                char::from(ALPHABET[v])
            })
            .collect();
        cores.push(core);
    }
    cores
}

/// Every form in which a secret could come back: raw, JSON-escaped (once and twice: a
/// JSON log of an error quoting a JSON body), Rust-debug-escaped, URL-encoded (`+` or
/// `%20`, either hex case), HTML-escaped, base64 — each of the value and of its
/// JSON-escaped form (what a JSON request body holds).
fn needles(secret: &str) -> Vec<String> {
    let mut out = Vec::new();
    for inner in [secret.to_string(), json_escaped(secret)] {
        let mut mid = vec![inner.clone(), html_escaped(&inner)];
        for plus in [true, false] {
            for upper in [true, false] {
                mid.push(percent(&inner, plus, upper));
            }
        }
        mid.extend(base64_cores(&inner));
        for m in mid {
            out.push(json_escaped(&m));
            out.push(json_escaped(&json_escaped(&m)));
            out.push(debug_escaped(&m));
            out.push(m);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The places of `text` where a form of a secret appears: `(shape, form)` pairs.
fn leaks(text: &[u8], shapes: &[(&str, &str)]) -> Vec<String> {
    let mut hits = Vec::new();
    for (name, secret) in shapes {
        for needle in needles(secret) {
            if !needle.is_empty() && text.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                hits.push(format!("{name}: {needle:?}"));
            }
        }
    }
    hits
}

/// `leaks` finds what it is for: each shape planted raw, JSON-escaped, percent-encoded
/// and base64-encoded (at each of the three alignments) inside other text, and nothing
/// in a text that only holds the stand-ins. Without this a broken `needles` would make
/// the scans above pass while finding nothing.
#[test]
fn leaks_finds_a_planted_secret_in_every_form() {
    use base64::Engine as _;
    assert!(leaks(br#"{"password":{"$secret":"SHORT"}} HTTP 400"#, SHAPES).is_empty());
    for (name, secret) in SHAPES {
        let one = [(*name, *secret)];
        let mut planted = vec![
            secret.to_string(),
            json_escaped(secret),
            percent(secret, true, false),
            html_escaped(secret),
        ];
        for pad in ["", "x", "xy"] {
            let text = format!("{pad}{secret}!");
            planted.push(base64::engine::general_purpose::STANDARD.encode(text));
        }
        for form in planted {
            let text = format!("error: downstream said <{form}> at 12:00");
            assert!(
                !leaks(text.as_bytes(), &one).is_empty(),
                "{name}: {form:?} was not found"
            );
        }
    }
}

/// One node per shape × echo encoding × outcome (200 or 400); every node POSTs its
/// secret in the JSON body and in the query string.
fn matrix_workflow(url: &str, shapes: &[(&str, &str)]) -> String {
    let mut text = format!(
        r#"name: secret-matrix
max_parallel: 16
tools:
  echo:
    kind: http
    method: POST
    url: "{url}/${{{{ with.path }}}}"
    query: {{ pw: "${{{{ with.password }}}}" }}
nodes:
"#
    );
    for (name, _) in shapes {
        for enc in EchoEncoding::ALL {
            for mode in ["ok", "err"] {
                let id = format!("{}-{}-{mode}", name.to_lowercase(), enc.name());
                text.push_str(&format!(
                    "  {id}:\n    tool: echo\n    continue_on_error: true\n    with: {{ path: \"{}/{mode}\", password: \"${{{{ secrets.{name} }}}}\", note: \"pw=${{{{ secrets.{name} }}}}!\" }}\n",
                    enc.name()
                ));
            }
        }
    }
    text
}

fn matrix_server(rt: &tokio::runtime::Runtime) -> CountingServer {
    let server = rt.block_on(CountingServer::start()).expect("server");
    for enc in EchoEncoding::ALL {
        for (mode, status) in [("ok", 200), ("err", 400)] {
            server.set(
                &format!("/{}/{mode}", enc.name()),
                Behavior::EchoBody {
                    status,
                    encoding: enc,
                },
            );
        }
    }
    server
}

fn with_secrets(cmd: &mut std::process::Command, shapes: &[(&str, &str)]) {
    for (name, value) in shapes {
        cmd.env(format!("FLOW_SECRET_{name}"), value);
    }
}

/// The SQLite files in `dir` (`flow.db` and its `-wal`/`-shm`), read for a raw scan.
/// The scan must have something to read: `flow.db` is there and not empty.
fn sqlite_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list the test directory") {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(name) = name.filter(|n| n.starts_with("flow.db")) {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            found.push((name, bytes));
        }
    }
    assert!(
        found.iter().any(|(n, b)| n == "flow.db" && !b.is_empty()),
        "no non-empty flow.db to scan in {}",
        dir.display()
    );
    found
}

/// Runs the matrix on `db` and checks every place flow writes; `files` also reads the
/// SQLite files raw.
fn check_matrix(db: &TestDb, shapes: &[(&str, &str)], files: bool) {
    let rt = runtime();
    let server = matrix_server(&rt);
    let wf = db.write("matrix.yaml", &matrix_workflow(&server.url(), shapes));
    let audit = db.dir.path().join("audit.jsonl");
    let config = db.write(
        "flow.toml",
        &format!(
            "[[consumers]]\nname = \"audit\"\nkind = \"file\"\npath = \"{}\"\n",
            audit.display()
        ),
    );
    let mut failures = Vec::new();
    let mut check = |place: &str, bytes: &[u8]| {
        let hits = leaks(bytes, shapes);
        if !hits.is_empty() {
            failures.push(format!("{place}: {}", hits.join(", ")));
        }
    };
    let mut runs = Vec::new();
    for format in ["text", "json"] {
        let mut cmd = db.flow();
        cmd.arg("--config")
            .arg(&config)
            .args(["--log-format", format, "run"])
            .arg(&wf)
            .env("RUST_LOG", "trace");
        with_secrets(&mut cmd, shapes);
        let out = output(&mut cmd);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(out.stderr.len() > 1000, "trace logs expected");
        check(&format!("`run` stdout ({format} logs)"), &out.stdout);
        check(
            &format!("stderr at RUST_LOG=trace, {format} logs"),
            &out.stderr,
        );
        runs.push(run_id(&out));
    }
    // The downstream did get every real value, and answered with every encoding of it.
    let log = server.log();
    assert_eq!(log.len(), 2 * shapes.len() * 2 * EchoEncoding::ALL.len());
    for (name, secret) in shapes {
        assert!(
            log.iter().any(|r| r.body["password"] == *secret),
            "{name} was not sent"
        );
    }
    for run in &runs {
        let json = output(db.flow().args(["show", run, "--json"]));
        assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
        let text = String::from_utf8_lossy(&json.stdout);
        assert!(text.contains("$secret"), "stand-ins expected: {text}");
        assert!(text.contains("HTTP 400"), "errors expected: {text}");
        check("`show --json`", &json.stdout);
        let human = output(db.flow().args(["show", run]));
        assert_eq!(human.status.code(), Some(0), "{}", stderr(&human));
        check("`show`", &human.stdout);
    }
    let dispatch = output(
        db.flow()
            .arg("--config")
            .arg(&config)
            .args(["events", "dispatch", "--once"]),
    );
    assert_eq!(dispatch.status.code(), Some(0), "{}", stderr(&dispatch));
    let events = output(
        db.flow()
            .arg("--config")
            .arg(&config)
            .args(["events", "--json", "--limit", "100000"]),
    );
    assert_eq!(events.status.code(), Some(0), "{}", stderr(&events));
    assert!(
        String::from_utf8_lossy(&events.stdout).contains("step.failed"),
        "events expected"
    );
    check("`events --json`", &events.stdout);
    let audit_bytes = std::fs::read(&audit).unwrap_or_else(|e| panic!("{}: {e}", audit.display()));
    assert!(
        !audit_bytes.is_empty(),
        "the events file is empty: nothing was scanned"
    );
    check("the events file", &audit_bytes);
    if files {
        for (name, bytes) in sqlite_files(db.dir.path()) {
            check(&name, &bytes);
        }
    } else {
        let dump = crate::connections::ledger_bytes(db);
        assert!(dump.len() > 1000, "a dump expected");
        check("pg_dump of the ledger", &dump);
    }
    assert!(
        failures.is_empty(),
        "secrets leaked:\n{}",
        failures.join("\n")
    );
}

#[test]
fn no_form_of_an_echoed_secret_reaches_sqlite_logs_show_or_events() {
    check_matrix(&TestDb::new(Backend::Sqlite), SHAPES, true);
}

#[test]
fn no_form_of_an_echoed_secret_reaches_postgres() {
    if !crate::support::postgres_available() {
        return;
    }
    check_matrix(&TestDb::new(Backend::Postgres), &SHAPES[..3], false);
}

#[test]
fn operations_on_secrets_are_refused_at_validation() {
    let db = TestDb::new(Backend::Sqlite);
    let wf = db.write(
        "w.yaml",
        r#"name: derived
tools:
  api:
    kind: http
    method: POST
    url: "http://127.0.0.1:9/x"
    headers: { Authorization: "Bearer ${{ secrets.TOKEN }}", X-Up: "${{ secrets.TOKEN | upper }}" }
nodes:
  a:
    tool: api
    with: { ok: "pw=${{ secrets.TOKEN }}!", b: "${{ secrets.TOKEN ~ 'x' }}", c: "${{ secrets.TOKEN[1:] }}" }
"#,
    );
    let out = output(db.flow().arg("validate").arg(&wf));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for (line_col, src) in [
        ("7:68", "secrets.TOKEN | upper"),
        ("11:48", "secrets.TOKEN ~ 'x'"),
        ("11:81", "secrets.TOKEN[1:]"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.contains(&format!("w.yaml:{line_col}: error: `{src}`"))),
            "{src} at {line_col} not refused:\n{err}"
        );
    }
    assert_eq!(err.matches("error:").count(), 3, "{err}");
}

/// A daemon checks every secret a run's workflow reads before it runs any node: the
/// submitter's environment is not the daemon's, and a secret found missing only at its
/// node would fail the run after earlier nodes had sent their requests.
#[test]
fn a_daemon_without_a_secret_fails_the_run_before_sending_anything() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &format!(
                r#"name: needs-secret
tools:
  api: {{ kind: http, method: POST, url: "{url}/first", timeout: 5s }}
  auth: {{ kind: http, method: POST, url: "{url}/second", timeout: 5s, headers: {{ Authorization: "Bearer ${{{{ secrets.DAEMON_TOKEN }}}}" }} }}
nodes:
  first: {{ tool: api, with: {{ n: 1 }} }}
  second: {{ tool: auth, needs: [first], with: {{ n: 2 }} }}
"#,
                url = server.url()
            ),
        );
        let submitted = output(db.flow().arg("submit").arg(&file));
        assert_eq!(
            submitted.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&submitted)
        );
        let run = String::from_utf8_lossy(&submitted.stdout)
            .trim()
            .to_string();
        let daemon = output(db.flow().args(["daemon", "--exit-when-idle"]));
        assert_eq!(
            daemon.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&daemon)
        );
        assert_eq!(server.total(), 0, "{backend:?}: no node may run");
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "failed", "{backend:?}: {s:#}");
        let error = s["run"]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("`DAEMON_TOKEN`") && error.contains("FLOW_SECRET_DAEMON_TOKEN"),
            "{backend:?}: {error}"
        );
    }
}

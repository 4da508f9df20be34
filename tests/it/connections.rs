//! Connections end to end through the real binary, against the testkit's OAuth
//! authorization server on loopback: `flow connect` with a `--browser` that is a plain
//! HTTP client following the redirects, runs that use the stored token, a shared
//! refresh across processes (one token request per expiry, never a spent refresh
//! token), the failures (no key, a wrong key, a tampered row, a refused sign-in, a forged
//! redirect, a revoked refresh token) and that no token is ever on disk or in a log.

use std::path::Path;
use std::process::Output;

use base64::Engine as _;
use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};

use crate::support::{Backend, TestDb, backends, output, runtime, stderr, stdout};

/// A browser that follows the redirects without a page: curl.
const BROWSER: &str = "curl -sS -L -o /dev/null";

pub(crate) fn key() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn config(db: &TestDb, url: &str) -> std::path::PathBuf {
    db.write(
        "flow.toml",
        &format!(
            "[[connections]]\nname = \"tracker\"\nserver = \"{url}\"\nscopes = [\"tools:write\"]\n"
        ),
    )
}

/// A workflow of `n` independent `count` calls (keys `<prefix>-<i>`) with the connection.
pub(crate) fn workflow(db: &TestDb, url: &str, prefix: &str, n: usize) -> std::path::PathBuf {
    workflow_with(db, url, prefix, n, "")
}

/// [`workflow`] with `extra` lines in the tool's definition.
fn workflow_with(
    db: &TestDb,
    url: &str,
    prefix: &str,
    n: usize,
    extra: &str,
) -> std::path::PathBuf {
    let mut text = format!(
        "name: conn-{prefix}\ntools:\n  tracker:\n    kind: mcp\n    server: {{ url: \"{url}\" }}\n    tool: count\n    auth: {{ connection: tracker }}\n{extra}nodes:\n"
    );
    for i in 0..n {
        text.push_str(&format!(
            "  n{i}: {{ tool: tracker, with: {{ key: \"{prefix}-{i}\" }} }}\n"
        ));
    }
    db.write(&format!("{prefix}.yaml"), &text)
}

pub(crate) fn flow_with(db: &TestDb, key: &str) -> std::process::Command {
    let mut cmd = db.flow();
    cmd.env("FLOW_SECRET_CONNECTIONS_KEY", key)
        .arg("--config")
        .arg(db.dir.path().join("flow.toml"));
    cmd
}

fn connect(db: &TestDb, key: &str, browser: &str) -> Output {
    output(
        flow_with(db, key)
            .args(["connect", "tracker", "--by", "ada", "--timeout", "20s"])
            .args(["--browser", browser]),
    )
}

pub(crate) fn listed(db: &TestDb, key: &str) -> serde_json::Value {
    let out = output(flow_with(db, key).args(["connections", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("connections JSON")
}

/// Every file under `dir`, concatenated (the SQLite ledger, its WAL and journals).
pub(crate) fn disk_bytes(dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        if entry.path().is_file() {
            all.extend(std::fs::read(entry.path()).unwrap_or_default());
        }
    }
    all
}

/// The forms a token could leave in: raw, base64, JSON-escaped, URL-encoded.
fn forms(token: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    vec![
        token.to_string(),
        b64.encode(token),
        serde_json::to_string(token).unwrap_or_default(),
        url::form_urlencoded::byte_serialize(token.as_bytes()).collect(),
    ]
}

/// The first form of a token that `bytes` hold, if any.
pub(crate) fn find_token(bytes: &[u8], tokens: &[String]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    tokens
        .iter()
        .flat_map(|t| forms(t))
        .find(|form| text.contains(form.as_str()))
}

pub(crate) fn assert_no_token(what: &str, bytes: &[u8], tokens: &[String]) {
    if let Some(form) = find_token(bytes, tokens) {
        panic!("{what} holds a token ({form:.12}…)");
    }
}

/// Everything the ledger holds, as bytes a scan can search: the SQLite file, its WAL and
/// journals, or a `pg_dump --data-only` of the PostgreSQL database.
pub(crate) fn ledger_bytes(db: &TestDb) -> Vec<u8> {
    if !db.url.starts_with("postgres") {
        return disk_bytes(db.dir.path());
    }
    let name = db.url.rsplit('/').next().unwrap_or_default().to_string();
    let dump = output(crate::support::pg_client("pg_dump").args(["--data-only", &name]));
    assert_eq!(dump.status.code(), Some(0), "pg_dump: {}", stderr(&dump));
    dump.stdout
}

/// The scan can fail: a token planted in a run's inputs, raw and base64-encoded, is
/// found in the ledger's bytes on both backends (a scanner that never finds anything
/// would let every leak test pass).
#[test]
fn the_token_scan_finds_a_planted_token_on_both_backends() {
    let b64 = base64::engine::general_purpose::STANDARD;
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "plant.yaml",
            "name: plant\ninputs:\n  t: { type: string }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  n: { tool: e }\n",
        );
        for (token, stored) in [
            ("tok-planted-9f3e2a", "tok-planted-9f3e2a".to_string()),
            ("tok-encoded-41d7c8", b64.encode("tok-encoded-41d7c8")),
        ] {
            let out = output(
                db.flow()
                    .arg("run")
                    .arg(&file)
                    .args(["--input", &format!("t={stored}")]),
            );
            assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
            let found = find_token(&ledger_bytes(&db), &[token.to_string()]);
            assert!(found.is_some(), "{backend:?}: the planted {token} is found");
        }
        let absent = find_token(&ledger_bytes(&db), &["tok-never-stored-0".to_string()]);
        assert_eq!(absent, None, "{backend:?}");
    }
}

#[test]
fn a_person_signs_in_once_and_every_process_uses_and_refreshes_the_token() {
    let rt = runtime();
    for backend in backends() {
        let server = rt
            .block_on(HttpServer::start(Some(AuthOptions::default())))
            .expect("server");
        // Fresh for 10 s (half the lifetime is kept as a margin), so the test can wait
        // it out.
        server.set_access_ttl(20);
        let db = TestDb::new(backend);
        let key = key();
        config(&db, &server.url());
        let out = connect(&db, &key, BROWSER);
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("connected `tracker`"),
            "{}",
            stdout(&out)
        );
        assert_eq!(server.auth_code().code_requests(), 1);
        assert_eq!(
            server.auth_code().registrations(),
            1,
            "no client id: registered"
        );
        let list = listed(&db, &key);
        assert_eq!(list[0]["status"], "connected", "{list}");
        assert_eq!(list[0]["connected_by"], "ada");
        assert_eq!(list[0]["has_refresh_token"], true);
        assert_eq!(list[0]["scopes"], "tools:write");

        // A run uses the stored token: no token request.
        let wf = workflow(&db, &server.url(), "first", 1);
        let out = output(flow_with(&db, &key).arg("run").arg(&wf));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.stats().count("first-0"), 1);
        assert_eq!(server.auth_code().refresh_requests(), 0);

        // Past the freshness margin, 4 processes × 5 concurrent calls: one refresh,
        // slow enough (1 s) that every process asks while it is under way.
        std::thread::sleep(std::time::Duration::from_secs(11));
        server.delay_refreshes(1000);
        let wf = workflow(&db, &server.url(), "many", 5);
        let children: Vec<_> = (0..4)
            .map(|i| {
                let mut cmd = flow_with(&db, &key);
                cmd.arg("run")
                    .arg(&wf)
                    .arg("--run-id")
                    .arg(format!("run-many-{i}"));
                std::thread::spawn(move || output(&mut cmd))
            })
            .collect();
        for child in children {
            let out = child.join().expect("child");
            assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        }
        assert_eq!(
            server.auth_code().refresh_requests(),
            1,
            "{backend:?}: one token request for one expiry"
        );
        assert_eq!(server.auth_code().spent_refresh_uses(), 0);
        for i in 0..5 {
            assert_eq!(server.stats().count(&format!("many-{i}")), 4);
        }
        let list = listed(&db, &key);
        assert_eq!(list[0]["refreshes"], 1, "{list}");

        // A 401 to a token the server forgot: one refresh, the call re-sent once.
        server.delay_refreshes(0);
        server.forget_access_tokens();
        let wf = workflow(&db, &server.url(), "after-401", 1);
        let out = output(
            flow_with(&db, &key)
                .arg("run")
                .arg(&wf)
                .env("RUST_LOG", "trace"),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.auth_code().refresh_requests(), 2);
        let tokens = server.auth_code().all_tokens();
        assert!(tokens.len() >= 6, "{tokens:?}");
        assert_no_token("a trace-level log", &out.stderr, &tokens);
        assert_no_token("flow run's output", &out.stdout, &tokens);
        let shown = output(flow_with(&db, &key).args(["runs", "--json"]));
        assert_no_token("flow runs", &shown.stdout, &tokens);
        let listed = output(flow_with(&db, &key).args(["connections", "--json"]));
        assert_no_token("flow connections", &listed.stdout, &tokens);
        assert_no_token("the ledger (files or pg_dump)", &ledger_bytes(&db), &tokens);

        // Revoked at the server, deleted here.
        let out = output(flow_with(&db, &key).args(["connections", "revoke", "tracker"]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.auth_code().revocations(), 1);
        assert_eq!(listed_len(&db, &key), 0);
    }
}

fn listed_len(db: &TestDb, key: &str) -> usize {
    listed(db, key).as_array().map_or(0, Vec::len)
}

#[test]
fn a_refused_refresh_token_needs_a_new_sign_in_and_sends_nothing() {
    let rt = runtime();
    for backend in backends() {
        let server = rt
            .block_on(HttpServer::start(Some(AuthOptions::default())))
            .expect("server");
        let db = TestDb::new(backend);
        let key = key();
        config(&db, &server.url());
        let out = connect(&db, &key, BROWSER);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        server.auth_code().revoke_all_refresh_tokens();
        server.forget_access_tokens();
        let wf = workflow(&db, &server.url(), "dead", 1);
        let out = output(flow_with(&db, &key).arg("run").arg(&wf));
        assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(text.contains("flow connect tracker"), "{backend:?}: {text}");
        assert_eq!(server.stats().count("dead-0"), 0, "nothing ran");
        let list = listed(&db, &key);
        assert_eq!(list[0]["status"], "needs_reconnect", "{list}");
        // The next run fails at once, without asking the server again.
        let before = server.auth_code().refresh_requests();
        let wf = workflow(&db, &server.url(), "dead-again", 1);
        let out = output(flow_with(&db, &key).arg("run").arg(&wf));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert_eq!(server.auth_code().refresh_requests(), before);
        let emitted = rt.block_on(async {
            let ledger = flow_ledger::Ledger::open(&db.url, flow_ledger::OpenOptions::default())
                .await
                .expect("ledger");
            let list = ledger
                .list_events(flow_ledger::EventFilter::default())
                .await
                .expect("events");
            ledger.close().await;
            list.iter()
                .filter(|e| e.event_type.as_str() == "connection.needs_reconnect")
                .count()
        });
        assert_eq!(emitted, 1, "{backend:?}: one connection.needs_reconnect");
        // Signing in again mends it.
        let out = connect(&db, &key, BROWSER);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let out = output(
            flow_with(&db, &key)
                .arg("run")
                .arg(&wf)
                .arg("--run-id")
                .arg("again"),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    }
}

#[test]
fn bad_keys_rows_and_redirects_are_refused_with_nothing_stored_or_sent() {
    let rt = runtime();
    let server = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    config(&db, &server.url());
    // No key: refused before anything is asked.
    let mut cmd = db.flow();
    cmd.arg("--config").arg(db.dir.path().join("flow.toml"));
    let out = output(cmd.args(["connect", "tracker", "--browser", BROWSER]));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("flow connections keygen"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.auth_code().code_requests(), 0);

    let key = key();
    // The server redirects with an error.
    server.authorize_with_error(Some("access_denied"));
    let out = connect(&db, &key, BROWSER);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("access_denied"), "{}", stderr(&out));
    server.authorize_with_error(None);
    // A redirect without the `iss` the server's metadata promises (RFC 9207).
    server.omit_iss(true);
    let out = connect(&db, &key, BROWSER);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("carries no `iss`"),
        "{}",
        stderr(&out)
    );
    server.omit_iss(false);
    // A forged redirect: the right callback, another state.
    let forge = db.write(
        "forge.py",
        "import sys, urllib.parse, urllib.request\n\
         q = urllib.parse.parse_qs(urllib.parse.urlparse(sys.argv[1]).query)\n\
         urllib.request.urlopen(q['redirect_uri'][0] + '?code=stolen&state=forged').read()\n",
    );
    let out = connect(&db, &key, &format!("python3 {}", forge.display()));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("state does not match"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        server.auth_code().code_requests(),
        0,
        "no code was exchanged"
    );
    assert_eq!(listed_len(&db, &key), 0, "nothing stored");

    // Signed in; then a wrong key and a tampered row fail the call as not sent.
    let out = connect(&db, &key, BROWSER);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let wf = workflow(&db, &server.url(), "k", 1);
    let other = self::key();
    let out = output(flow_with(&db, &other).arg("run").arg(&wf));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("sealed under key"), "{text}");
    assert_eq!(server.stats().count("k-0"), 0);
    rt.block_on(async {
        use sqlx::Connection as _;
        let mut c = sqlx::SqliteConnection::connect(&db.url)
            .await
            .expect("sqlite");
        sqlx::query(
            "UPDATE connections SET sealed =
             CASE WHEN substr(sealed, 1, 1) = 'A' THEN 'B' ELSE 'A' END || substr(sealed, 2)",
        )
        .execute(&mut c)
        .await
        .expect("tamper");
    });
    let out = output(
        flow_with(&db, &key)
            .arg("run")
            .arg(&wf)
            .arg("--run-id")
            .arg("tampered"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("altered"), "{text}");
    assert_eq!(server.stats().count("k-0"), 0);
}

#[test]
fn a_call_that_gives_up_on_a_slow_refresh_does_not_lose_the_rotated_token() {
    let rt = runtime();
    let server = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let key = key();
    config(&db, &server.url());
    let out = connect(&db, &key, BROWSER);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The token is refused; its refresh takes 3 s, the call may wait 1 s.
    server.forget_access_tokens();
    server.delay_refreshes(3000);
    let wf = workflow_with(&db, &server.url(), "slow", 1, "    timeout: 1s\n");
    let out = output(flow_with(&db, &key).arg("run").arg(&wf));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        !text.contains("in doubt") && !text.contains("in_doubt"),
        "{text}"
    );
    assert_eq!(server.stats().count("slow-0"), 0);
    // The refresh was not abandoned (the process waited for it before it exited): the
    // next run uses what it stored, with no spent refresh token.
    server.delay_refreshes(0);
    let wf = workflow(&db, &server.url(), "after", 1);
    let out = output(flow_with(&db, &key).arg("run").arg(&wf));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(server.auth_code().spent_refresh_uses(), 0);
    assert_eq!(listed(&db, &key)[0]["status"], "connected");
}

#[test]
fn a_rotated_key_opens_old_rows_until_rekey_reseals_them() {
    let rt = runtime();
    let server = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let (old, new) = (key(), key());
    config(&db, &server.url());
    let out = connect(&db, &old, BROWSER);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let old_id = listed(&db, &old)[0]["key_id"].clone();
    // Workers given both keys keep working before the rows are resealed.
    let wf = workflow(&db, &server.url(), "rot", 1);
    let both = |cmd: &mut std::process::Command| {
        cmd.env("FLOW_SECRET_CONNECTIONS_KEY_OLD", &old);
    };
    let mut run = flow_with(&db, &new);
    both(&mut run);
    let out = output(run.arg("run").arg(&wf));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut rekey = flow_with(&db, &new);
    both(&mut rekey);
    let out = output(rekey.args(["connections", "rekey"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("resealed 1"), "{}", stdout(&out));
    assert_ne!(listed(&db, &new)[0]["key_id"], old_id);
    // The new key alone opens it now; the old one alone does not.
    let out = output(
        flow_with(&db, &new)
            .arg("run")
            .arg(&wf)
            .arg("--run-id")
            .arg("new"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = output(
        flow_with(&db, &old)
            .arg("run")
            .arg(&wf)
            .arg("--run-id")
            .arg("old"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(format!("{}{}", stdout(&out), stderr(&out)).contains("sealed under key"));
    assert_eq!(server.stats().count("rot-0"), 2);
}

//! A client generated from the committed `docs/openapi.json` drives a real `flow
//! serve`: submit → in doubt → resolve → show. If the document's operations, bodies or
//! enums were wrong, the generated code would not compile, send or parse what the
//! server answers (the generated models raise on a missing required field or an
//! unknown enum value).
//!
//! The generator is `openapi-python-client` (pinned) from PyPI, installed once into a
//! virtual environment under `~/.cache/flow-pyclient` (`FLOW_PYCLIENT_DIR` moves it);
//! the generated package and a small script run with that environment's Python.

use std::path::{Path, PathBuf};
use std::process::Command;

use flow_adapters::testkit::http::CountingServer;
use serde_json::Value;

use crate::api::{OPERATOR, serve};
use crate::crash::workflow;
use crate::support::{TestDb, output, repo, runtime, show, stderr, stdout};

/// The generator's version: a new one is a deliberate change (its output may differ).
const GENERATOR: &str = "openapi-python-client==0.29.1";

/// The script: `submit BASE TOKEN FILE` queues run `py-1` of FILE; `resolve BASE TOKEN`
/// finds its call in the inbox, settles it as succeeded and prints what `getRun` says.
const SCRIPT: &str = r#"
import json, sys
from flow_client import AuthenticatedClient
from flow_client.api.default import get_run, list_in_doubt, resolve_call, submit_run
from flow_client.models import CallView, InDoubtList, Outcome, ResolveBody, RunView, SubmitRun, Submitted

# Enums are Python enums: their JSON text is `.value`.
def text(e):
    return e.value

step, base, token = sys.argv[1], sys.argv[2], sys.argv[3]
client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)
if step == "submit":
    body = SubmitRun(workflow=open(sys.argv[4]).read(), run_id="py-1")
    r = submit_run.sync_detailed(client=client, body=body)
    assert r.status_code == 201, (r.status_code, r.content)
    assert isinstance(r.parsed, Submitted), r.parsed
    print(json.dumps({"id": r.parsed.id, "status": text(r.parsed.status), "created": r.parsed.created}))
else:
    inbox = list_in_doubt.sync(client=client, run="py-1")
    assert isinstance(inbox, InDoubtList), inbox
    calls = [c for c in inbox.calls if isinstance(c, CallView)]
    assert len(calls) == 1, inbox
    call = calls[0]
    body = ResolveBody(node=call.node, outcome=Outcome.SUCCEEDED, output={"count": 1}, reason="seen at the PSP")
    after = resolve_call.sync(client=client, id="py-1", body=body)
    assert isinstance(after, RunView), after
    view = get_run.sync(client=client, id="py-1")
    assert isinstance(view, RunView), view
    settled = [c for c in view.tool_calls if c.node == call.node][0]
    print(json.dumps({
        "in_doubt": {"node": call.node, "status": text(call.status), "key": call.key,
                     "requests_sent": call.requests_sent, "requests_text": call.requests_text},
        "run_status": text(view.run.status),
        "created_at": view.run.created_at.isoformat(),
        "call_status": text(settled.status),
        "resolved_by": settled.resolution.by,
        "reason": settled.resolution.reason,
    }))
"#;

/// The virtual environment with the generator, installed when missing.
fn venv() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let dir = std::env::var("FLOW_PYCLIENT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(&home).join(".cache/flow-pyclient"));
    let venv = dir.join("venv");
    let marker = venv.join(GENERATOR);
    if marker.exists() {
        return venv;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .expect("python3 runs");
    assert!(made.status.success(), "python3 -m venv: {}", stderr(&made));
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", GENERATOR])
        .output()
        .expect("pip runs");
    assert!(
        pip.status.success(),
        "pip install {GENERATOR} (needs PyPI): {}",
        stderr(&pip)
    );
    std::fs::write(&marker, "").expect("marker");
    venv
}

/// Generates the client package `flow_client` from the committed document into `dir`.
fn generate(venv: &Path, dir: &Path) {
    let config = dir.join("generator.yaml");
    std::fs::write(
        &config,
        "post_hooks: []\npackage_name_override: flow_client\n",
    )
    .expect("config");
    let out = Command::new(venv.join("bin/openapi-python-client"))
        .args(["generate", "--meta", "none", "--path"])
        .arg(repo().join("docs/openapi.json"))
        .arg("--output-path")
        .arg(dir.join("flow_client"))
        .arg("--config")
        .arg(&config)
        .output()
        .expect("generator runs");
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "openapi-python-client: {said}");
    // It warns (and leaves pieces out) for schemas it cannot model: none may be left out.
    assert!(
        !said.contains("Warning"),
        "the generator skipped parts: {said}"
    );
}

/// Runs the script's `step` with the generated package importable.
fn script(venv: &Path, dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(venv.join("bin/python"))
        .arg(dir.join("drive.py"))
        .args(args)
        .env("PYTHONPATH", dir)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).expect("the script prints JSON")
}

#[test]
fn a_generated_client_submits_resolves_and_shows_a_run() {
    let venv = venv();
    let work = tempfile::tempdir().expect("tempdir");
    generate(&venv, work.path());
    std::fs::write(work.path().join("drive.py"), SCRIPT).expect("script");

    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let server = serve(&db);
    let file_arg = file.to_string_lossy().into_owned();
    let submitted = script(
        &venv,
        work.path(),
        &["submit", &server.base, OPERATOR, &file_arg],
    );
    assert_eq!(
        submitted,
        serde_json::json!({"id": "py-1", "status": "queued", "created": true})
    );
    // The run executes here and dies after the charge's response arrived; the next
    // resume finds the call in doubt and pauses the run.
    let crashed = output(
        db.flow()
            .args(["resume", "py-1"])
            .env("FLOW_FAULT", "after_response:charge"),
    );
    assert_ne!(crashed.status.code(), Some(0), "{}", stderr(&crashed));
    let paused = output(db.flow().args(["resume", "py-1"]));
    assert_eq!(paused.status.code(), Some(3), "{}", stderr(&paused));

    let seen = script(&venv, work.path(), &["resolve", &server.base, OPERATOR]);
    assert_eq!(seen["in_doubt"]["node"], "charge", "{seen}");
    assert_eq!(seen["in_doubt"]["status"], "in_doubt", "{seen}");
    assert_eq!(seen["in_doubt"]["key"], "py-1:charge:1", "{seen}");
    assert_eq!(seen["in_doubt"]["requests_sent"], Value::Null, "{seen}");
    assert_eq!(seen["call_status"], "succeeded", "{seen}");
    assert_eq!(seen["resolved_by"], "otto", "{seen}");
    assert_eq!(seen["reason"], "seen at the PSP", "{seen}");
    // Settling the last doubt re-queued the run for the daemons.
    assert_eq!(seen["run_status"], "queued", "{seen}");
    let created = show(&db, "py-1")["run"]["created_at"].clone();
    assert_eq!(
        to_the_second(seen["created_at"].as_str().unwrap_or_default()),
        to_the_second(created.as_str().unwrap_or_default()),
        "the client parsed the time the server wrote: {seen}"
    );
    assert_eq!(downstream.count("py-1:charge:1"), 1, "the charge left once");
}

/// `2026-12-01T09:00:00.123Z` and `2026-12-01T09:00:00.123000+00:00` to the same
/// text, to the second (Python writes microseconds and an offset).
fn to_the_second(t: &str) -> String {
    t.chars().take(19).collect()
}

/// The role each operation of the committed document names (`x-flow-role`) is the one
/// the server enforces: a token one role below gets 403, the named role gets past
/// authorization (whatever the handler then says about the empty body), and no token
/// gets 401. The router and the document come from one list; this checks that list
/// against the handlers' extractors.
#[test]
fn every_documented_role_is_the_one_the_server_enforces() {
    use crate::api::{ADMIN, VIEWER};
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/openapi.json")).expect("docs/openapi.json"),
    )
    .expect("JSON");
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let server = serve(&db);
    let token = |role: &str| match role {
        "viewer" => VIEWER,
        "operator" => OPERATOR,
        _ => ADMIN,
    };
    let below = |role: &str| match role {
        "operator" => Some(VIEWER),
        "admin" => Some(OPERATOR),
        _ => None,
    };
    let rt = runtime();
    let client = reqwest::Client::new();
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(!id.is_empty(), "{method} {path}: no operationId");
            let Some(role) = op["x-flow-role"].as_str() else {
                assert_eq!(op["security"], serde_json::json!([]), "{id}");
                continue;
            };
            let url = format!("{}{}", server.base, path.replace("{id}", "nope"));
            let send = |bearer: Option<&str>| {
                let mut req = match method.as_str() {
                    "get" => client.get(&url),
                    _ => client.post(&url).json(&serde_json::json!({})),
                };
                if let Some(t) = bearer {
                    req = req.bearer_auth(t);
                }
                let status = rt.block_on(req.send()).expect("request").status();
                status.as_u16()
            };
            assert_eq!(send(None), 401, "{id} without a token");
            if let Some(lower) = below(role) {
                assert_eq!(send(Some(lower)), 403, "{id} with a role below {role}");
            }
            let allowed = send(Some(token(role)));
            assert!(
                allowed != 401 && allowed != 403,
                "{id} with the {role} role: {allowed}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} operations checked");
}

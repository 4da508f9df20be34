//! Sub-workflows (`workflow:` nodes) through the real binary, against a downstream that
//! counts requests per idempotency key: each child is a run of its own under an id
//! derived from its parent's step, its calls are sent once, and its parent ends with its
//! output or its failure; a child in doubt pauses its parent "waiting on child" until
//! the child ends; a parent killed while its child runs reattaches to that child (never
//! a second one); a cancelled parent takes its children along unless they are
//! `abandon`ed; a child file that does not validate, a `with` the child does not
//! accept and a cycle of sub-workflows are refused before anything runs.

use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde_json::Value;

use crate::support::{
    Backend, TestDb, backends, no_runs, output, run_id, runtime, show, stderr, stdout,
};

/// The child: one POST per tenant to `<url>/provision/<tenant>`.
fn child(url: &str) -> String {
    format!(
        r#"name: provision
inputs:
  tenant: {{ type: string, required: true }}
  plan: {{ type: string, default: basic }}
tools:
  post: {{ kind: http, method: POST, url: "{url}/provision/${{{{ with.tenant }}}}", timeout: 5s }}
nodes:
  charge:
    tool: post
    with: {{ tenant: "${{{{ inputs.tenant }}}}", plan: "${{{{ inputs.plan }}}}" }}
"#
    )
}

/// The parent: `provision` once per tenant of the input list (`extra` goes on that
/// node), then `report` reads the children's outputs.
fn parent(extra: &str) -> String {
    format!(
        r#"name: tenants
inputs:
  tenants: {{ type: array, required: true }}
tools:
  echo: {{ kind: function, function: core.echo }}
nodes:
  provision:
    workflow: child.yaml
    for_each: {{ items: "${{{{ inputs.tenants }}}}", key: "${{{{ item }}}}", concurrency: 2 }}
    with: {{ tenant: "${{{{ item }}}}", plan: pro }}
    {extra}
  report:
    needs: [provision]
    tool: echo
    with: {{ done: "${{{{ nodes.provision.output.succeeded }}}}", t1: "${{{{ nodes.provision.output.items.t1.charge.body.plan }}}}" }}
"#
    )
}

fn setup(backend: Backend, url: &str, extra: &str) -> (TestDb, std::path::PathBuf) {
    let db = TestDb::new(backend);
    db.write("child.yaml", &child(url));
    let file = db.write("parent.yaml", &parent(extra));
    (db, file)
}

/// `flow run` of the parent with its `tenants` input (`tenants=[…]`).
fn run_parent(db: &TestDb, file: &std::path::Path, tenants: &str) -> std::process::Output {
    output(db.flow().arg("run").arg(file).args(["--input", tenants]))
}

/// Settles the in-doubt `charge` of child run `child` as succeeded (the operator looked
/// at the downstream): the child ends, which puts its parent back on the queue.
fn settle_child(db: &TestDb, child: &str, backend: Backend) {
    let out = output(db.flow().args([
        "resume",
        child,
        "--resolve",
        "charge=succeeded",
        "--output",
        r#"{"body": {"plan": "pro"}}"#,
    ]));
    assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
}

fn children(db: &TestDb, run: &str) -> Vec<Value> {
    let out = output(db.flow().args(["runs", "--parent", run, "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("runs --json")
}

#[test]
fn each_child_is_a_run_of_its_own_sent_once_and_the_parent_ends_with_their_outputs() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let (db, file) = setup(backend, &server.url(), "");
        let out = run_parent(&db, &file, r#"tenants=["t1","t2","t3"]"#);
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let result: Value = serde_json::from_slice(&out.stdout).expect("output");
        assert_eq!(result["report"]["done"], 3, "{backend:?}: {result}");
        assert_eq!(result["report"]["t1"], "pro", "{backend:?}: {result}");
        for t in ["t1", "t2", "t3"] {
            let child = format!("{run}.provision.{t}");
            assert_eq!(
                server.count(&format!("{child}:charge:1")),
                1,
                "{backend:?}: the child {child} sent its call once under its own key: {:?}",
                server
                    .log()
                    .iter()
                    .map(|r| r.key.clone())
                    .collect::<Vec<_>>()
            );
        }
        assert_eq!(server.total(), 3, "{backend:?}");
        let kids = children(&db, &run);
        assert_eq!(kids.len(), 3, "{backend:?}: {kids:?}");
        for k in &kids {
            assert_eq!(k["status"], "succeeded", "{backend:?}: {k}");
            assert_eq!(k["parent"]["run"], run.as_str(), "{backend:?}: {k}");
        }
        let s = show(&db, &run);
        assert_eq!(
            s["children"]["runs"].as_array().map(Vec::len),
            Some(3),
            "{backend:?}: {s}"
        );
    }
}

#[test]
fn a_failed_child_fails_its_node_naming_the_child_and_why() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/provision/t2", Behavior::status(400));
        let (db, file) = setup(backend, &server.url(), "");
        let out = run_parent(&db, &file, r#"tenants=["t1","t2"]"#);
        assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let s = show(&db, &run);
        let error = s["run"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("t2"), "{backend:?}: {error}");
        let item = s["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["id"] == "provision"))
            .and_then(|n| n["items"]["listed"].as_array())
            .and_then(|l| l.iter().find(|i| i["key"] == "t2"))
            .cloned()
            .unwrap_or_default();
        let why = item["error"].to_string();
        assert!(
            why.contains(&format!("sub-workflow run {run}.provision.t2 failed"))
                && why.contains("400"),
            "{backend:?}: the item's failure names its child and why: {item}"
        );
        assert_eq!(server.total(), 2, "{backend:?}: nothing was sent again");
        let kids = children(&db, &run);
        let failed: Vec<&Value> = kids.iter().filter(|k| k["status"] == "failed").collect();
        assert_eq!(failed.len(), 1, "{backend:?}: {kids:?}");
    }
}

/// The child's call is cut mid-response: the child pauses in doubt, its parent pauses
/// waiting on it. Resolving the child's call finishes the child, which wakes the
/// parent; resuming the parent finishes it, and nothing was sent twice.
#[test]
fn a_child_in_doubt_pauses_its_parent_until_the_child_ends() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/provision/t1", Behavior::DropMidResponse);
        let (db, file) = setup(backend, &server.url(), "");
        let out = run_parent(&db, &file, r#"tenants=["t1","t2"]"#);
        assert_eq!(out.status.code(), Some(3), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let child = format!("{run}.provision.t1");
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "paused", "{backend:?}");
        let reason = s["run"]["error"].as_str().unwrap_or_default();
        assert!(reason.contains("waiting on child"), "{backend:?}: {reason}");
        let c = show(&db, &child);
        assert_eq!(c["run"]["status"], "paused", "{backend:?}: {c}");
        assert_eq!(c["run"]["parent"]["run"], run.as_str(), "{backend:?}");

        // The child's call is settled; its end puts the parent back on the queue.
        settle_child(&db, &child, backend);
        let p = show(&db, &run);
        assert_eq!(
            p["run"]["status"], "queued",
            "{backend:?}: the child's end woke the parent"
        );
        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let p = show(&db, &run);
        assert_eq!(p["run"]["status"], "succeeded", "{backend:?}: {p}");
        assert_eq!(server.total(), 2, "{backend:?}: nothing was sent twice");
        assert_eq!(children(&db, &run).len(), 2, "{backend:?}: no second child");
    }
}

/// The process dies right after the child's call is recorded; the parent resumed
/// reattaches to the same child (it takes the dead process's lease over), which replays
/// its call instead of sending it again.
#[test]
fn a_parent_killed_while_its_child_runs_reattaches_to_the_same_child() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let (db, file) = setup(backend, &server.url(), "");
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .args(["--input", r#"tenants=["t1"]"#])
                .env("FLOW_FAULT", "after_complete:charge"),
        );
        assert_ne!(
            out.status.code(),
            Some(0),
            "{backend:?}: the fault killed the process"
        );
        let run = run_id(&out);
        assert_eq!(server.total(), 1, "{backend:?}");
        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(
            server.total(),
            1,
            "{backend:?}: the child's call was not sent again"
        );
        let kids = children(&db, &run);
        assert_eq!(kids.len(), 1, "{backend:?}: one child, not two: {kids:?}");
        assert_eq!(kids[0]["status"], "succeeded", "{backend:?}");
        assert_eq!(show(&db, &run)["run"]["status"], "succeeded", "{backend:?}");
    }
}

#[test]
fn cancelling_a_parent_cancels_its_children_unless_they_are_abandoned() {
    let rt = runtime();
    for (mode, want) in [("cancel", "cancelled"), ("abandon", "paused")] {
        for backend in backends() {
            let server = rt.block_on(CountingServer::start()).expect("server");
            server.set("/provision/t1", Behavior::DropMidResponse);
            let extra = format!("on_parent_cancel: {mode}");
            let (db, file) = setup(backend, &server.url(), &extra);
            let out = run_parent(&db, &file, r#"tenants=["t1"]"#);
            assert_eq!(out.status.code(), Some(3), "{backend:?}: {}", stderr(&out));
            let run = run_id(&out);
            let out = output(db.flow().args(["cancel", &run]));
            assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
            assert_eq!(show(&db, &run)["run"]["status"], "cancelled", "{backend:?}");
            let child = show(&db, &format!("{run}.provision.t1"));
            assert_eq!(
                child["run"]["status"], want,
                "{backend:?} {mode}: the child after its parent's cancel"
            );
        }
    }
}

#[test]
fn bad_sub_workflows_are_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite);
    let cases = [
        (
            "a.yaml",
            "tools: {}\nnodes:\n  n:\n    workflow: b.yaml\n",
            "b.yaml",
            "tools: {}\nnodes:\n  m:\n    workflow: a.yaml\n",
            "includes itself",
        ),
        (
            "c.yaml",
            "tools: {}\nnodes:\n  n:\n    workflow: broken.yaml\n",
            "broken.yaml",
            "tools: {}\nnodes:\n  m:\n    tool: nope\n",
            "does not validate",
        ),
        (
            "d.yaml",
            "tools: {}\nnodes:\n  n:\n    workflow: kid.yaml\n    with: { tenat: x }\n",
            "kid.yaml",
            "inputs:\n  tenant: { type: string, required: true }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  m:\n    tool: e\n",
            "does not declare as an input",
        ),
        (
            "e.yaml",
            "tools: {}\nnodes:\n  n:\n    workflow: kid2.yaml\n    with: { tenant: \"${{ secrets.TOKEN }}\" }\n",
            "kid2.yaml",
            "inputs:\n  tenant: { type: string, required: true }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  m:\n    tool: e\n",
            "reads secret",
        ),
        (
            "f.yaml",
            "tools: {}\nnodes:\n  n:\n    workflow: missing.yaml\n",
            "unused.yaml",
            "tools: {}\nnodes: {}\n",
            "missing.yaml",
        ),
    ];
    for (parent, ptext, child, ctext, want) in cases {
        let file = db.write(parent, ptext);
        db.write(child, ctext);
        for cmd in ["validate", "run"] {
            let out = output(db.flow().arg(cmd).arg(&file));
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{parent} {cmd}: {err}");
            assert!(err.contains(want), "{parent} {cmd}: wants `{want}`: {err}");
            assert!(
                err.contains(&format!("{parent}:4:15")),
                "{parent} {cmd}: the position of `workflow:`: {err}"
            );
        }
    }
    no_runs(&db);
}

/// A child paused on a call in doubt holds only itself, as a tool item in doubt does:
/// nothing of it is in flight, so the next items start (before, it kept its
/// `concurrency` slot and the fan-out stalled behind it), and `flow show` lists its
/// item `paused`, waiting for a person (before: `running`).
#[test]
fn a_child_in_doubt_holds_only_itself() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/provision/t1", Behavior::DropMidResponse);
        let db = TestDb::new(backend);
        db.write("child.yaml", &child(&server.url()));
        let file = db.write(
            "parent.yaml",
            &parent("").replace("concurrency: 2", "concurrency: 1"),
        );
        let out = run_parent(&db, &file, r#"tenants=["t1","t2","t3"]"#);
        assert_eq!(out.status.code(), Some(3), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        assert_eq!(server.total(), 3, "{backend:?}: every child started");
        assert_eq!(children(&db, &run).len(), 3, "{backend:?}");
        let seen = show(&db, &run);
        let reason = seen["run"]["error"].to_string();
        assert!(
            reason.contains("waiting on child: provision: 1 item"),
            "{backend:?}: {reason}"
        );
        let node = &seen["nodes"].as_array().expect("nodes")[0];
        assert_eq!(node["items"]["in_doubt"], 1, "{backend:?}: {node}");
        assert_eq!(node["items"]["running"], 0, "{backend:?}: {node}");
        assert_eq!(node["status"], "paused", "{backend:?}: {node}");
        let item = &node["items"]["listed"][0];
        assert_eq!(
            (&item["key"], &item["status"]),
            (&"t1".into(), &"paused".into())
        );
        let text = stdout(&output(db.flow().args(["show", &run])));
        assert!(
            text.contains("1 in doubt") && !text.contains("running"),
            "{backend:?}: {text}"
        );
        assert!(
            stderr(&out).contains("the child runs it waits on"),
            "{backend:?}: the parent does not send the operator to its own calls: {}",
            stderr(&out)
        );
        // Settled in the child, the parent goes on and ends.
        let child = format!("{run}.provision.t1");
        settle_child(&db, &child, backend);
        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.total(), 3, "{backend:?}: nothing was sent twice");
    }
}

/// A parent that fails while its child waits (paused in doubt) cancels that child:
/// nothing of it goes on for nobody. A failed sub-workflow node is not redriven (a new
/// attempt would be a new child sending its calls again).
#[test]
fn a_failing_parent_cancels_its_waiting_child_and_is_not_redriven() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/provision/solo", Behavior::DropMidResponse);
        server.set("/boom", Behavior::status(400));
        let db = TestDb::new(backend);
        db.write("child.yaml", &child(&server.url()));
        let text = format!(
            r#"name: failing
tools:
  post: {{ kind: http, method: POST, url: "{}/boom", timeout: 5s }}
nodes:
  provision:
    workflow: child.yaml
    with: {{ tenant: solo }}
  boom:
    tool: post
"#,
            server.url()
        );
        let file = db.write("failing.yaml", &text);
        let out = output(db.flow().arg("run").arg(&file));
        assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let child = show(&db, &format!("{run}.provision"));
        assert_eq!(
            child["run"]["status"], "cancelled",
            "{backend:?}: the failed parent's child is cancelled: {}",
            child["run"]
        );
        let out = output(db.flow().args(["redrive", &run, "--from", "provision"]));
        assert_eq!(out.status.code(), Some(2), "{backend:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("runs a sub-workflow"),
            "{backend:?}: {}",
            stderr(&out)
        );
    }
}

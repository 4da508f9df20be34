//! MCP tasks at the adapter, against the testkit's `task` tool pinned to each protocol
//! revision, over stdio and streamable HTTP: the task id is reported before the result,
//! a task outliving the deadline comes back unknown *with* its id, and `collect` asks
//! `tasks/get` for it (from a new session too, over HTTP) without calling again.

use std::time::Duration;

use flow_adapters::mcp::{Elicitation, Pool, ServerSpec, Spec};
use flow_adapters::{FailureKind, Report, Reports, Tool};
use serde_json::json;

use crate::mcp_pinned::{self as pinned, VERSIONS, http, http_spec, stdio};
use crate::support::{assert_kind, call, call_within, ok};

/// The testkit's `task` tool of `server`.
fn spec(server: ServerSpec) -> Spec {
    pinned::spec(server, "task", Elicitation::Decline)
}

/// The task id reported for a call, which must come before its outcome.
fn reported_task(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Report>, ctx: &str) -> String {
    match rx.try_recv() {
        Ok(Report::Task(id)) => id,
        other => panic!("{ctx}: no task reported: {other:?}"),
    }
}

/// One session: a task that ends in time, one that outlives the deadline and is
/// collected, and a task id the server does not know.
async fn tasks_on(server: ServerSpec, ctx: &str) -> String {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(spec(server));
    let (reports, mut rx) = Reports::channel();
    let out = tool
        .call(call(json!({"key": "a", "ms": 50})).with_reports(reports))
        .await;
    assert_eq!(ok(&out)["count"], 1, "{ctx}");
    assert_eq!((out.requests_sent, out.task.as_deref()), (1, None), "{ctx}");
    reported_task(&mut rx, ctx);

    let (reports, mut rx) = Reports::channel();
    let slow = tool
        .call(
            call_within(json!({"key": "b", "ms": 700}), Duration::from_millis(200))
                .with_reports(reports),
        )
        .await;
    assert_kind(&slow, FailureKind::Unknown, "still working");
    let id = reported_task(&mut rx, ctx);
    assert_eq!(slow.task.as_deref(), Some(id.as_str()), "{ctx}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let collected = tool.collect(call(json!({})), &id).await;
    assert_eq!(ok(&collected)["key"], "b", "{ctx}");
    assert_eq!(collected.requests_sent, 0, "{ctx}: a poll is not a request");

    let lost = tool.collect(call(json!({})), "no-such-task").await;
    assert_kind(
        &lost,
        FailureKind::Unknown,
        "could not learn how task no-such-task ended",
    );
    assert_eq!(
        lost.task, None,
        "{ctx}: a task the server forgot is in doubt"
    );
    pool.close().await;
    id
}

#[tokio::test]
async fn tasks_over_stdio_on_every_revision() {
    for version in VERSIONS {
        tasks_on(stdio(version), &format!("stdio {version}")).await;
    }
}

#[tokio::test]
async fn tasks_over_http_on_every_revision_outlive_the_session() {
    for version in VERSIONS {
        let server = http(version).await;
        let url = http_spec(&server);
        let ctx = format!("http {version}");
        let id = tasks_on(url.clone(), &ctx).await;
        // Another process's pool (a resumed run): a new session asks for the same task.
        let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
        let again = pool.tool(spec(url)).collect(call(json!({})), &id).await;
        assert_eq!(ok(&again)["key"], "b", "{ctx}");
        pool.close().await;
        assert_eq!(
            server.stats().calls("task"),
            2,
            "{ctx}: collecting never calls"
        );
        assert!(server.stats().task_gets() >= 3, "{ctx}");
        server.shutdown().await;
    }
}

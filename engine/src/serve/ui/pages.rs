//! The console's pages: the runs list, one run, the In doubt inbox, the sign-in form.
//! Each reads through the functions the JSON API uses and renders a template.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use flow_ledger::{Run, Step, Timestamp, ToolCall};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::session::Signed;
use super::{Page, Ui, who};
use crate::serve::api::in_doubt::CallFilter;
use crate::serve::api::runs::{ListQuery, page};
use crate::serve::auth::Tokens;

/// Runs per page of the runs list.
const PAGE: u32 = 50;

/// A query string, its rejection a 400 page naming the parameter.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Page> {
    q.map(|Query(v)| v)
        .map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))
}

fn ts(t: Option<Timestamp>) -> Json {
    t.map_or(Json::Null, |t| Json::String(t.to_rfc3339()))
}

/// A JSON value as indented text for a `<pre>` (escaped by the template).
pub(super) fn pretty(v: &Json) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// `GET /ui/sign-in`.
pub async fn sign_in(State(ui): State<Arc<Ui>>) -> Page {
    if matches!(ui.app.tokens, Tokens::Insecure) {
        return Page::redirect("/ui/runs");
    }
    sign_in_page(&ui, StatusCode::OK, None)
}

/// The sign-in form, with `error` above it.
pub(super) fn sign_in_page(ui: &Ui, status: StatusCode, error: Option<&str>) -> Page {
    let ctx = json!({
        "title": "Sign in",
        "csrf": ui.sessions.csrf("sign-in", ""),
        "error": error,
    });
    Page::render(status, "sign_in.html", &ctx)
}

/// The query of the runs list.
#[derive(Debug, Default, Deserialize)]
pub struct RunsQuery {
    /// Only runs in this state (empty: any).
    #[serde(default)]
    status: String,
    /// The cursor of the page to show.
    #[serde(default)]
    cursor: String,
}

/// `GET /ui/runs?status=&cursor=`: newest first, paged with the API's keyset cursor.
pub async fn runs(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    let list = ListQuery {
        status: Some(q.status.clone()).filter(|s| !s.is_empty()),
        limit: Some(PAGE),
        cursor: Some(q.cursor.clone()).filter(|s| !s.is_empty()),
        ..ListQuery::default()
    };
    let (runs, next) = page(&ui.app, list).await?;
    let rows: Vec<Json> = runs
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "status": r.status.as_str(),
                "workflow": r.workflow_name,
                "created_at": r.created_at.to_rfc3339(),
                "finished_at": ts(r.finished_at),
            })
        })
        .collect();
    let statuses: Vec<&str> = flow_ledger::RunStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    let ctx = json!({
        "title": "Runs",
        "nav": "runs",
        "who": who(&signed, &ui),
        "runs": rows,
        "status": q.status,
        "statuses": statuses,
        "next": next,
        "first_page": q.cursor.is_empty(),
    });
    Ok(Page::render(StatusCode::OK, "runs.html", &ctx))
}

/// The query of a run page.
#[derive(Debug, Default, Deserialize)]
pub struct RunQuery {
    /// A node whose call this user just resolved (shown as a notice).
    #[serde(default)]
    resolved: String,
    /// How many calls this user's "probe now" just settled (shown as a notice).
    #[serde(default)]
    probed: Option<u32>,
}

/// `GET /ui/runs/{id}`: the run, its nodes in plan order with their `needs`, steps and
/// call, and the audit trail; refreshes itself while the run is not terminal.
pub async fn run(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    q: Result<Query<RunQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    let ledger = &ui.app.ledger;
    let missing = |e: flow_ledger::Error| match e {
        flow_ledger::Error::NotFound { .. } => {
            Page::error(StatusCode::NOT_FOUND, format!("no run `{id}`"))
        }
        e => Page::from(crate::serve::problem::Problem::ledger(&e)),
    };
    let run = ledger.get_run(&id).await.map_err(missing)?;
    let steps = ledger.list_steps(&id).await.map_err(missing)?;
    let calls = ledger.list_calls(&id).await.map_err(missing)?;
    let audit = crate::cli::show::audit_trail(ledger, &id)
        .await
        .map_err(missing)?;
    let in_doubt = calls
        .iter()
        .filter(|c| c.status == flow_ledger::CallStatus::InDoubt)
        .count();
    let probes: Vec<Json> = ledger
        .list_probes(&id)
        .await
        .map_err(missing)?
        .iter()
        .map(|p| {
            json!({
                "node": p.tool_call_id, "probe": p.probe, "key": p.sent_key,
                "at": p.probed_at.to_rfc3339(), "observed": p.observed.as_str(),
                "decision": p.decision.as_str(), "http_status": p.http_status,
                "detail": p.detail, "by": p.by,
            })
        })
        .collect();
    let ctx = json!({
        "title": format!("Run {}", run.id),
        "nav": "runs",
        "who": who(&signed, &ui),
        "run": run_json(&run),
        "refresh": !run.status.is_terminal(),
        "run_terminal": run.status.is_terminal(),
        "nodes": nodes(&run, &steps, &calls),
        "audit": audit,
        "in_doubt": in_doubt,
        "can_probe": in_doubt > 0 && run.status == flow_ledger::RunStatus::Paused,
        "probes": probes,
        "probed": q.probed,
        "resolved": Some(q.resolved).filter(|s| !s.is_empty()),
    });
    Ok(Page::render(StatusCode::OK, "run.html", &ctx))
}

/// The run header: the `flow show --json` run object, inputs and output indented.
fn run_json(run: &Run) -> Json {
    let mut v = crate::cli::show::run_object(run);
    v["inputs"] = Json::String(pretty(&run.inputs));
    v["output"] = run
        .output
        .as_ref()
        .map_or(Json::Null, |o| Json::String(pretty(o)));
    v
}

/// The run's nodes in plan order (nodes the snapshot does not name, after), each with
/// its `needs`, state, steps and call.
fn nodes(run: &Run, steps: &[Step], calls: &[ToolCall]) -> Vec<Json> {
    let mut order: Vec<(String, Vec<String>, String)> = match crate::snapshot::snapshot(run) {
        Ok(wf) => wf
            .plan()
            .order()
            .iter()
            .map(|&i| {
                let n = &wf.nodes[i];
                (n.id.clone(), n.needs.clone(), n.tool.clone())
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    for s in steps {
        if !order.iter().any(|(id, _, _)| id == &s.node_id) {
            order.push((s.node_id.clone(), Vec::new(), String::new()));
        }
    }
    order
        .into_iter()
        .map(|(id, needs, tool)| {
            let mine: Vec<&Step> = steps.iter().filter(|s| s.node_id == id).collect();
            let state = mine.last().map_or("not started", |s| s.status.as_str());
            let call = calls.iter().find(|c| c.tool_call_id == id).map(call_json);
            json!({
                "id": id,
                "needs": needs,
                "tool": tool,
                "state": state,
                "steps": mine.iter().map(|s| step_json(s)).collect::<Vec<_>>(),
                "call": call,
            })
        })
        .collect()
}

fn step_json(s: &Step) -> Json {
    json!({
        "step_id": s.step_id,
        "retry": s.retry,
        "status": s.status.as_str(),
        "started_at": ts(s.started_at),
        "finished_at": ts(s.finished_at),
        "not_before": ts(s.not_before),
        "error": s.error_message.as_ref().map(|m| format!("{}: {m}", s.error_kind.map_or("error", |k| k.as_str()))),
    })
}

/// One call as the run page and the inbox show it (the request as stored: secrets are
/// names, never values).
pub(super) fn call_json(c: &ToolCall) -> Json {
    json!({
        "run": c.run_id,
        "node": c.tool_call_id,
        "tool": c.tool,
        "status": c.status.as_str(),
        "attempts": c.attempt_count,
        // `null` when a send's count is unknown (a crash after the outbound mark):
        // never a bare 0 beside "the request left"; `requests_known` is the lower bound.
        "requests_sent": c.requests_sent().exact(),
        "requests_known": c.outbound_requests,
        "uncounted_sends": c.uncounted_sends,
        "requests_text": c.requests_sent().to_string(),
        "key": c.current_key,
        "outbound_at": ts(c.outbound_started_at),
        "in_doubt_at": ts(c.in_doubt_at),
        "error": c.error_message.as_ref().map(|m| format!("{}: {m}", c.error_kind.map_or("error", |k| k.as_str()))),
        "resolution": c.resolution.as_ref().map(|how| json!({
            "how": how, "by": c.resolved_by, "at": ts(c.resolved_at), "reason": c.resolution_note,
        })),
        "request": pretty(&c.request),
        "output": c.output.as_ref().map(pretty),
    })
}

/// The query of the inbox (its filter).
#[derive(Debug, Default, Deserialize)]
pub struct InboxQuery {
    /// Only calls of this run.
    #[serde(default)]
    pub(super) run: String,
    /// Only calls of this node.
    #[serde(default)]
    pub(super) node: String,
    /// Only calls of this tool.
    #[serde(default)]
    pub(super) tool: String,
}

impl InboxQuery {
    /// The API's filter (empty fields match anything).
    pub(super) fn filter(&self) -> CallFilter {
        let some = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        CallFilter {
            run: some(&self.run),
            node: some(&self.node),
            tool: some(&self.tool),
        }
    }
}

/// `GET /ui/in-doubt?run=&node=&tool=`: every call in doubt across runs.
pub async fn in_doubt(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    inbox(&ui, &signed, &q, StatusCode::OK, json!({})).await
}

/// The inbox page, with `notice` (`{error}`, `{info}`, the form values to keep) from a
/// form that was just posted, answered with `status`.
pub(super) async fn inbox(
    ui: &Ui,
    signed: &Signed,
    q: &InboxQuery,
    status: StatusCode,
    notice: Json,
) -> Result<Page, Page> {
    let calls = ui
        .app
        .ledger
        .list_in_doubt(q.filter().ledger())
        .await
        .map_err(|e| Page::from(crate::serve::problem::Problem::ledger(&e)))?;
    let ctx = json!({
        "title": "In doubt",
        "nav": "in-doubt",
        "who": who(signed, ui),
        "calls": calls.iter().map(call_json).collect::<Vec<_>>(),
        "filter": {"run": q.run, "node": q.node, "tool": q.tool},
        "notice": notice,
    });
    Ok(Page::render(status, "in_doubt.html", &ctx))
}

//! The console's pages: the runs list, one run, the In doubt inbox, the sign-in form.
//! Each reads through the functions the JSON API uses and renders a template.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::session::Signed;
use super::{Page, Ui, who};
use crate::serve::api::in_doubt::CallFilter;
use crate::serve::api::runs::{ListQuery, page};
use crate::serve::auth::Tokens;
use crate::view::{CallView, RunSummary, RunView};

/// Runs per page of the runs list.
const PAGE: u32 = 50;

/// A query string, its rejection a 400 page naming the parameter.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Page> {
    q.map(|Query(v)| v)
        .map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))
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
    let rows: Vec<RunSummary> = runs.iter().map(RunSummary::of).collect();
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
    let view = RunView::load(ledger, &id).await.map_err(missing)?;
    let status = view.run.summary.status;
    let in_doubt = view.in_doubt().count();
    let ctx = json!({
        "title": format!("Run {}", view.run.summary.id),
        "nav": "runs",
        "who": who(&signed, &ui),
        "view": view,
        "refresh": !status.is_terminal(),
        "run_terminal": status.is_terminal(),
        "in_doubt": in_doubt,
        "can_probe": in_doubt > 0 && status == flow_ledger::RunStatus::Paused,
        "probed": q.probed,
        "resolved": Some(q.resolved).filter(|s| !s.is_empty()),
    });
    Ok(Page::render(StatusCode::OK, "run.html", &ctx))
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
        "calls": calls.iter().map(|c| CallView::of(c, &[])).collect::<Vec<_>>(),
        "filter": {"run": q.run, "node": q.node, "tool": q.tool},
        "notice": notice,
    });
    Ok(Page::render(status, "in_doubt.html", &ctx))
}

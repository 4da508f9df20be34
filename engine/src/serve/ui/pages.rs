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

/// The query of the runs list: the API's filters, an `input` field holding
/// `NAME=VALUE`, and a page size.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RunsQuery {
    /// Only runs in this state (empty: any).
    status: String,
    /// Only runs of this workflow.
    workflow: String,
    /// Only runs created at or after (RFC 3339 or a duration ago).
    since: String,
    /// Only runs created before.
    until: String,
    /// Only runs whose id starts with this.
    prefix: String,
    /// `NAME=VALUE`: only runs whose input NAME is VALUE.
    input: String,
    /// Runs per page.
    limit: Option<u32>,
    /// The cursor of the page to show.
    cursor: String,
}

/// The page sizes the runs list offers.
const PAGE_SIZES: [u32; 4] = [25, 50, 100, 200];

impl RunsQuery {
    /// The API's query for this page (with the counts by status).
    fn list(&self) -> Result<ListQuery, Page> {
        let some = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
        let inputs = match self.input.trim() {
            "" => Vec::new(),
            pair => match pair.split_once('=') {
                Some((name, value)) if !name.trim().is_empty() => {
                    vec![(name.trim().to_string(), value.trim().to_string())]
                }
                _ => {
                    return Err(Page::error(
                        StatusCode::BAD_REQUEST,
                        format!("input `{pair}`: write NAME=VALUE, e.g. order_id=117"),
                    ));
                }
            },
        };
        Ok(ListQuery {
            status: some(&self.status),
            workflow: some(&self.workflow),
            since: some(&self.since),
            until: some(&self.until),
            prefix: some(&self.prefix),
            limit: Some(self.limit.unwrap_or(PAGE)),
            cursor: some(&self.cursor),
            counts: true,
            inputs,
        })
    }

    /// This query as a query string, without its cursor (for the pager and the links).
    fn filters(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("workflow", &self.workflow),
            ("since", &self.since),
            ("until", &self.until),
            ("prefix", &self.prefix),
            ("input", &self.input),
        ] {
            if !v.trim().is_empty() {
                q.append_pair(k, v.trim());
            }
        }
        if let Some(n) = self.limit {
            q.append_pair("limit", &n.to_string());
        }
        q.finish()
    }
}

/// `GET /ui/runs?status=&workflow=&since=&until=&prefix=&input=&limit=&cursor=`:
/// newest first, paged with the API's keyset cursor, with the counts by status under
/// the same filters.
pub async fn runs(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    let listed = page(&ui.app, q.list()?).await?;
    let rows: Vec<RunSummary> = listed.runs.iter().map(RunSummary::of).collect();
    let statuses: Vec<&str> = flow_ledger::RunStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    let total: i64 = listed.counts.iter().flatten().map(|c| c.count).sum();
    let ctx = json!({
        "title": "Runs",
        "nav": "runs",
        "who": who(&signed, &ui),
        "runs": rows,
        "status": q.status,
        "statuses": statuses,
        "counts": listed.counts,
        "total": total,
        "q": {
            "workflow": q.workflow, "since": q.since, "until": q.until,
            "prefix": q.prefix, "input": q.input, "limit": q.limit.unwrap_or(PAGE),
        },
        "filters": q.filters(),
        "page_sizes": PAGE_SIZES,
        "next": listed.next,
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

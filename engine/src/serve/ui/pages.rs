//! The console's pages: the runs list, one run, the In doubt inbox, the sign-in form.
//! Each reads through the functions the JSON API uses and renders a template.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use flow_ledger::EventFilter;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::session::{Signed, local_next};
use super::{Page, Ui, who};
use crate::serve::api::runs::{ListQuery, page};
use crate::serve::auth::Tokens;
use crate::serve::problem::Problem;
use crate::view::{RunSummary, RunView};

/// Runs per page of the runs list.
const PAGE: u32 = 50;

/// A query string, its rejection a 400 page naming the parameter.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Page> {
    q.map(|Query(v)| v)
        .map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))
}

/// A JSON value as indented text for a `<pre>` (escaped by the template).
pub(super) fn pretty(v: &Json) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// The query of the sign-in page: where to go once signed in.
#[derive(Debug, Default, Deserialize)]
pub struct SignInQuery {
    /// A console page (`/ui/…`) asked for before signing in; anything else is ignored
    /// (see [`local_next`]).
    #[serde(default)]
    next: String,
}

/// `GET /ui/sign-in?next=`.
pub async fn sign_in(
    State(ui): State<Arc<Ui>>,
    q: Result<Query<SignInQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    let next = local_next(&q.next);
    if matches!(ui.app.tokens, Tokens::Insecure) {
        return Ok(Page::redirect(next.unwrap_or("/ui/runs")));
    }
    Ok(sign_in_page(&ui, StatusCode::OK, None, next))
}

/// The sign-in form, with `error` above it and `next` (already checked) to return to.
pub(super) fn sign_in_page(
    ui: &Ui,
    status: StatusCode,
    error: Option<&str>,
    next: Option<&str>,
) -> Page {
    let ctx = json!({
        "title": "Sign in",
        "csrf": ui.sessions.csrf("sign-in", ""),
        "error": error,
        "next": next.unwrap_or(""),
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
    /// Only the children of this run.
    parent: String,
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
            parent: some(&self.parent),
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
            ("parent", &self.parent),
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
        "who": who(&signed, &ui).await?,
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

/// Events the run page's history shows at most (the ledger's page size).
const TIMELINE: u32 = 1_000;

/// `GET /ui/runs/{id}/items?node=&status=&after=`: a `for_each` node's items, a page
/// at a time (the run page lists only those that did not simply succeed).
pub async fn items(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    q: Result<Query<crate::serve::api::items::ItemQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let q = query(q)?;
    let page = crate::serve::api::items::page(&ui.app.ledger, &id, &q)
        .await
        .map_err(Page::from)?;
    let ctx = json!({
        "title": format!("Items of {} in run {id}", q.node),
        "nav": "runs",
        "who": who(&signed, &ui).await?,
        "run": id,
        "node": q.node,
        "status": q.status,
        "after": q.after,
        "limit": q.limit,
        "page": page,
    });
    Ok(Page::render(StatusCode::OK, "items.html", &ctx))
}

/// `GET /ui/runs/{id}`: the run, its graph, its nodes in plan order with their `needs`,
/// steps and call, its history (the run's events) and the audit trail. The page updates
/// itself while open (live.js, on the run's events); "Refresh" does it by hand.
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
        e => Page::from(Problem::ledger(&e)),
    };
    let live_after = super::live::last_seq(ledger).await?;
    let view = RunView::load(ledger, &id).await.map_err(missing)?;
    let (graph, graph_missing) = graph(ledger, &view).await;
    let events = ledger
        .list_events(EventFilter {
            run_id: Some(id.clone()),
            limit: TIMELINE,
            ..EventFilter::default()
        })
        .await
        .map_err(|e| Page::from(Problem::ledger(&e)))?;
    let timeline = super::history::timeline(&events, &view.steps);
    let status = view.run.summary.status;
    let in_doubt = view.in_doubt().count();
    let ctx = json!({
        "title": format!("Run {}", view.run.summary.id),
        "nav": "runs",
        "who": who(&signed, &ui).await?,
        "graph": graph,
        "graph_missing": graph_missing,
        "timeline": timeline,
        "timeline_cut": events.len() >= TIMELINE as usize,
        "view": view,
        "live_after": live_after,
        "run_terminal": status.is_terminal(),
        "in_doubt": in_doubt,
        "can_probe": in_doubt > 0 && status == flow_ledger::RunStatus::Paused,
        "probed": q.probed,
        "resolved": Some(q.resolved).filter(|s| !s.is_empty()),
    });
    Ok(Page::render(StatusCode::OK, "run.html", &ctx))
}

/// The run's graph as SVG, from the plan of its stored workflow (`flow graph`'s), each
/// node coloured by its state in `view`; or, when it cannot be drawn, why.
async fn graph(ledger: &flow_ledger::Ledger, view: &RunView) -> (Option<String>, String) {
    let run = match ledger.get_run(&view.run.summary.id).await {
        Ok(run) => run,
        Err(e) => return (None, format!("The run's workflow could not be read: {e}")),
    };
    let wf = match crate::snapshot::snapshot(&run) {
        Ok(wf) => wf,
        Err(why) => return (None, why),
    };
    let state = |id: &str| {
        view.nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| n.status)
            .map(|s| s.as_str().to_string())
    };
    match super::graph::svg(&wf, state) {
        Some(svg) => (Some(svg), String::new()),
        None => (
            None,
            format!(
                "This workflow has {} nodes, more than the {} drawn here: `flow graph` draws it (Mermaid or DOT).",
                wf.nodes.len(),
                super::graph::MAX_NODES
            ),
        ),
    }
}

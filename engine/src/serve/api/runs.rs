//! `GET/POST /api/v1/runs`, `POST /api/v1/runs:batch`, `GET /api/v1/runs/{id}`.
//!
//! A submitted run is checked as `flow submit` checks a file — the workflow validates
//! (422 with every `FILE:LINE:COL` diagnostic otherwise), the inputs type-check against
//! its declarations, the run id is well formed — before anything is written.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flow_ledger::{Actor, NewRun, RunCursor, RunFilter, RunStatus, workflow_hash};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json_, json};

use crate::serve::App;
use crate::serve::auth::{Authed, Operator, Viewer};
use crate::serve::problem::{ApiJson, Problem};
use crate::snapshot::validate_options;
use crate::view::{RunSummary, RunView, parse_time};

/// Most runs one page lists.
const MAX_PAGE: u32 = 1_000;

/// The query of `GET /api/v1/runs` (besides its `input.NAME=VALUE` pairs, which
/// [`list_query`] reads: a struct cannot name them).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs in this state.
    #[schemars(with = "Option<RunStatus>")]
    pub(crate) status: Option<String>,
    /// Only runs of this workflow (its `name:`).
    pub(crate) workflow: Option<String>,
    /// Only runs created at or after: RFC 3339 or a duration ago (`2h`).
    pub(crate) since: Option<String>,
    /// Only runs created before: RFC 3339 or a duration ago.
    pub(crate) until: Option<String>,
    /// Only runs whose id starts with this text (as pasted from a log line).
    pub(crate) prefix: Option<String>,
    /// Only the children of this run (the runs its sub-workflow nodes started).
    pub(crate) parent: Option<String>,
    /// Also count the runs in each status under the same filters (`counts`).
    #[serde(default)]
    pub(crate) counts: bool,
    /// `input.NAME=VALUE` pairs: only runs whose input NAME is VALUE (a string, or a
    /// number or boolean written as JSON); several are ANDed.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) inputs: Vec<(String, String)>,
    /// Page size, 1 to 1,000 (default 100).
    #[schemars(range(min = 1, max = 1000))]
    pub(crate) limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub(crate) cursor: Option<String>,
}

/// `GET /api/v1/runs`: newest first, keyset-paged (`next_cursor`, null on the last
/// page), so pages stay put while runs are added.
pub async fn list(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    uri: axum::http::Uri,
) -> Result<Response, Problem> {
    let q = list_query(uri.query().unwrap_or_default())?;
    let page = page(&app, q).await?;
    let body = RunList {
        runs: page.runs.iter().map(RunSummary::of).collect(),
        next_cursor: page.next,
        counts: page.counts,
    };
    Ok(Json(body).into_response())
}

/// The listing's query from the raw query string: `input.NAME=VALUE` pairs apart, the
/// rest as [`ListQuery`] (400 naming an unknown or malformed parameter).
pub(crate) fn list_query(raw: &str) -> Result<ListQuery, Problem> {
    let mut inputs = Vec::new();
    let mut rest = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        match key.strip_prefix("input.") {
            Some("") => {
                return Err(Problem::bad_request(
                    "input.: name the input (`input.order_id=117`)",
                ));
            }
            Some(name) => inputs.push((name.to_string(), value.into_owned())),
            None => {
                rest.append_pair(&key, &value);
            }
        }
    }
    let uri: axum::http::Uri = format!("/?{}", rest.finish())
        .parse()
        .map_err(|_| Problem::bad_request("the query string is malformed"))?;
    let axum::extract::Query(mut q) = axum::extract::Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| Problem::bad_request(e.body_text()))?;
    q.inputs = inputs;
    Ok(q)
}

/// How many runs are in one status.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StatusCount {
    /// The status.
    pub status: RunStatus,
    /// Runs in it under the listing's filters.
    pub count: i64,
}

/// A page of runs.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunList {
    /// The runs, newest first.
    pub runs: Vec<RunSummary>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
    /// With `counts=true`: the runs in each status under the same filters (every
    /// status, zeros included); else `null`.
    pub counts: Option<Vec<StatusCount>>,
}

/// One page of runs, the next page's cursor and, when asked, the counts by status.
#[derive(Debug)]
pub(crate) struct Page {
    /// The runs, newest first.
    pub(crate) runs: Vec<flow_ledger::Run>,
    /// The next page's cursor (`None` on the last).
    pub(crate) next: Option<String>,
    /// The counts by status under the same filters, when asked.
    pub(crate) counts: Option<Vec<StatusCount>>,
}

/// A queued run (or the existing one its `run_id` names).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Submitted {
    /// The run id.
    pub id: String,
    /// Its state now.
    pub status: RunStatus,
    /// `false` when a run with this id, workflow and inputs already existed.
    pub created: bool,
}

/// What a batch queued, in request order.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchSubmitted {
    /// One per submitted run.
    pub runs: Vec<Submitted>,
}

/// One page of runs as `q` asks (checked: 400 naming the parameter at fault), the
/// cursor of the next page and the counts if asked. Shared by the JSON listing and the
/// console's runs page.
pub(crate) async fn page(app: &App, q: ListQuery) -> Result<Page, Problem> {
    let want_counts = q.counts;
    let (filter, limit) = filter(q, app.now())?;
    let counts = if want_counts {
        let by_status = app
            .ledger
            .count_runs(&filter)
            .await
            .map_err(|e| listing_problem(&e))?;
        Some(
            by_status
                .into_iter()
                .map(|(status, count)| StatusCount { status, count })
                .collect(),
        )
    } else {
        None
    };
    let mut runs = app
        .ledger
        .list_runs(filter)
        .await
        .map_err(|e| listing_problem(&e))?;
    let more = runs.len() > limit as usize;
    runs.truncate(limit as usize);
    let next = more
        .then(|| runs.last().map(|r| RunCursor::after(r).encode()))
        .flatten();
    Ok(Page { runs, next, counts })
}

/// A listing the ledger refused: a bad input name or prefix is the caller's (400).
fn listing_problem(e: &flow_ledger::Error) -> Problem {
    match e {
        flow_ledger::Error::InvalidFilter { .. } => Problem::bad_request(e.to_string()),
        e => Problem::ledger(e),
    }
}

/// The ledger's filter for `q` (one more run than the page, to tell whether another
/// page follows) and the page size; 400 naming the parameter at fault. `now` is what
/// a duration ago (`since=2h`) counts back from.
fn filter(q: ListQuery, now: flow_ledger::Timestamp) -> Result<(RunFilter, u32), Problem> {
    let status = q
        .status
        .as_deref()
        .map(|s| {
            s.parse::<RunStatus>().map_err(|_| {
                Problem::bad_request(format!(
                    "status: unknown status `{s}`; use queued, running, succeeded, failed, paused or cancelled"
                ))
            })
        })
        .transpose()?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "limit: must be 1 to {MAX_PAGE}, not {limit}"
        )));
    }
    let time = |name: &str, text: Option<&str>| {
        text.map(|t| {
            parse_time(t, now).ok_or_else(|| {
                Problem::bad_request(format!(
                    "{name}: `{t}` is neither an RFC 3339 time nor a duration ago (2h, 30m)"
                ))
            })
        })
        .transpose()
    };
    let since = time("since", q.since.as_deref())?;
    let until = time("until", q.until.as_deref())?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            RunCursor::decode(c)
                .ok_or_else(|| Problem::bad_request(format!("cursor: `{c}` is not a cursor")))
        })
        .transpose()?;
    let filter = RunFilter {
        status,
        limit: limit + 1,
        workflow: q.workflow,
        since,
        until,
        after,
        inputs: q.inputs,
        id_prefix: q.prefix.filter(|p| !p.is_empty()),
        parent: q.parent,
    };
    Ok((filter, limit))
}

/// `GET /api/v1/runs/{id}`: exactly the `flow show --json` object.
pub async fn show(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    match RunView::load(&app.ledger, &id).await {
        Ok(v) => Ok(Json(v).into_response()),
        Err(flow_ledger::Error::NotFound { .. }) => {
            Err(Problem::not_found(format!("no run `{id}`")))
        }
        Err(e) => Err(Problem::ledger(&e)),
    }
}

/// One run to submit.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRun {
    /// The workflow's YAML text.
    workflow: String,
    /// Inputs by name (typed by the workflow's declarations).
    #[serde(default)]
    inputs: Map<String, Json_>,
    /// Makes the submit idempotent: the same workflow and inputs return this run.
    run_id: Option<String>,
}

/// The run `req` describes, checked; `Err` is the problem (422 for a workflow that does
/// not validate, 400 for bad inputs or run id). `at` prefixes messages in a batch.
fn check(
    req: SubmitRun,
    at: &str,
    parsed: &mut Parsed,
    public_url: Option<&str>,
) -> Result<NewRun, Problem> {
    let hash = workflow_hash(&req.workflow);
    if !parsed.contains_key(&hash) {
        let wf = validate(&req.workflow, at)?;
        parsed.insert(hash.clone(), wf);
    }
    let Some(wf) = parsed.get(&hash) else {
        return Err(Problem::bad_request(format!("{at}workflow: not parsed")));
    };
    if public_url.is_none()
        && let Some(node) = wf.nodes.iter().find(|n| n.callback().is_some())
    {
        return Err(Problem::bad_request(format!(
            "{at}workflow: node `{}` has `callback:`, which needs `public_url` under `[api]` in this server's flow.toml (`callback.url` is built from it)",
            node.id
        )));
    }
    let inputs = crate::inputs::from_json(wf, req.inputs)
        .map_err(|e| Problem::bad_request(format!("{at}inputs: {e}")))?;
    let id = match req.run_id {
        Some(id) => {
            flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, &id)
                .map_err(|e| Problem::bad_request(format!("{at}run_id: {e}")))?;
            id
        }
        None => format!("run_{}", ulid::Ulid::generate()),
    };
    Ok(NewRun {
        id,
        workflow_name: wf.name.clone(),
        workflow_text: req.workflow,
        inputs,
        priority: 0,
        not_before: None,
        trace_parent: None,
    })
}

/// Workflows already validated in this request, by hash: a batch of 1,000 runs of one
/// workflow parses it once.
type Parsed = std::collections::HashMap<String, crate::workflow::ValidWorkflow>;

/// The workflow `text`, validated; 422 with every `FILE:LINE:COL` diagnostic otherwise.
fn validate(text: &str, at: &str) -> Result<crate::workflow::ValidWorkflow, Problem> {
    let file = "workflow.yaml";
    crate::workflow::parse_with(text, file, &validate_options()).map_err(|diags| {
        let errors: Vec<Json_> = diags
            .items
            .iter()
            .map(|d| {
                json!({
                    "line": d.pos.line,
                    "col": d.pos.col,
                    "message": d.message,
                    "help": d.help,
                    "text": d.render(file).trim_end(),
                })
            })
            .collect();
        let detail = format!(
            "{at}workflow: {} problem(s); nothing was queued",
            errors.len()
        );
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, detail).with("errors", Json_::Array(errors))
    })
}

/// The problem for an id reused with another workflow or inputs: 409 naming what
/// differs.
fn conflict(e: flow_ledger::Error, id: &str) -> Problem {
    match e {
        flow_ledger::Error::Conflict { reason, .. } => {
            let differs = if reason.contains("workflow") {
                "workflow"
            } else {
                "inputs"
            };
            Problem::conflict(format!("run `{id}`: {reason}"))
                .with("run_id", json!(id))
                .with("differs", json!(differs))
        }
        e => Problem::ledger(&e),
    }
}

/// `POST /api/v1/runs`: 201 `{id, status}` for a new run; 200 with the same id when a
/// run with this `run_id`, workflow and inputs exists; 409 when the id is taken by
/// another workflow or inputs.
pub async fn submit(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    ApiJson(req): ApiJson<SubmitRun>,
) -> Result<Response, Problem> {
    let mut new = check(req, "", &mut Parsed::new(), app.gateway.public_url())?;
    new.trace_parent = traceparent(&headers);
    let id = new.id.clone();
    let actor = Actor {
        by: caller.name,
        reason: None,
    };
    let enq = app
        .ledger
        .enqueue_as(new, Some(actor), app.now())
        .await
        .map_err(|e| conflict(e, &id))?;
    let status = if enq.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = Submitted {
        id: enq.run.id,
        status: enq.run.status,
        created: enq.created,
    };
    Ok((status, Json(body)).into_response())
}

/// The W3C `traceparent` a submitter sent (its runs continue that trace), when it is a
/// valid one: anything else is ignored, as the W3C specification asks.
fn traceparent(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    crate::telemetry::w3c::parse(value, None).map(|_| value.to_owned())
}

/// The body of `POST /api/v1/runs:batch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// 1 to 1,000 runs.
    runs: Vec<SubmitRun>,
}

/// `POST /api/v1/runs:batch`: every run checked first, then all enqueued in ONE
/// commit (any conflict rolls the batch back: 409 naming the run). 200 with
/// `{runs: [{id, status, created}]}` in request order.
pub async fn batch(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    ApiJson(req): ApiJson<Batch>,
) -> Result<Response, Problem> {
    let trace = traceparent(&headers);
    if req.runs.is_empty() || req.runs.len() > flow_ledger::MAX_BATCH {
        return Err(Problem::bad_request(format!(
            "runs: a batch holds 1 to {} runs, not {}",
            flow_ledger::MAX_BATCH,
            req.runs.len()
        )));
    }
    let mut runs = Vec::with_capacity(req.runs.len());
    let mut parsed = Parsed::new();
    for (i, r) in req.runs.into_iter().enumerate() {
        let mut new = check(
            r,
            &format!("runs[{i}]."),
            &mut parsed,
            app.gateway.public_url(),
        )?;
        new.trace_parent.clone_from(&trace);
        runs.push(new);
    }
    let actor = Actor {
        by: caller.name,
        reason: None,
    };
    let enqueued = app
        .ledger
        .enqueue_batch(runs, Some(actor), app.now())
        .await
        .map_err(|e| {
            let id = match &e {
                flow_ledger::Error::Conflict { other_run, .. } => other_run.clone(),
                _ => String::new(),
            };
            conflict(e, &id)
        })?;
    let runs = enqueued
        .into_iter()
        .map(|e| Submitted {
            id: e.run.id,
            status: e.run.status,
            created: e.created,
        })
        .collect();
    Ok(Json(BatchSubmitted { runs }).into_response())
}

//! `GET /api/v1/in-doubt` (every call in doubt across runs), `POST
//! /api/v1/in-doubt:resolve` (settle many at once, admins only, with a dry run that
//! counts exactly what the real one would settle), and `GET /api/v1/events`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use flow_ledger::{EventFilter, InDoubtFilter, Resolution, Resolve, ToolCall};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json_;

use super::steer::{Outcome, resolution, resolve_refused};
use crate::serve::App;
use crate::serve::auth::{Admin, Authed, Caller, Viewer};
use crate::serve::problem::{ApiJson, ApiQuery, Problem};
use crate::view::inbox::doubt_events;
use crate::view::{CallView, EventView};

/// Most calls one bulk resolve settles (and one listing shows).
pub(crate) const MAX_CALLS: u32 = 1_000;

/// The pause between two settlements of a bulk resolve: at most 50 a second, so a
/// bulk operation cannot crowd the daemons' writes out of the database.
const SETTLE_PACE: Duration = Duration::from_millis(20);

/// Which calls in doubt (query of the listing, `filter` of the bulk resolve).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallFilter {
    /// Only calls of this run.
    pub(crate) run: Option<String>,
    /// Only calls of this node.
    pub(crate) node: Option<String>,
    /// Only calls of this tool.
    pub(crate) tool: Option<String>,
}

impl CallFilter {
    /// The ledger's filter (at most [`MAX_CALLS`] calls).
    pub(crate) fn ledger(self) -> InDoubtFilter {
        InDoubtFilter {
            run_id: self.run,
            node: self.node,
            tool: self.tool,
            limit: MAX_CALLS,
        }
    }
}

/// `GET /api/v1/in-doubt?run=&node=&tool=`: `{calls: [...]}`, oldest first (at most
/// 1,000); each with its key, outbound time, request as stored (secrets redacted),
/// attempts, requests sent and why it is in doubt (its last `tool_call.in_doubt`
/// event's reason, as `flow show --json` and the console's worklist say it).
pub async fn list(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    ApiQuery(filter): ApiQuery<CallFilter>,
) -> Result<Response, Problem> {
    let calls = app
        .ledger
        .list_in_doubt(filter.ledger())
        .await
        .map_err(|e| Problem::ledger(&e))?;
    // One read for the whole page, never one per call: the reasons are in the events.
    let doubts = doubt_events(&app.ledger, &calls)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let calls = CallView::in_doubt(&calls, &doubts);
    Ok(Json(InDoubtList { calls }).into_response())
}

/// Calls in doubt.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InDoubtList {
    /// Oldest first.
    pub calls: Vec<CallView>,
}

/// The body of `POST /api/v1/in-doubt:resolve`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bulk {
    /// Which calls (all in doubt when empty).
    #[serde(default)]
    filter: CallFilter,
    /// How to settle each.
    outcome: Outcome,
    /// With `succeeded`: the output every call gets.
    output: Option<Json_>,
    /// With `failed`: why.
    error: Option<String>,
    /// Recorded with each resolution.
    reason: Option<String>,
    /// Only list what would be settled.
    #[serde(default)]
    dry_run: bool,
}

/// `POST /api/v1/in-doubt:resolve`: settles each matched call (paced, see
/// [`SETTLE_PACE`]) — a call settled by someone else meanwhile is skipped, not an
/// error; with `dry_run`, lists the calls it would touch and writes nothing.
pub async fn resolve_many(
    Authed(caller, _): Authed<Admin>,
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<Bulk>,
) -> Result<Response, Problem> {
    let how = resolution(body.outcome, body.output, body.error)?;
    let dry = body.dry_run;
    let done = settle_many(&app, &caller, body.filter, &how, body.reason, dry).await?;
    let (counted, skipped) = (Some(done.settled), Some(done.skipped));
    let answer = BulkResolved {
        dry_run: dry,
        matched: done.matched,
        calls: done.calls,
        settled: counted.filter(|_| !dry),
        would_settle: counted.filter(|_| dry),
        skipped: skipped.clone().filter(|_| !dry),
        would_skip: skipped.filter(|_| dry),
    };
    Ok(Json(answer).into_response())
}

/// What a bulk resolve did or, dry, would do.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BulkResolved {
    /// Whether this was a dry run (nothing written).
    pub dry_run: bool,
    /// Calls the filter matched.
    pub matched: usize,
    /// The matched calls, oldest first.
    pub calls: Vec<CallRef>,
    /// Calls settled (not on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled: Option<usize>,
    /// Calls skipped: settled by someone else meanwhile, or a retry of a finished run's
    /// call (not on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Vec<Skipped>>,
    /// Dry run: calls the real one would settle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_settle: Option<usize>,
    /// Dry run: calls the real one would skip.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_skip: Option<Vec<Skipped>>,
}

/// One call a bulk resolve matched.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallRef {
    /// The run.
    pub run: String,
    /// The node.
    pub node: String,
    /// The tool.
    pub tool: String,
    /// The current attempt's idempotency key.
    pub key: String,
}

/// A call a bulk resolve passed over, and why.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Skipped {
    /// The run.
    pub run: String,
    /// The node.
    pub node: String,
    /// Why it was skipped.
    pub detail: String,
}

/// What a bulk resolve did (or, dry, would do).
#[derive(Debug)]
pub(crate) struct Settled {
    /// Calls the filter matched.
    pub(crate) matched: usize,
    /// The matched calls.
    pub(crate) calls: Vec<CallRef>,
    /// Calls settled (on a dry run: that would be).
    pub(crate) settled: usize,
    /// Each call skipped (someone else settled it meanwhile, or a finished run's retry).
    pub(crate) skipped: Vec<Skipped>,
}

/// Settles every call in doubt `filter` matches as `how` (paced, see [`SETTLE_PACE`]),
/// recording `caller` and `reason`; with `dry_run` only counts them. Shared by the JSON
/// bulk resolve and the console's, so both count and settle exactly alike.
pub(crate) async fn settle_many(
    app: &App,
    caller: &Caller,
    filter: CallFilter,
    how: &Resolution,
    reason: Option<String>,
    dry_run: bool,
) -> Result<Settled, Problem> {
    let calls = app
        .ledger
        .list_in_doubt(filter.ledger())
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let mut done = Settled {
        matched: calls.len(),
        calls: calls
            .iter()
            .map(|c| CallRef {
                run: c.run_id.clone(),
                node: c.tool_call_id.clone(),
                tool: c.tool.clone(),
                key: c.current_key.clone(),
            })
            .collect(),
        settled: 0,
        skipped: Vec::new(),
    };
    if dry_run {
        // Count exactly what the real one would settle: a `retry` of a finished run's
        // call is refused (nothing is left to send it), so it is listed as skipped.
        if matches!(how, Resolution::Retry) {
            done.skipped = finished_runs_calls(app, &calls).await?;
        }
        done.settled = done.matched - done.skipped.len();
        return Ok(done);
    }
    for (i, c) in calls.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(SETTLE_PACE).await;
        }
        if let Some(until) = crate::view::call::holder_may_send_until(c, app.now()) {
            done.skipped.push(Skipped {
                run: c.run_id.clone(),
                node: c.tool_call_id.clone(),
                detail: super::steer::holder_may_send(&c.run_id, &c.tool_call_id, until),
            });
            continue;
        }
        let req = Resolve {
            run_id: c.run_id.clone(),
            tool_call_id: c.tool_call_id.clone(),
            resolution: how.clone(),
            by: caller.name.clone(),
            note: reason.clone(),
        };
        match app.ledger.resolve_call(req, app.now()).await {
            // The ledger re-queues a paused run whose last doubt this settles.
            Ok(call) => {
                crate::telemetry::spans::resolved(&call, crate::telemetry::spans::Resolver::Api);
                done.settled += 1;
            }
            Err(e) => {
                let p = resolve_refused(&e, &c.run_id, &c.tool_call_id);
                if p.status.is_server_error() {
                    return Err(p);
                }
                done.skipped.push(Skipped {
                    run: c.run_id.clone(),
                    node: c.tool_call_id.clone(),
                    detail: p.detail,
                });
            }
        }
    }
    Ok(done)
}

/// `{run, node, detail}` of each call in `calls` whose run is finished: what a bulk
/// `retry` skips.
async fn finished_runs_calls(app: &App, calls: &[ToolCall]) -> Result<Vec<Skipped>, Problem> {
    let mut finished = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for c in calls {
        let status = match finished.get(&c.run_id) {
            Some(s) => *s,
            None => {
                let run = app
                    .ledger
                    .get_run(&c.run_id)
                    .await
                    .map_err(|e| Problem::ledger(&e))?;
                finished.insert(c.run_id.clone(), run.status);
                run.status
            }
        };
        if status.is_terminal() {
            let refused = flow_ledger::Error::Terminal { status };
            let p = resolve_refused(&refused, &c.run_id, &c.tool_call_id);
            out.push(Skipped {
                run: c.run_id.clone(),
                node: c.tool_call_id.clone(),
                detail: p.detail,
            });
        }
    }
    Ok(out)
}

/// The query of `GET /api/v1/events`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events after this `seq` (the previous page's `next_after`).
    after: Option<i64>,
    /// Page size, 1 to 1,000 (default 100).
    #[schemars(range(min = 1, max = 1000))]
    limit: Option<u32>,
    /// Only events of this run.
    run: Option<String>,
}

/// `GET /api/v1/events?after=&limit=&run=`: outbox events oldest first, `{events,
/// next_after}` (pass `next_after` back as `after` to follow the feed).
pub async fn events(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Response, Problem> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_CALLS).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "limit: must be 1 to {MAX_CALLS}, not {limit}"
        )));
    }
    let events = app
        .ledger
        .list_events(EventFilter {
            run_id: q.run,
            after_seq: q.after,
            limit,
        })
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let next = events.last().map_or(q.after, |e| Some(e.seq));
    let events = events.iter().map(EventView::of).collect();
    Ok(Json(EventPage {
        events,
        next_after: next,
    })
    .into_response())
}

/// A page of the event feed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EventPage {
    /// Oldest first.
    pub events: Vec<EventView>,
    /// Pass back as `after` to follow the feed (`null`: nothing yet).
    pub next_after: Option<i64>,
}

//! `POST /api/v1/runs/{id}/cancel`, `/resume` and `/resolve`: an operator steering one
//! run. Each records the token's name and the reason given in the ledger, in the event
//! the change writes (see `Ledger::request_cancel_as`), and answers with the run as
//! `GET /api/v1/runs/{id}` shows it after the change.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use flow_ledger::{Actor, Resolution, Resolve};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value as Json_;

use crate::serve::App;
use crate::serve::auth::{Authed, Caller, Operator};
use crate::serve::problem::{ApiJson, OptionalJson, Problem};
use crate::view::RunView;

/// The optional body of `cancel` and `resume`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Why {
    /// Recorded with the change.
    pub(crate) reason: Option<String>,
}

/// Who changed the run and why, for the event the change writes (the audit trail).
pub(crate) fn actor(caller: &Caller, reason: Option<String>) -> Actor {
    Actor {
        by: caller.name.clone(),
        reason,
    }
}

/// The run after a change, as `GET /api/v1/runs/{id}` shows it.
async fn answer(app: &App, id: &str) -> Result<Response, Problem> {
    RunView::load(&app.ledger, id)
        .await
        .map(|v| Json(v).into_response())
        .map_err(|e| Problem::ledger(&e))
}

/// The problem for a ledger error about run `id`.
fn refused(e: &flow_ledger::Error, id: &str, what: &str) -> Problem {
    match e {
        flow_ledger::Error::NotFound { .. } => Problem::not_found(format!("no run `{id}`")),
        flow_ledger::Error::Terminal { status } => {
            Problem::conflict(format!("cannot {what} run `{id}`: it is already {status}"))
        }
        e => {
            let mut p = Problem::ledger(e);
            p.detail = format!("cannot {what} run `{id}`: {}", p.detail);
            p
        }
    }
}

/// `POST /api/v1/runs/{id}/cancel`: as `flow cancel`.
pub async fn cancel(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    cancel_run(&app, &caller, &id, why.reason).await?;
    answer(&app, &id).await
}

/// Asks run `id` to stop as `caller`, recording the caller's name and `reason` (as
/// `flow cancel`): the JSON handler and the console's cancel form both call it.
pub(crate) async fn cancel_run(
    app: &App,
    caller: &Caller,
    id: &str,
    reason: Option<String>,
) -> Result<(), Problem> {
    let actor = actor(caller, reason);
    app.ledger
        .request_cancel_as(id, Some(actor), app.now())
        .await
        .map(|_| ())
        .map_err(|e| refused(&e, id, "cancel"))
}

/// `POST /api/v1/runs/{id}/resume`: puts a paused run (or one whose worker is gone)
/// back on the queue for the daemons, as `flow resume --detach`.
pub async fn resume(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    let actor = actor(&caller, why.reason);
    app.ledger
        .requeue_run_as(&id, Some(actor), app.now())
        .await
        .map_err(|e| refused(&e, &id, "resume"))?;
    answer(&app, &id).await
}

/// How to settle a call in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It happened; `output` is its output.
    Succeeded,
    /// It did not happen; `error` says why.
    Failed,
    /// Re-send with the same idempotency key.
    Retry,
}

/// The body of `POST /api/v1/runs/{id}/resolve`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// The node whose call is in doubt.
    node: String,
    /// How it is settled.
    outcome: Outcome,
    /// With `succeeded`: the call's output (any JSON value).
    output: Option<Json_>,
    /// With `failed`: why.
    error: Option<String>,
    /// Recorded with the resolution.
    reason: Option<String>,
}

/// The resolution `outcome` with `output`/`error` means; a field that does not go
/// with the outcome is a 400.
pub(crate) fn resolution(
    outcome: Outcome,
    output: Option<Json_>,
    error: Option<String>,
) -> Result<Resolution, Problem> {
    match (outcome, output, error) {
        (Outcome::Succeeded, Some(v), None) => Ok(Resolution::Succeeded(v)),
        (Outcome::Succeeded, None, _) => Err(Problem::bad_request(
            "output: `succeeded` needs the call's output",
        )),
        (Outcome::Failed, None, e) => {
            Ok(Resolution::Failed(e.unwrap_or_else(|| {
                "resolved as failed by an operator".into()
            })))
        }
        (Outcome::Retry, None, None) => Ok(Resolution::Retry),
        (_, Some(_), _) => Err(Problem::bad_request(
            "output: only `succeeded` takes an output",
        )),
        (_, None, Some(_)) => Err(Problem::bad_request("error: only `failed` takes an error")),
    }
}

/// The problem for a resolve the ledger refused: 404 for an unknown run or node, 409
/// when the call is not in doubt (or another resolve won the race) or the run ended.
pub(crate) fn resolve_refused(e: &flow_ledger::Error, run: &str, node: &str) -> Problem {
    use flow_ledger::Error as E;
    match e {
        E::NotFound { .. } => Problem::not_found(format!("run `{run}` has no tool call `{node}`")),
        E::InvalidTransition { from, .. } => Problem::conflict(format!(
            "call `{node}` of run `{run}` is {from}, not in doubt: nothing was written"
        )),
        E::LeaseLost => Problem::conflict(format!(
            "call `{node}` of run `{run}` was settled by someone else meanwhile"
        )),
        E::Terminal { status } => Problem::conflict(format!(
            "run `{run}` is {status}: nothing can re-send its calls, so `retry` is refused; settle call `{node}` as `succeeded` or `failed` (nothing was written)"
        )),
        e => Problem::ledger(e),
    }
}

/// Why a call cannot be resolved yet: the worker it was taken over from may still send
/// it until `until` (its lease end).
pub(crate) fn holder_may_send(run: &str, node: &str, until: flow_ledger::Timestamp) -> String {
    format!(
        "call `{node}` of run `{run}` was taken over from a worker whose lease ends at {}: until then that worker could still send it, so the downstream may not show it yet; check the downstream after that time, then resolve (nothing was written)",
        until.to_rfc3339()
    )
}

/// `POST /api/v1/runs/{id}/resolve`: settles one call in doubt (as `flow resume
/// --resolve`, without executing the run: a `resume` or a daemon continues it). 200
/// with the run after the change; of two concurrent resolves exactly one gets 200.
pub async fn resolve(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ResolveBody>,
) -> Result<Response, Problem> {
    let resolution = resolution(body.outcome, body.output, body.error)?;
    settle(&app, &caller, &id, &body.node, resolution, body.reason).await?;
    answer(&app, &id).await
}

/// Settles call `node` of run `run` as `caller` decided, recording the caller's name and
/// `reason` (the ledger re-queues a paused run whose last doubt this settles, in the
/// same transaction). The one way a single call is resolved over HTTP: the JSON handler
/// and the console's forms both call it.
pub(crate) async fn settle(
    app: &App,
    caller: &Caller,
    run: &str,
    node: &str,
    resolution: Resolution,
    reason: Option<String>,
) -> Result<(), Problem> {
    if let Ok(call) = app.ledger.get_call(run, node).await
        && let Some(until) = crate::view::call::holder_may_send_until(&call, app.now())
    {
        return Err(Problem::conflict(holder_may_send(run, node, until)));
    }
    let req = Resolve {
        run_id: run.to_string(),
        tool_call_id: node.to_string(),
        resolution,
        by: caller.name.clone(),
        note: reason,
    };
    app.ledger
        .resolve_call(req, app.now())
        .await
        .map(|call| {
            crate::telemetry::spans::resolved(&call, crate::telemetry::spans::Resolver::Api)
        })
        .map_err(|e| resolve_refused(&e, run, node))
}

/// The body of `POST /api/v1/runs/{id}/redrive`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveBody {
    /// Also run this node and everything downstream of it again (their succeeded calls
    /// are replayed, never re-sent).
    pub(crate) from: Option<String>,
    /// Recorded with the change.
    pub(crate) reason: Option<String>,
}

/// `POST /api/v1/runs/{id}/redrive`: a failed run goes back on the queue, its failed
/// nodes as new effect attempts (as `flow redrive`). 409 when the run is not failed or
/// has a call in doubt; 404 for an unknown run or `from` node.
pub async fn redrive(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<RedriveBody>,
) -> Result<Response, Problem> {
    redrive_run(&app, &caller, &id, body).await?;
    answer(&app, &id).await
}

/// Redrives run `id` as `caller`: the JSON handler and the console's button both call
/// it.
pub(crate) async fn redrive_run(
    app: &App,
    caller: &Caller,
    id: &str,
    body: RedriveBody,
) -> Result<flow_ledger::Redriven, Problem> {
    use crate::redrive::Error as R;
    let actor = actor(caller, body.reason);
    crate::redrive::redrive(&app.ledger, id, body.from.as_deref(), actor, app.now())
        .await
        .map_err(|e| match e {
            R::Ledger(flow_ledger::Error::InDoubt { since }) => Problem::conflict(format!(
                "cannot redrive run `{id}`: a call of it is in doubt since {since}; settle it first (nothing was written)"
            )),
            R::Ledger(flow_ledger::Error::Terminal { status }) => Problem::conflict(format!(
                "cannot redrive run `{id}`: it is {status}; only a failed run can be redriven"
            )),
            R::Ledger(e) => refused(&e, id, "redrive"),
            e @ R::UnknownNode { .. } => Problem::not_found(e.to_string()),
            e @ R::Child { .. } => Problem::conflict(e.to_string()),
            e @ R::Snapshot { .. } => Problem::ledger(&flow_ledger::Error::Corrupt {
                what: e.to_string(),
            }),
        })
}

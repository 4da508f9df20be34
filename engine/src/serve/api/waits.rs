//! Waits through the API: publishing an event (`POST /api/v1/events:publish`), the
//! callbacks a downstream makes to the URL a `callback:` node handed it
//! (`POST /api/v1/callbacks/{token}` and `…/heartbeat`), and the list of waits.
//!
//! A callback carries no bearer token: the token in its path is the credential, good
//! for one completion of one node's step. Every token that cannot be used — unknown,
//! used, expired, of a finished run — gets the same 404, so tokens cannot be probed.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use flow_ledger::{CallbackReply, WaitFilter, WaitStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json_;

use super::HoldQuery;
use crate::serve::App;
use crate::serve::auth::{Authed, Operator, Viewer};
use crate::serve::problem::{ApiJson, ApiQuery, Problem};
use crate::view::WaitView;

/// The body of `POST /api/v1/events:publish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBody {
    /// The event's name (`shipment.delivered`), 1 to 200 characters.
    pub(crate) name: String,
    /// Your id for the event: publishing the same id again changes nothing (the first
    /// publish's data is kept). Default: a new `ev_<ULID>`.
    pub(crate) event_id: Option<String>,
    /// The event's data: what a wait's `match` reads as `event`, and the waiting
    /// node's output.
    #[serde(default)]
    pub(crate) data: Json_,
}

/// What a publish came to.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PublishAnswer {
    /// The event's id.
    pub event_id: String,
    /// The id was published before: nothing was stored or signalled again.
    pub duplicate: bool,
    /// Runs with a pending wait of this name, signalled to look at it.
    pub signalled: u64,
}

/// `POST /api/v1/events:publish`: stores the event (idempotent on `event_id`) and
/// signals the waits of its name; a wait matches events from `lookback` before it
/// began, so an event published just before is not missed.
pub async fn publish(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<PublishBody>,
) -> Result<Response, Problem> {
    let published = app
        .ledger
        .publish_event(
            &body.name,
            body.event_id.as_deref(),
            &body.data,
            Some(&caller.name),
            app.now(),
        )
        .await
        .map_err(|e| Problem::ledger(&e))?;
    Ok(Json(PublishAnswer {
        event_id: published.event_id,
        duplicate: published.duplicate,
        signalled: published.signalled,
    })
    .into_response())
}

/// The body of `POST /api/v1/callbacks/{token}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackBody {
    /// `true`: the node succeeds with `output`; `false`: it fails with `error`.
    pub(crate) ok: bool,
    /// The node's output (any JSON).
    #[serde(default)]
    pub(crate) output: Option<Json_>,
    /// Why the work failed: required with `ok: false` (400 without it).
    pub(crate) error: Option<String>,
}

/// What a callback or heartbeat came to.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CallbackAnswer {
    /// The wait after it: `completed`, `failed`, or (a heartbeat) `pending`.
    pub status: WaitStatus,
    /// When it times out now (a heartbeat moves it).
    pub deadline: flow_ledger::Timestamp,
}

fn token_problem(e: &flow_ledger::Error) -> Problem {
    match e {
        flow_ledger::Error::NotFound { .. } => {
            Problem::not_found("no such callback (unknown, already used, or expired)")
        }
        other => Problem::ledger(other),
    }
}

/// `POST /api/v1/callbacks/{token}`: completes the node that handed out the token (no
/// bearer token: the token is the credential). 404 for any token that cannot be used.
pub async fn callback(
    State(app): State<Arc<App>>,
    Path(token): Path<String>,
    ApiJson(body): ApiJson<CallbackBody>,
) -> Result<Response, Problem> {
    // A failure without a reason would fail the node with none: refused before the
    // token is used, so the caller can send it again with `error`.
    if !body.ok && body.error.as_deref().is_none_or(|e| e.trim().is_empty()) {
        return Err(Problem::bad_request(
            "`ok: false` needs `error`: say why the work failed (the node fails with it); the callback was not used",
        ));
    }
    let reply = CallbackReply {
        ok: body.ok,
        output: body.output,
        error: body.error,
    };
    let hash = crate::gateway::token_hash(&token);
    let wait = app
        .ledger
        .callback(&hash, reply, app.now())
        .await
        .map_err(|e| token_problem(&e))?;
    Ok(Json(CallbackAnswer {
        status: wait.status,
        deadline: wait.deadline,
    })
    .into_response())
}

/// `POST /api/v1/callbacks/{token}/heartbeat`: the work is alive; the wait's deadline
/// moves one `heartbeat` interval ahead (never past its `timeout`).
pub async fn heartbeat(
    State(app): State<Arc<App>>,
    Path(token): Path<String>,
) -> Result<Response, Problem> {
    let hash = crate::gateway::token_hash(&token);
    let wait = app
        .ledger
        .callback_heartbeat(&hash, app.now())
        .await
        .map_err(|e| token_problem(&e))?;
    Ok(Json(CallbackAnswer {
        status: wait.status,
        deadline: wait.deadline,
    })
    .into_response())
}

/// Waits, earliest deadline first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitList {
    /// Each with what it waits for, its deadline and how it ended.
    pub items: Vec<WaitView>,
}

/// `GET /api/v1/waits`: nodes waiting for an event or a callback.
pub async fn list(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    ApiQuery(q): ApiQuery<HoldQuery>,
) -> Result<Response, Problem> {
    let filter = WaitFilter {
        run_id: q.run()?,
        status: (!q.all).then_some(WaitStatus::Pending),
        limit: q.limit(),
    };
    let items = app
        .ledger
        .list_waits(filter)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let items = items.iter().map(WaitView::of).collect();
    Ok(Json(WaitList { items }).into_response())
}

//! `GET /api/v1/schedules` and `POST /api/v1/schedules/{id}/pause|resume|trigger`: the
//! schedules of the server's `flow.toml`, as `flow schedules` (one implementation,
//! `schedule::manage`); a change is recorded with the token's name.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use flow_ledger::Actor;

use super::steer::{Why, actor};
use crate::schedule::manage;
use crate::schedule::view::ScheduleView;
use crate::serve::App;
use crate::serve::auth::{Authed, Operator, Viewer};
use crate::serve::problem::{OptionalJson, Problem};

/// The schedules.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ScheduleList {
    /// Each schedule of the server's `flow.toml`, in file order.
    pub schedules: Vec<ScheduleView>,
}

/// What a trigger started.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Triggered {
    /// The run started (`sched.<id>.manual.<ulid>`).
    pub run: String,
    /// The schedule after it.
    pub schedule: ScheduleView,
}

fn problem(e: manage::Error) -> Problem {
    match e {
        manage::Error::Unknown { .. } => Problem::not_found(e.to_string()),
        manage::Error::Invalid(m) => Problem::conflict(m),
        manage::Error::Ledger(e) => Problem::ledger(&e),
    }
}

/// `GET /api/v1/schedules`.
pub async fn list(_: Authed<Viewer>, State(app): State<Arc<App>>) -> Result<Response, Problem> {
    let schedules = app.schedules.views(&app.ledger).await.map_err(problem)?;
    Ok(Json(ScheduleList { schedules }).into_response())
}

/// Pauses or resumes schedule `id` as the caller; answers with the schedule.
pub(crate) async fn set_paused(
    app: &App,
    who: &Actor,
    id: &str,
    pause: bool,
) -> Result<ScheduleView, Problem> {
    app.schedules
        .set_paused(&app.ledger, id, pause, who)
        .await
        .map_err(problem)?;
    app.schedules.view(&app.ledger, id).await.map_err(problem)
}

/// `POST /api/v1/schedules/{id}/pause`.
pub async fn pause(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    let who = actor(&caller, why.reason);
    Ok(Json(set_paused(&app, &who, &id, true).await?).into_response())
}

/// `POST /api/v1/schedules/{id}/resume`.
pub async fn resume(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    let who = actor(&caller, why.reason);
    Ok(Json(set_paused(&app, &who, &id, false).await?).into_response())
}

/// Starts one run of schedule `id` as the caller.
pub(crate) async fn trigger_as(app: &App, who: &Actor, id: &str) -> Result<Triggered, Problem> {
    let run = app
        .schedules
        .trigger(&app.ledger, id, who)
        .await
        .map_err(problem)?;
    let schedule = app.schedules.view(&app.ledger, id).await.map_err(problem)?;
    Ok(Triggered { run, schedule })
}

/// `POST /api/v1/schedules/{id}/trigger`.
pub async fn trigger(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    OptionalJson(why): OptionalJson<Why>,
) -> Result<Response, Problem> {
    let who = actor(&caller, why.reason);
    Ok(Json(trigger_as(&app, &who, &id).await?).into_response())
}

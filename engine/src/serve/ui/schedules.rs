//! The Schedules page (`/ui/schedules`): each schedule of the server's `flow.toml` with
//! its next tick, last run and last skip, and — for operators — Pause, Resume and Run
//! now (`POST /ui/schedules/{id}/pause|resume|trigger`, CSRF-checked, recorded with the
//! user's name), the same changes as `/api/v1/schedules` and `flow schedules`.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use serde_json::json;

use super::forms::{CsrfForm, form, url};
use super::session::Signed;
use super::{Page, Ui, who};
use crate::role::Role;
use crate::serve::api::schedules::{set_paused, trigger_as};
use crate::serve::problem::Problem;

/// `GET /ui/schedules`.
pub async fn page(signed: Signed, State(ui): State<Arc<Ui>>) -> Result<Page, Page> {
    let schedules = ui
        .app
        .schedules
        .views(&ui.app.ledger)
        .await
        .map_err(|e| Page::from(Problem::conflict(e.to_string())))?;
    let ctx = json!({
        "title": "Schedules",
        "nav": "schedules",
        "who": who(&signed, &ui).await?,
        "schedules": schedules,
        "source": ui.app.schedules.source,
        "can_change": signed.caller.role >= Role::Operator,
    });
    Ok(Page::render(StatusCode::OK, "schedules.html", &ctx))
}

/// `POST /ui/schedules/{id}/{action}`: pause, resume or trigger, then the page again.
pub async fn act(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path((id, action)): Path<(String, String)>,
    f: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    let by = flow_ledger::Actor {
        by: signed.caller.name.clone(),
        reason: None,
    };
    match action.as_str() {
        "pause" => set_paused(&ui.app, &by, &id, true).await.map(|_| ())?,
        "resume" => set_paused(&ui.app, &by, &id, false).await.map(|_| ())?,
        "trigger" => {
            let t = trigger_as(&ui.app, &by, &id).await?;
            return Ok(Page::redirect(format!("/ui/runs/{}", url(&t.run))));
        }
        other => {
            return Err(Page::error(
                StatusCode::NOT_FOUND,
                format!("no schedule action `{other}`"),
            ));
        }
    }
    Ok(Page::redirect("/ui/schedules".to_string()))
}

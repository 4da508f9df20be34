//! The console's POSTs. Each checks, in this order, the session (or redirects to the
//! sign-in form), the form's CSRF token (403), the caller's role (403), then the form's
//! values (400, shown on the page) — and only then acts, through the API's functions.
//! A refused POST writes nothing.

use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use super::forms::{CsrfForm, form, how, reason, url};
use super::inbox::{InboxQuery, inbox};
use super::pages::sign_in_page;
use super::session::{Signed, local_next, set_cookie};
use super::{Page, Ui};
use crate::role::Role;
use crate::serve::api::in_doubt::settle_many;
use crate::serve::api::probe::probe_run;
use crate::serve::api::steer::{cancel_run, settle};
use crate::serve::auth::Tokens;
use crate::serve::problem::Problem;

/// The sign-in form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SignIn {
    csrf: String,
    token: String,
    /// The page to return to (checked by [`local_next`]; anything else: the runs).
    next: String,
}

/// `POST /ui/sign-in`: a valid token opens a session (cookie), anything else shows the
/// form again with why (401). Wrong tokens count toward the address's throttle like
/// the API's (`serve::throttle`): past it, 429 with `Retry-After`, whatever the token.
/// Signed in, the user goes to the page they asked for (`next`) when it is one of the
/// console's, else to the runs.
pub async fn sign_in(
    State(ui): State<Arc<Ui>>,
    extensions: axum::http::Extensions,
    f: Result<Form<SignIn>, FormRejection>,
) -> Result<Response, Page> {
    let f = form(f)?;
    let next = local_next(&f.next);
    if matches!(ui.app.tokens, Tokens::Insecure) {
        return Ok(Page::redirect(next.unwrap_or("/ui/runs")).into_response());
    }
    if !ui.sessions.csrf_ok("sign-in", "", &f.csrf) {
        return Err(Page::error(
            StatusCode::FORBIDDEN,
            "the sign-in form's CSRF token is not this server's: reload the page and try again",
        ));
    }
    let ip = crate::serve::auth::client_ip(&extensions);
    if let Err(left) = ui.app.throttle.check(ip) {
        let p = Problem::too_many(left);
        let page = sign_in_page(&ui, StatusCode::TOO_MANY_REQUESTS, Some(&p.detail), next);
        let mut resp = page.into_response();
        if let Some(secs) = p.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        return Ok(resp);
    }
    let token = f.token.trim();
    let caller = match ui.app.tokens.authenticate(Some(&format!("Bearer {token}"))) {
        Ok(c) => c,
        Err(_) => {
            ui.app.throttle.failed(ip);
            ui.app.metrics.auth_failed("console");
            tracing::warn!(client = ?ip, "failed console sign-in");
            let why = "that token is not one this server knows: paste the value of an [[api.tokens]] secret";
            return Ok(sign_in_page(&ui, StatusCode::UNAUTHORIZED, Some(why), next).into_response());
        }
    };
    tracing::info!(token = %caller.name, role = caller.role.as_str(), "console sign-in");
    let id = ui.sessions.open(caller);
    let to = next.unwrap_or("/ui/runs").to_string();
    Ok(Page::Redirect(to, Some(set_cookie(&id))).into_response())
}

/// A form that carries only its CSRF token.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Plain {
    csrf: String,
}

/// `POST /ui/sign-out`: ends the session and clears the cookie.
pub async fn sign_out(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    f: Result<Form<Plain>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    ui.sessions.close(&signed.session);
    Ok(Page::Redirect("/ui/sign-in".into(), Some(set_cookie(""))))
}

/// The resolve form of one call.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ResolveForm {
    csrf: String,
    run: String,
    node: String,
    /// `succeeded`, `failed` or `retry`.
    outcome: String,
    /// With `succeeded`: the output, JSON text.
    output: String,
    /// Recorded with the resolution; with `failed` also the node's error.
    reason: String,
    /// The required "I confirm" checkbox (`yes`).
    confirm: String,
}

/// `POST /ui/in-doubt/resolve`: settles one call (operators and admins), then shows its
/// run; a refused form shows the inbox again with why, nothing written.
pub async fn resolve(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    f: Result<Form<ResolveForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    let q = InboxQuery::default();
    let again = |status: StatusCode, error: String| {
        // An output that is not JSON is shown beside its field, the text kept.
        let field = error.starts_with("output:").then_some("output");
        let notice = json!({"error": error, "field": field, "run": f.run, "node": f.node, "output": f.output, "reason": f.reason});
        inbox(&ui, &signed, &q, status, notice)
    };
    if f.confirm != "yes" {
        let why = "tick \"I confirm\" to resolve the call: nothing was written".to_string();
        return again(StatusCode::BAD_REQUEST, why).await;
    }
    let resolution = match how(&f.outcome, &f.output, &f.reason) {
        Ok(r) => r,
        Err(why) => {
            return again(
                StatusCode::BAD_REQUEST,
                format!("{why}: nothing was written"),
            )
            .await;
        }
    };
    let settled = settle(
        &ui.app,
        &signed.caller,
        &f.run,
        &f.node,
        resolution,
        reason(&f.reason),
    )
    .await;
    match settled {
        Ok(()) => Ok(Page::redirect(format!(
            "/ui/runs/{}?resolved={}",
            url(&f.run),
            url(&f.node)
        ))),
        Err(Problem { status, detail, .. }) => again(status, detail).await,
    }
}

/// A run page's steering form (cancel, redrive): a reason and an "I confirm" (and, to
/// redrive, a node to run again from).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RunForm {
    csrf: String,
    reason: String,
    confirm: String,
    /// Redrive only: also run this node and what follows it again (empty: only the
    /// failed nodes).
    from: String,
}

/// `POST /ui/runs/{id}/cancel`: asks the run to stop (operators and admins), recorded
/// with the caller's name and reason, then shows the run again.
pub async fn cancel(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    f: Result<Form<RunForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    if f.confirm != "yes" {
        return Err(Page::error(
            StatusCode::BAD_REQUEST,
            "tick \"I confirm\" to cancel the run: nothing was written",
        ));
    }
    cancel_run(&ui.app, &signed.caller, &id, reason(&f.reason)).await?;
    Ok(Page::redirect(format!("/ui/runs/{}", url(&id))))
}

/// `POST /ui/runs/{id}/redrive`: puts the failed run back on the queue (operators and
/// admins), recorded with the user's name and reason, as `POST
/// /api/v1/runs/{id}/redrive`.
pub async fn redrive(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    f: Result<Form<RunForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    if f.confirm != "yes" {
        return Err(Page::error(
            StatusCode::BAD_REQUEST,
            "tick \"I confirm\" to redrive the run: nothing was written",
        ));
    }
    let from = f.from.trim();
    let body = crate::serve::api::steer::RedriveBody {
        from: (!from.is_empty()).then(|| from.to_string()),
        reason: reason(&f.reason),
    };
    crate::serve::api::steer::redrive_run(&ui.app, &signed.caller, &id, body).await?;
    Ok(Page::redirect(format!("/ui/runs/{}", url(&id))))
}

/// `POST /ui/runs/{id}/reconcile`: probes the paused run's calls in doubt now
/// (operators and admins; reconciliation), then shows the run with its probe history.
pub async fn probe(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    f: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    let outcomes = probe_run(&ui.app, &signed.caller, &id, None).await?;
    let settled = outcomes
        .iter()
        .filter(|o| {
            matches!(
                o.outcome,
                crate::reconcile::Reconciled::Probed { settled: true, .. }
            )
        })
        .count();
    Ok(Page::redirect(format!(
        "/ui/runs/{}?probed={settled}",
        url(&id)
    )))
}

/// The bulk resolve form (admins).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct BulkForm {
    csrf: String,
    run: String,
    node: String,
    tool: String,
    outcome: String,
    output: String,
    reason: String,
    confirm: String,
    /// `yes`: only count.
    dry_run: String,
}

/// `POST /ui/in-doubt/bulk`: with `dry_run`, lists the calls the filter matches;
/// otherwise (confirmed) settles them all as the JSON bulk resolve does.
pub async fn bulk(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    f: Result<Form<BulkForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Admin)?;
    let q = InboxQuery {
        run: f.run.clone(),
        node: f.node.clone(),
        tool: f.tool.clone(),
        ..InboxQuery::default()
    };
    let dry = f.dry_run == "yes";
    let keep = json!({"bulk_outcome": f.outcome, "bulk_output": f.output, "bulk_reason": f.reason});
    let with = |mut notice: Json| {
        if let (Some(n), Some(k)) = (notice.as_object_mut(), keep.as_object()) {
            n.extend(k.clone());
        }
        notice
    };
    if !dry && f.confirm != "yes" {
        let notice = with(
            json!({"error": "tick \"I confirm\" to resolve every matching call: nothing was written"}),
        );
        return inbox(&ui, &signed, &q, StatusCode::BAD_REQUEST, notice).await;
    }
    let how = match how(&f.outcome, &f.output, &f.reason) {
        Ok(h) => h,
        Err(why) => {
            let notice = with(json!({"error": format!("{why}: nothing was written")}));
            return inbox(&ui, &signed, &q, StatusCode::BAD_REQUEST, notice).await;
        }
    };
    match settle_many(
        &ui.app,
        &signed.caller,
        q.filter(),
        &how,
        reason(&f.reason),
        dry,
    )
    .await
    {
        Ok(done) if dry => {
            let info = format!(
                "dry run: {} call(s) match, {} would be settled, {} skipped (a retry of a finished run's call is refused); nothing was written",
                done.matched,
                done.settled,
                done.skipped.len()
            );
            inbox(
                &ui,
                &signed,
                &q,
                StatusCode::OK,
                with(json!({"info": info, "matched": done.matched, "bulk_calls": done.calls})),
            )
            .await
        }
        Ok(done) => {
            let info = format!(
                "{} of {} matching call(s) settled as {}; {} skipped (settled by someone else meanwhile, or a retry of a finished run's call)",
                done.settled,
                done.matched,
                f.outcome,
                done.skipped.len()
            );
            inbox(&ui, &signed, &q, StatusCode::OK, json!({"info": info})).await
        }
        Err(p) => inbox(&ui, &signed, &q, p.status, with(json!({"error": p.detail}))).await,
    }
}

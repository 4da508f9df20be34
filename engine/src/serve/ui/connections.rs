//! The Connections page (`/ui/connections`): each connection with who signed in and
//! when, its scopes, expiry and last error (never a token), and for admins *Connect*:
//! `POST /ui/connections/{name}/connect` (CSRF-checked) begins the sign-in as the API
//! does and answers a page whose link opens the authorization server (a link, not a
//! redirect: the console's CSP lets forms lead only to itself). The browser comes back
//! to `GET /ui/connections/callback`, which needs no session — the sign-in's `state`
//! is the capability, single-use and sealed in the ledger — so it may land on any
//! server sharing the ledger.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::session::Signed;
use super::{Page, Ui, who};
use crate::connections::remote;
use crate::serve::api::connections::{begin, grant_problem, list_views};
use crate::serve::auth::Role;

/// `GET /ui/connections`.
pub async fn page(signed: Signed, State(ui): State<Arc<Ui>>) -> Result<Page, Page> {
    let connections = list_views(&ui.app).await?;
    let ctx = json!({
        "title": "Connections",
        "nav": "connections",
        "who": who(&signed, &ui).await?,
        "connections": connections,
        "can_connect": signed.caller.role >= Role::Admin,
        "has_public_url": ui.app.gateway.public_url().is_some(),
    });
    Ok(Page::render(StatusCode::OK, "connections.html", &ctx))
}

/// The body of the Connect form.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ConnectForm {
    csrf: String,
}

/// `POST /ui/connections/{name}/connect`: begins the sign-in; a page with the link.
pub async fn connect(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    f: Result<Form<ConnectForm>, FormRejection>,
) -> Result<Page, Page> {
    let f = f
        .map(|Form(v)| v)
        .map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Admin)?;
    let started = begin(&ui.app, &name, &signed.caller.name).await?;
    let ctx = json!({
        "title": "Sign in",
        "nav": "connections",
        "who": who(&signed, &ui).await?,
        "name": name,
        "started": {
            "authorize_url": started.authorize_url,
            "redirect_uri": started.redirect_uri,
            "expires_at": started.expires_at,
        },
    });
    Ok(Page::render(
        StatusCode::OK,
        "connection_sign_in.html",
        &ctx,
    ))
}

/// `GET /ui/connections/callback?code&state…`: finishes the sign-in the `state` names,
/// whoever's browser brings it (no session needed).
pub async fn callback(
    State(ui): State<Arc<Ui>>,
    Query(params): Query<Vec<(String, String)>>,
) -> Page {
    let app = &ui.app;
    let oauth = match flow_adapters::mcp::OAuth::new(app.gateway.egress().1.cloned()) {
        Ok(o) => o,
        Err(e) => return Page::error(StatusCode::CONFLICT, e.message),
    };
    match remote::complete(&app.ledger, (app.gateway.secrets(), &oauth), &params).await {
        Ok(done) => {
            let ctx = json!({
                "title": "Connected",
                "name": done.name,
                "scopes": done.scopes,
                "expires_in": done.expires_in,
                "has_refresh": done.has_refresh,
            });
            Page::render(StatusCode::OK, "connection_done.html", &ctx)
        }
        Err(e) => Page::from(grant_problem(e)),
    }
}

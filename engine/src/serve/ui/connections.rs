//! The Connections page (`/ui/connections`): each connection with who signed in and
//! when, its scopes, expiry and last error (never a token), and for admins *Connect*:
//! `POST /ui/connections/{name}/connect` (CSRF-checked) begins the sign-in as the API
//! does and answers a page whose link opens the authorization server (a link, not a
//! redirect: the console's CSP lets forms lead only to itself), with a cookie that
//! binds the sign-in to this browser. The browser comes back to
//! `GET /ui/connections/callback`, which needs no session — the sign-in's `state` and
//! that cookie are the capability, single-use and sealed in the ledger — so it may land
//! on any server sharing the ledger. Refused callbacks count toward the client
//! address's throttle, like wrong tokens.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::forms::{CsrfForm, form};
use super::session::{Signed, cookie};
use super::{Page, Ui, who};
use crate::connections::grant;
use crate::connections::remote::{self, CALLBACK_PATH, PENDING_FOR};
use crate::role::Role;
use crate::serve::api::connections::{begin, grant_problem, list_views};
use crate::serve::problem::Problem;

/// `GET /ui/connections`.
pub async fn page(signed: Signed, State(ui): State<Arc<Ui>>) -> Result<Page, Page> {
    let connections = list_views(&ui.app).await?;
    // Cross-app connections sign in with a person's ID token in `flow connect`, not here.
    let browserless: Vec<&str> = ui
        .app
        .connections
        .iter()
        .filter(|c| c.cross_app.is_some())
        .map(|c| c.name.as_str())
        .collect();
    let ctx = json!({
        "title": "Connections",
        "nav": "connections",
        "who": who(&signed, &ui).await?,
        "connections": connections,
        "browserless": browserless,
        "can_connect": signed.caller.role >= Role::Admin,
        "has_public_url": ui.app.gateway.public_url().is_some(),
    });
    Ok(Page::render(StatusCode::OK, "connections.html", &ctx))
}

/// `POST /ui/connections/{name}/connect`: begins the sign-in; a page with the link and
/// the cookie that binds the sign-in to this browser.
pub async fn connect(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    f: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Response, Page> {
    let f = form(f)?;
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Admin)?;
    let nonce = remote::new_browser_nonce();
    let started = begin(&ui.app, &name, &signed.caller.name, Some(&nonce)).await?;
    let secure = ui
        .app
        .gateway
        .public_url()
        .is_some_and(|u| u.starts_with("https://"));
    let set = format!(
        "{}={nonce}; HttpOnly; SameSite=Lax; Path={CALLBACK_PATH}; Max-Age={}{}",
        remote::cookie_name(&name),
        PENDING_FOR.as_secs(),
        if secure { "; Secure" } else { "" }
    );
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
    let mut resp = Page::render(StatusCode::OK, "connection_sign_in.html", &ctx).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&set) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// `GET /ui/connections/callback?code&state…`: finishes the sign-in the `state` names,
/// in the browser that began it (no session needed).
pub async fn callback(
    State(ui): State<Arc<Ui>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let app = &ui.app;
    let ip = crate::serve::auth::client_ip(&extensions);
    if let Err(left) = app.throttle.check(ip) {
        return Problem::too_many(left).into_response();
    }
    let oauth = match flow_adapters::mcp::OAuth::new(app.gateway.egress().1.cloned()) {
        Ok(o) => o,
        Err(e) => return Page::error(StatusCode::CONFLICT, e.message).into_response(),
    };
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join("; ");
    let read = |name: &str| cookie(&cookies, name).map(str::to_owned);
    let declared = app.connections.as_slice();
    let secrets = app.gateway.secrets();
    match remote::complete(&app.ledger, secrets, &oauth, declared, &params, read).await {
        Ok(done) => {
            let ctx = json!({
                "title": "Connected",
                "name": done.name,
                "scopes": done.scopes,
                "expires_in": done.expires_in,
                "has_refresh": done.has_refresh,
            });
            let mut resp =
                Page::render(StatusCode::OK, "connection_done.html", &ctx).into_response();
            let clear = format!(
                "{}=; Path={CALLBACK_PATH}; Max-Age=0",
                remote::cookie_name(&done.name)
            );
            if let Ok(v) = header::HeaderValue::from_str(&clear) {
                resp.headers_mut().insert(header::SET_COOKIE, v);
            }
            resp
        }
        Err(e) => {
            if matches!(e, grant::Error::Refused(_)) {
                app.throttle.failed(ip);
            }
            Page::from(grant_problem(e)).into_response()
        }
    }
}

//! `GET /api/v1/connections` (viewers) and `POST /api/v1/connections/{name}/connect`
//! (admins): the connections of the server's ledger and `flow.toml`, and a sign-in begun
//! from here — the answer's `authorize_url` is opened in a browser, which comes back to
//! `[api] public_url` + `/ui/connections/callback` on any server sharing the ledger
//! (`connections::remote`). No token is ever in an answer.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use crate::connections::grant::{self, SignInWith};
use crate::connections::remote;
use crate::connections::view::{ConnectionView, views};
use crate::serve::App;
use crate::serve::auth::{Admin, Authed, Viewer};
use crate::serve::problem::Problem;

/// The connections.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ConnectionList {
    /// Stored ones and those `flow.toml` declares but nobody signed in to, by name.
    pub connections: Vec<ConnectionView>,
}

/// A sign-in begun.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SignInStarted {
    /// Open this in a browser: the authorization server's sign-in page.
    pub authorize_url: String,
    /// Where the browser comes back when the person has signed in.
    pub redirect_uri: String,
    /// After this (RFC 3339) the sign-in is refused; begin again.
    pub expires_at: String,
}

/// The connections as the API shows them.
pub(crate) async fn list_views(app: &App) -> Result<Vec<ConnectionView>, Problem> {
    let stored = app
        .ledger
        .list_connections()
        .await
        .map_err(|e| Problem::ledger(&e))?;
    Ok(views(&stored, &app.connections))
}

/// `GET /api/v1/connections`.
pub async fn list(_: Authed<Viewer>, State(app): State<Arc<App>>) -> Result<Response, Problem> {
    let connections = list_views(&app).await?;
    Ok(Json(ConnectionList { connections }).into_response())
}

/// A failed sign-in as a problem: setup (no key, no `public_url`) 409, the servers 502,
/// a refusal 400, the ledger 503.
pub(crate) fn grant_problem(e: grant::Error) -> Problem {
    match e {
        grant::Error::Setup(m) => Problem::conflict(m),
        grant::Error::Server(m) => Problem::new(axum::http::StatusCode::BAD_GATEWAY, m),
        grant::Error::Refused(m) => Problem::bad_request(m),
        grant::Error::Ledger(m) => Problem::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, m),
    }
}

/// Begins a sign-in to connection `name` for `by`; with `browser` (the console's
/// cookie value) only that browser can finish it.
pub(crate) async fn begin(
    app: &App,
    name: &str,
    by: &str,
    browser: Option<&str>,
) -> Result<SignInStarted, Problem> {
    let Some(config) = app.connections.iter().find(|c| c.name == name) else {
        return Err(Problem::not_found(format!(
            "no connection `{name}` is declared in the server's flow.toml"
        )));
    };
    if config.cross_app.is_some() {
        return Err(Problem::conflict(format!(
            "connection `{name}` signs in by cross-app access (the person's ID token, no browser): run `flow connect {name}` with the ID token as its secret"
        )));
    }
    let Some(public_url) = app.gateway.public_url() else {
        return Err(Problem::conflict(
            "signing in from the console or the API needs `public_url` under `[api]` in flow.toml (the address browsers reach this server at; the sign-in comes back to it); or run `flow connect` where a browser is",
        ));
    };
    let oauth = flow_adapters::mcp::OAuth::new(app.gateway.egress().1.cloned())
        .map_err(|e| Problem::conflict(e.message))?;
    let secrets = app.gateway.secrets();
    let started = remote::start(
        &app.ledger,
        SignInWith {
            config,
            secrets,
            oauth: &oauth,
        },
        public_url,
        by,
        browser,
    )
    .await
    .map_err(grant_problem)?;
    Ok(SignInStarted {
        authorize_url: started.authorize_url,
        redirect_uri: started.redirect_uri,
        expires_at: started.expires_at.to_rfc3339(),
    })
}

/// `POST /api/v1/connections/{name}/connect`.
pub async fn connect(
    Authed(caller, _): Authed<Admin>,
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<Response, Problem> {
    Ok(Json(begin(&app, &name, &caller.name, None).await?).into_response())
}

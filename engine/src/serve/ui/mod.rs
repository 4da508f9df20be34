//! The operator console: a server-rendered web UI under `/ui` (`/` redirects to it).
//!
//! - `session.rs`: sign-in with a bearer token (returning to the page asked for), the
//!   session cookie, CSRF tokens.
//! - `pages.rs`: the pages (runs, one run, sign-in); `inbox.rs` the In doubt worklist and
//!   its "resolve selected"; `approvals.rs` the Approvals inbox and its decide form;
//!   `history.rs` a run's timeline, `graph.rs` its DAG as SVG, `ago.rs` and `times.rs`
//!   relative times; `connections.rs` the Connections page, *Connect* and the sign-in's
//!   callback.
//! - `actions.rs`: the other forms' POSTs (resolve one call, bulk resolve, cancel and
//!   redrive a run, probe now, sign in and out).
//! - `live.rs`: the signed-in event stream (`/ui/events`) and `assets/live.js`, which
//!   updates a page's live regions in place.
//! - `templates/`: minijinja templates, HTML-escaped throughout (run inputs, outputs and
//!   requests are untrusted text; the one value written raw is the SVG `graph.rs`
//!   escapes itself), `macros.html` the shared pieces (times, the Refresh link);
//!   `assets/console.css` the one stylesheet.
//!
//! Pages read with the same ledger reads the JSON API uses, and the forms act through the
//! API's own functions (`api::steer::settle`, `api::in_doubt::settle_many`,
//! `crate::approval::decide`), so a resolution or a decision made here is recorded
//! exactly as one made over JSON: `by` is the token's name, the reason the one given.
//! Every page works without JavaScript (a "Refresh" link, confirmations are required
//! checkboxes); the one script, our own and served from here (CSP `script-src 'self'`),
//! only keeps pages current and shows times in the viewer's time zone.

mod actions;
mod ago;
mod approvals;
mod connections;
mod forms;
mod graph;
mod history;
mod inbox;
mod live;
mod pages;
mod schedules;
pub mod session;
mod times;

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::Environment;
use serde_json::Value as Json;

use super::App;
use super::problem::Problem;

/// The console's state: the API's, plus the sessions.
#[derive(Debug)]
pub struct Ui {
    /// What the API handlers share (ledger, tokens).
    pub app: Arc<App>,
    /// Who is signed in.
    pub sessions: session::Sessions,
}

/// The console's routes.
pub fn routes(app: Arc<App>) -> Router {
    let ui = Arc::new(Ui {
        app,
        sessions: session::Sessions::default(),
    });
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(|| async { Redirect::to("/ui/runs") }))
        .route("/ui/console.css", get(css))
        .route("/ui/assets/console.css", get(css))
        .route("/ui/assets/live.js", get(live::script))
        .route("/ui/events", get(live::events))
        .route("/ui/sign-in", get(pages::sign_in).post(actions::sign_in))
        .route("/ui/sign-out", post(actions::sign_out))
        .route("/ui/runs", get(pages::runs))
        .route("/ui/runs/{id}", get(pages::run))
        .route("/ui/runs/{id}/items", get(pages::items))
        .route("/ui/runs/{id}/cancel", post(actions::cancel))
        .route("/ui/runs/{id}/redrive", post(actions::redrive))
        .route("/ui/runs/{id}/reconcile", post(actions::probe))
        .route("/ui/approvals", get(approvals::page))
        .route("/ui/approvals/decide", post(approvals::decide))
        .route("/ui/connections", get(connections::page))
        .route(
            crate::connections::remote::CALLBACK_PATH,
            get(connections::callback),
        )
        .route("/ui/connections/{name}/connect", post(connections::connect))
        .route("/ui/schedules", get(schedules::page))
        .route("/ui/schedules/{id}/{action}", post(schedules::act))
        .route("/ui/in-doubt", get(inbox::in_doubt))
        .route("/ui/in-doubt/selected", post(inbox::resolve_selected))
        .route("/ui/in-doubt/resolve", post(actions::resolve))
        .route("/ui/in-doubt/bulk", post(actions::bulk))
        .with_state(ui)
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("assets/console.css"),
    )
}

/// The templates, parsed once. Names end in `.html`, so minijinja escapes every value
/// for HTML unless a template says otherwise (only the run page's SVG graph, which
/// `graph.rs` escapes itself).
static TEMPLATES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.add_filter("url", |s: String| forms::url(&s));
    env.add_filter("ago", |s: String| ago::ago(&s));
    // JSON indented for a `<pre>` (escaped by the template like any text).
    env.add_filter("pretty", |v: minijinja::Value| {
        serde_json::to_value(&v)
            .map(|j| pages::pretty(&j))
            .unwrap_or_default()
    });
    env.add_filter("lasting", |t: String| {
        times::parse(&t).map_or(t, |t| times::lasting(t, times::now()))
    });
    env.add_filter("utc", |t: String| times::parse(&t).map_or(t, times::utc));
    let sources = [
        ("macros.html", include_str!("templates/macros.html")),
        ("layout.html", include_str!("templates/layout.html")),
        ("error.html", include_str!("templates/error.html")),
        ("sign_in.html", include_str!("templates/sign_in.html")),
        ("runs.html", include_str!("templates/runs.html")),
        ("run.html", include_str!("templates/run.html")),
        ("items.html", include_str!("templates/items.html")),
        ("in_doubt.html", include_str!("templates/in_doubt.html")),
        ("approvals.html", include_str!("templates/approvals.html")),
        ("schedules.html", include_str!("templates/schedules.html")),
        (
            "connections.html",
            include_str!("templates/connections.html"),
        ),
        (
            "connection_sign_in.html",
            include_str!("templates/connection_sign_in.html"),
        ),
        (
            "connection_done.html",
            include_str!("templates/connection_done.html"),
        ),
    ];
    for (name, text) in sources {
        if let Err(e) = env.add_template(name, text) {
            tracing::error!(template = name, error = %e, "a console template does not parse");
        }
    }
    env
});

/// The console's Content-Security-Policy: its own stylesheet and its own script file
/// only (no inline script or style, no eval), connections (the event stream, the live
/// re-fetch) and forms to itself, never framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What a console handler answers: an HTML page with its status, or a redirect.
#[derive(Debug)]
pub enum Page {
    /// A rendered page.
    Html(StatusCode, String),
    /// 303 See Other to this path (after a form, or to the sign-in page).
    Redirect(String, Option<String>),
}

impl Page {
    /// Template `name` rendered with `ctx` (a JSON object), answered with `status`.
    pub fn render(status: StatusCode, name: &str, ctx: &Json) -> Page {
        let rendered = TEMPLATES
            .get_template(name)
            .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(ctx))));
        match rendered {
            Ok(html) => Page::Html(status, html),
            Err(e) => {
                tracing::error!(template = name, error = %e, "cannot render a console page");
                Page::Html(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "<!doctype html><title>flow</title><p>this page could not be rendered; the server log says why</p>".into(),
                )
            }
        }
    }

    /// An error page saying `message`.
    pub fn error(status: StatusCode, message: impl Into<String>) -> Page {
        let ctx = serde_json::json!({
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "message": message.into(),
        });
        Page::render(status, "error.html", &ctx)
    }

    /// 303 to `path`.
    pub fn redirect(path: impl Into<String>) -> Page {
        Page::Redirect(path.into(), None)
    }
}

impl From<Problem> for Page {
    fn from(p: Problem) -> Self {
        Page::error(p.status, p.detail)
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        match self {
            Page::Html(status, html) => (
                status,
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-store"),
                    // Only our own script runs, nothing loads from elsewhere, forms
                    // post only here, and no other site may frame the page to trick a
                    // click.
                    (header::CONTENT_SECURITY_POLICY, CSP),
                    (header::X_FRAME_OPTIONS, "DENY"),
                    (header::REFERRER_POLICY, "no-referrer"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                html,
            )
                .into_response(),
            Page::Redirect(to, cookie) => {
                let mut resp = Redirect::to(&to).into_response();
                if let Some(c) = cookie
                    && let Ok(v) = header::HeaderValue::from_str(&c)
                {
                    resp.headers_mut().insert(header::SET_COOKIE, v);
                }
                resp
            }
        }
    }
}

/// What every page's layout shows of the caller: name, role, what they may do, the
/// CSRF token of the sign-out form — and the number of calls in doubt and of pending
/// approvals, for the badges on the *In doubt* and *Approvals* links, so a call waiting
/// for a human is seen from any page. Each count is one indexed statement per page
/// (`tool_calls` by status, `approvals` by status), and each sits in a live region, so
/// the page's own live updates keep it current.
async fn who(s: &session::Signed, ui: &Ui) -> Result<Json, Page> {
    use crate::role::Role;
    let ledger = &ui.app.ledger;
    let failed = |e: flow_ledger::Error| Page::from(Problem::ledger(&e));
    let in_doubt = ledger.count_calls_in_doubt().await.map_err(failed)?;
    let approvals = ledger
        .count_pending_approvals(ui.app.now())
        .await
        .map_err(failed)?;
    Ok(serde_json::json!({
        "approvals": approvals,
        "name": s.caller.name,
        "role": s.caller.role.as_str(),
        "can_resolve": s.caller.role >= Role::Operator,
        "can_bulk": s.caller.role >= Role::Admin,
        "signed_in": !matches!(ui.app.tokens, crate::serve::auth::Tokens::Insecure),
        "csrf": s.csrf,
        "in_doubt": in_doubt,
    }))
}

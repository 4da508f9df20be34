//! `flow serve` (and `flow daemon --serve`): the operator API over HTTP.
//!
//! One axum router: `/healthz` and `/metrics` (the daemon's, `daemon::metrics::router`),
//! and the JSON API under `/api/v1` (`api/`). Every route's handler names the role it
//! needs as an extractor (`auth::Authed<Operator>`), so the rule sits next to the
//! handler; every error is `application/problem+json` (`problem.rs`). The limits that
//! keep slow or huge requests from exhausting the server are layers here: a body limit
//! (413), a request timeout (408) and a concurrency limit (requests beyond it wait).
//! In front of every route `guard.rs` refuses control characters in the path and query
//! (400) and, without authentication, a non-loopback `Host` (421) or a foreign
//! `Origin` on a change (403); `throttle.rs` limits failed authentications per client
//! address (429).
//!
//! The operator console (`ui/`, server-rendered HTML under `/ui`, `/` redirecting to it)
//! is another router merged in [`router`]; it calls the API handlers' functions with
//! the same `App`, and signs browsers in with session cookies instead of bearer headers.

pub mod api;
pub mod auth;
pub mod guard;
pub mod openapi;
pub mod problem;
pub mod throttle;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use flow_ledger::Ledger;
use tokio_util::sync::CancellationToken;

use crate::daemon::metrics::Metrics;

/// Largest request body (a `runs:batch` of 1,000 runs with their workflow text).
pub const BODY_LIMIT: usize = 16 * 1024 * 1024;
/// Longest a request may take before it is answered 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most requests handled at once; more wait for a free slot.
pub const CONCURRENCY: usize = 64;

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    /// The ledger (any number of servers may share one database).
    pub ledger: Ledger,
    /// How callers authenticate.
    pub tokens: auth::Tokens,
    /// The metrics `/metrics` reports (a daemon passes its own).
    pub metrics: Arc<Metrics>,
    /// Tools, secrets and egress for "probe now" (reconciliation): a probe is a request
    /// like any other, under this process's egress policy and secrets.
    pub gateway: crate::gateway::Gateway,
    /// `[api] metrics_token`: the one token `/metrics` then needs (`None`: open, as a
    /// scraper on a private network expects).
    pub metrics_token: Option<String>,
    /// Failed authentications per client address (429 past the limit).
    pub throttle: throttle::Throttle,
    /// The schedules of the `flow.toml` this server read.
    pub schedules: Arc<crate::schedule::manage::Schedules>,
    /// The `[[connections]]` of that `flow.toml` (the console's and the API's *Connect*).
    pub connections: Vec<crate::connections::ConnectionConfig>,
    /// `/mcp`: flow as an MCP server (`crate::mcp`), when `[mcp]` names workflows.
    pub mcp: Option<crate::mcp::server::Http>,
}

impl App {
    /// The time every handler writes with: the gateway's clock, the one the executor
    /// and the daemon's services read too.
    pub fn now(&self) -> flow_ledger::Timestamp {
        self.gateway.now()
    }
}

/// The whole server's routes with their limits.
pub fn router(app: Arc<App>) -> Router {
    let metrics =
        crate::daemon::metrics::router(app.metrics.clone(), app.ledger.clone()).route_layer(
            axum::middleware::from_fn_with_state(app.clone(), guard::metrics),
        );
    api::routes()
        .route("/mcp", axum::routing::any(mcp))
        .with_state(app.clone())
        .merge(ui::routes(app.clone()))
        .merge(metrics)
        .fallback(|| async {
            problem::Problem::not_found("no such route; the API is under /api/v1").into_response()
        })
        .layer(axum::middleware::from_fn_with_state(app, guard::guard))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .layer(tower::limit::ConcurrencyLimitLayer::new(CONCURRENCY))
}

/// `/mcp`: the MCP server behind the API's bearer tokens. A call starts runs, so the
/// caller needs the operator role; its token's name is the principal calls are keyed
/// and coalesced by, and that never decides the approvals of the runs it started.
async fn mcp(
    auth::Authed(caller, _): auth::Authed<auth::Operator>,
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    mut request: axum::extract::Request,
) -> axum::response::Response {
    let Some(service) = &app.mcp else {
        return problem::Problem::not_found(
            "this server offers no MCP tools: list workflows under `[mcp] workflows` in its flow.toml",
        )
        .into_response();
    };
    request
        .extensions_mut()
        .insert(crate::mcp::server::Principal(caller.name));
    service.handle(request).await
}

/// Binds `addr` and serves [`router`] until `stop` fires (on a spawned task). Returns
/// the bound address (port 0 picks a free one) and the task.
pub async fn serve(
    addr: SocketAddr,
    app: Arc<App>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // Without TCP_NODELAY a response written in two parts (headers, then a body or an
    // event stream) waits on the client's delayed ACK: 40 ms a request on Linux.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let router = router(app);
    let task = tokio::spawn(async move {
        // The peer address is what failed authentications are throttled by.
        let served = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the API server stopped");
        }
    });
    Ok((bound, task))
}

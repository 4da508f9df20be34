//! The JSON API under `/api/v1`: the routes, and what the handlers share.
//!
//! - `runs.rs`: list, show, submit, batch submit.
//! - `steer.rs`: cancel, resume (re-queue), resolve one call in doubt.
//! - `probe.rs`: probe a paused run's in-doubt calls now (reconciliation).
//! - `in_doubt.rs`: every call in doubt across runs, bulk resolve, the event feed.
//! - `stream.rs`: the event feed as Server-Sent Events.

pub(crate) mod in_doubt;
pub(crate) mod probe;
pub(crate) mod runs;
pub(crate) mod steer;
pub(crate) mod stream;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use super::App;

/// Every `/api/v1` route.
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/v1/runs", get(runs::list).post(runs::submit))
        .route("/api/v1/runs:batch", post(runs::batch))
        .route("/api/v1/runs/{id}", get(runs::show))
        .route("/api/v1/runs/{id}/cancel", post(steer::cancel))
        .route("/api/v1/runs/{id}/resume", post(steer::resume))
        .route("/api/v1/runs/{id}/resolve", post(steer::resolve))
        .route("/api/v1/runs/{id}/reconcile", post(probe::reconcile))
        .route("/api/v1/in-doubt", get(in_doubt::list))
        .route("/api/v1/in-doubt:resolve", post(in_doubt::resolve_many))
        .route("/api/v1/events", get(in_doubt::events))
        .route("/api/v1/events:stream", get(stream::stream))
        .route("/api/v1/openapi.json", get(openapi))
}

/// `GET /api/v1/openapi.json` (no token needed: it describes, it reveals nothing).
async fn openapi() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        crate::serve::openapi::text(),
    )
}

/// The time every handler writes with.
pub(crate) fn now() -> flow_ledger::Timestamp {
    flow_ledger::Clock::now(&flow_ledger::SystemClock)
}

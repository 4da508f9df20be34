//! The JSON API under `/api/v1`: [`OPERATIONS`], the one list of its operations (the
//! router here and the OpenAPI document in `serve::openapi` are both built from it),
//! and what the handlers share.
//!
//! - `runs.rs`: list, show, submit, batch submit.
//! - `steer.rs`: cancel, resume (re-queue), resolve one call in doubt.
//! - `probe.rs`: probe a paused run's in-doubt calls now (reconciliation).
//! - `in_doubt.rs`: every call in doubt across runs, bulk resolve, the event feed.
//! - `stream.rs`: the event feed as Server-Sent Events.
//! - `approvals.rs`: the approvals inbox and a person's decision.

pub(crate) mod approvals;
pub(crate) mod in_doubt;
pub(crate) mod probe;
pub(crate) mod runs;
pub(crate) mod steer;
pub(crate) mod stream;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodRouter, get, post};

use super::App;
use super::auth::Role;
use super::openapi::{Answer, Method, Operation, json, schema};
use crate::view::{EventView, RunView};

/// The errors every authenticated operation may answer.
const AUTHED: &[u16] = &[400, 401, 403, 429, 503];
/// … and one about a run that may be unknown or in the wrong state.
const ON_A_RUN: &[u16] = &[400, 401, 403, 404, 409, 429, 503];

/// Every operation the API serves.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        id: "listRuns",
        method: Method::Get,
        path: "/api/v1/runs",
        role: Some(Role::Viewer),
        summary: "Runs, newest first, keyset-paged",
        handler: || get(runs::list),
        query: Some(schema::<runs::ListQuery>),
        body: None,
        body_required: false,
        answers: &[json(200, "A page of runs", schema::<runs::RunList>)],
        problems: AUTHED,
    },
    Operation {
        id: "submitRun",
        method: Method::Post,
        path: "/api/v1/runs",
        role: Some(Role::Operator),
        summary: "Queue a run (idempotent with run_id)",
        handler: || post(runs::submit),
        query: None,
        body: Some(schema::<runs::SubmitRun>),
        body_required: true,
        answers: &[
            json(201, "Queued", schema::<runs::Submitted>),
            json(
                200,
                "A run with this run_id, workflow and inputs exists",
                schema::<runs::Submitted>,
            ),
        ],
        problems: &[400, 401, 403, 409, 413, 422, 429, 503],
    },
    Operation {
        id: "submitRuns",
        method: Method::Post,
        path: "/api/v1/runs:batch",
        role: Some(Role::Operator),
        summary: "Queue up to 1,000 runs in one commit",
        handler: || post(runs::batch),
        query: None,
        body: Some(schema::<runs::Batch>),
        body_required: true,
        answers: &[json(
            200,
            "Every run, in request order",
            schema::<runs::BatchSubmitted>,
        )],
        problems: &[400, 401, 403, 409, 413, 422, 429, 503],
    },
    Operation {
        id: "getRun",
        method: Method::Get,
        path: "/api/v1/runs/{id}",
        role: Some(Role::Viewer),
        summary: "One run: the `flow show --json` object",
        handler: || get(runs::show),
        query: None,
        body: None,
        body_required: false,
        answers: &[json(200, "The run", schema::<RunView>)],
        problems: &[400, 401, 403, 404, 429, 503],
    },
    Operation {
        id: "cancelRun",
        method: Method::Post,
        path: "/api/v1/runs/{id}/cancel",
        role: Some(Role::Operator),
        summary: "Cancel a run",
        handler: || post(steer::cancel),
        query: None,
        body: Some(schema::<steer::Why>),
        body_required: false,
        answers: &[json(200, "The run after the change", schema::<RunView>)],
        problems: ON_A_RUN,
    },
    Operation {
        id: "resumeRun",
        method: Method::Post,
        path: "/api/v1/runs/{id}/resume",
        role: Some(Role::Operator),
        summary: "Put a run back on the queue for the daemons",
        handler: || post(steer::resume),
        query: None,
        body: Some(schema::<steer::Why>),
        body_required: false,
        answers: &[json(200, "The run after the change", schema::<RunView>)],
        problems: ON_A_RUN,
    },
    Operation {
        id: "redriveRun",
        method: Method::Post,
        path: "/api/v1/runs/{id}/redrive",
        role: Some(Role::Operator),
        summary: "Put a failed run back on the queue: its failed nodes run again as new attempts (new keys), succeeded ones are replayed; 409 when the run is not failed or has a call in doubt",
        handler: || post(steer::redrive),
        query: None,
        body: Some(schema::<steer::RedriveBody>),
        body_required: false,
        answers: &[json(200, "The run after the change", schema::<RunView>)],
        problems: ON_A_RUN,
    },
    Operation {
        id: "listApprovals",
        method: Method::Get,
        path: "/api/v1/approvals",
        role: Some(Role::Viewer),
        summary: "Approvals waiting for a decision (or every one with all=true): the request as it will be sent, its digest, who approved so far",
        handler: || get(approvals::list),
        query: Some(schema::<approvals::ApprovalQuery>),
        body: None,
        body_required: false,
        answers: &[json(
            200,
            "Oldest request first",
            schema::<approvals::ApprovalList>,
        )],
        problems: AUTHED,
    },
    Operation {
        id: "decideApproval",
        method: Method::Post,
        path: "/api/v1/runs/{id}/approvals/{node}",
        role: Some(Role::Operator),
        summary: "Approve (a vote) or deny a node's call; 403 not an approver or forbid_self, 409 already decided (naming the winner), run finished or request changed since `digest`",
        handler: || post(approvals::decide),
        query: None,
        body: Some(schema::<approvals::DecideBody>),
        body_required: true,
        answers: &[json(
            200,
            "What became of the decision",
            schema::<approvals::DecisionAnswer>,
        )],
        problems: ON_A_RUN,
    },
    Operation {
        id: "resolveCall",
        method: Method::Post,
        path: "/api/v1/runs/{id}/resolve",
        role: Some(Role::Operator),
        summary: "Settle one call in doubt; 409 when it is not in doubt",
        handler: || post(steer::resolve),
        query: None,
        body: Some(schema::<steer::ResolveBody>),
        body_required: true,
        answers: &[json(200, "The run after the change", schema::<RunView>)],
        problems: ON_A_RUN,
    },
    Operation {
        id: "probeRun",
        method: Method::Post,
        path: "/api/v1/runs/{id}/reconcile",
        role: Some(Role::Operator),
        summary: "Probe now: ask the downstream about the run's calls in doubt (tools with reconcile:); 409 when the run is running",
        handler: || post(probe::reconcile),
        query: None,
        body: Some(schema::<steer::Why>),
        body_required: false,
        answers: &[json(
            200,
            "What each probe found, and the run after",
            schema::<probe::ProbeAnswer>,
        )],
        problems: ON_A_RUN,
    },
    Operation {
        id: "listInDoubt",
        method: Method::Get,
        path: "/api/v1/in-doubt",
        role: Some(Role::Viewer),
        summary: "Every call in doubt across runs, oldest first (at most 1,000)",
        handler: || get(in_doubt::list),
        query: Some(schema::<in_doubt::CallFilter>),
        body: None,
        body_required: false,
        answers: &[json(200, "The calls", schema::<in_doubt::InDoubtList>)],
        problems: AUTHED,
    },
    Operation {
        id: "resolveCalls",
        method: Method::Post,
        path: "/api/v1/in-doubt:resolve",
        role: Some(Role::Admin),
        summary: "Settle many calls in doubt; dry_run lists what it would settle",
        handler: || post(in_doubt::resolve_many),
        query: None,
        body: Some(schema::<in_doubt::Bulk>),
        body_required: true,
        answers: &[json(
            200,
            "What was (or would be) settled",
            schema::<in_doubt::BulkResolved>,
        )],
        problems: AUTHED,
    },
    Operation {
        id: "listEvents",
        method: Method::Get,
        path: "/api/v1/events",
        role: Some(Role::Viewer),
        summary: "Outbox events, oldest first",
        handler: || get(in_doubt::events),
        query: Some(schema::<in_doubt::EventsQuery>),
        body: None,
        body_required: false,
        answers: &[json(200, "A page of events", schema::<in_doubt::EventPage>)],
        problems: AUTHED,
    },
    Operation {
        id: "streamEvents",
        method: Method::Get,
        path: "/api/v1/events:stream",
        role: Some(Role::Viewer),
        summary: "The event feed as Server-Sent Events (id = seq; Last-Event-ID resumes); a live view, not a delivery",
        handler: || get(stream::stream),
        query: Some(schema::<stream::StreamQuery>),
        body: None,
        body_required: false,
        answers: &[Answer {
            status: 200,
            description: "Server-Sent Events: `id` the seq, `event` the type, `data` one event as JSON",
            body: Some(schema::<EventView>),
            media: "text/event-stream",
        }],
        problems: AUTHED,
    },
    Operation {
        id: "getOpenApi",
        method: Method::Get,
        path: "/api/v1/openapi.json",
        role: None,
        summary: "This document",
        handler: || get(openapi),
        query: None,
        body: None,
        body_required: false,
        answers: &[Answer {
            status: 200,
            description: "The OpenAPI 3.1 document",
            body: Some(|_| schemars::json_schema!({"type": "object"})),
            media: "application/json",
        }],
        problems: &[],
    },
];

/// Every `/api/v1` route: [`OPERATIONS`], those of one path merged into one method
/// router.
pub fn routes() -> Router<Arc<App>> {
    let mut by_path: BTreeMap<&str, MethodRouter<Arc<App>>> = BTreeMap::new();
    for op in OPERATIONS {
        let handler = (op.handler)();
        let merged = match by_path.remove(op.path) {
            Some(other) => other.merge(handler),
            None => handler,
        };
        by_path.insert(op.path, merged);
    }
    by_path
        .into_iter()
        .fold(Router::new(), |router, (path, m)| router.route(path, m))
}

/// The document `GET /api/v1/openapi.json` serves, generated once.
static DOCUMENT: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| crate::serve::openapi::text(OPERATIONS));

/// `GET /api/v1/openapi.json` (no token needed: it describes, it reveals nothing).
async fn openapi() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
        .into_response()
}

/// The time every handler writes with.
pub(crate) fn now() -> flow_ledger::Timestamp {
    flow_ledger::Clock::now(&flow_ledger::SystemClock)
}

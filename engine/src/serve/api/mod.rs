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
//! - `items.rs`: a `for_each` node's items, paged.
//! - `waits.rs`: publishing events, callbacks to `callback:` nodes, the list of waits.
//! - `connections.rs`: the connections, and a sign-in begun from here.
//!
//! Shared here: [`HoldQuery`], the one query of the lists of holds (approvals, waits).

pub(crate) mod approvals;
pub(crate) mod connections;
pub(crate) mod in_doubt;
pub(crate) mod items;
pub(crate) mod probe;
pub(crate) mod runs;
pub(crate) mod schedules;
pub(crate) mod steer;
pub(crate) mod stream;
pub(crate) mod waits;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodRouter, get, post};

use schemars::JsonSchema;
use serde::Deserialize;

use super::App;
use super::openapi::{Answer, Method, Operation, SchemaFn, json, schema};
use super::problem::Problem;
use crate::role::Role;
use crate::view::{EventView, RunView};

/// The errors every authenticated operation may answer.
const AUTHED: &[u16] = &[400, 401, 403, 429, 503];
/// … and one about a run that may be unknown or in the wrong state.
const ON_A_RUN: &[u16] = &[400, 401, 403, 404, 409, 429, 503];
/// … and a submission (a body too large, a workflow that does not validate, a run id
/// taken by another workflow or inputs).
const SUBMIT: &[u16] = &[400, 401, 403, 409, 413, 422, 429, 503];

/// What a handler is, for [`Operation::handler`].
type Handler = fn() -> MethodRouter<Arc<App>>;

/// A read: `GET` for viewers and up, no body, the errors every authenticated
/// operation may answer. (These `const fn`s say once what a kind of operation is, so
/// each entry of [`OPERATIONS`] says only what is its own.)
const fn read(
    id: &'static str,
    path: &'static str,
    summary: &'static str,
    handler: Handler,
    query: Option<SchemaFn>,
    answers: &'static [Answer],
) -> Operation {
    Operation {
        id,
        method: Method::Get,
        path,
        role: Some(Role::Viewer),
        summary,
        handler,
        query,
        body: None,
        body_required: false,
        answers,
        problems: AUTHED,
    }
}

/// A write: `POST` of the JSON body `body`, which it requires, for `role` and up.
const fn write(
    id: &'static str,
    path: &'static str,
    role: Role,
    summary: &'static str,
    handler: Handler,
    body: SchemaFn,
    answers: &'static [Answer],
) -> Operation {
    Operation {
        id,
        method: Method::Post,
        path,
        role: Some(role),
        summary,
        handler,
        query: None,
        body: Some(body),
        body_required: true,
        answers,
        problems: AUTHED,
    }
}

/// A change of one run (`POST /api/v1/runs/{id}/…`) for operators and up: an optional
/// body of type `body`, answered with the run after the change.
const fn change(
    id: &'static str,
    path: &'static str,
    summary: &'static str,
    handler: Handler,
    body: SchemaFn,
) -> Operation {
    Operation {
        body_required: false,
        problems: ON_A_RUN,
        ..write(id, path, Role::Operator, summary, handler, body, CHANGED)
    }
}

/// What a change of one run answers.
const CHANGED: &[Answer] = &[json(200, "The run after the change", schema::<RunView>)];
/// The answers of a change to a schedule.
const SCHEDULE_CHANGED: &[Answer] = &[json(
    200,
    "The schedule after the change",
    schema::<crate::schedule::view::ScheduleView>,
)];
/// The problems of a change to one schedule (404: not in the server's flow.toml).
const ON_A_SCHEDULE: &[u16] = &[400, 401, 403, 404, 409, 429, 503];

/// Every operation the API serves.
pub const OPERATIONS: &[Operation] = &[
    read(
        "listRuns",
        "/api/v1/runs",
        "Runs, newest first, keyset-paged",
        || get(runs::list),
        Some(schema::<runs::ListQuery>),
        &[json(200, "A page of runs", schema::<runs::RunList>)],
    ),
    Operation {
        problems: SUBMIT,
        ..write(
            "submitRun",
            "/api/v1/runs",
            Role::Operator,
            "Queue a run (idempotent with run_id)",
            || post(runs::submit),
            schema::<runs::SubmitRun>,
            &[
                json(201, "Queued", schema::<runs::Submitted>),
                json(
                    200,
                    "A run with this run_id, workflow and inputs exists",
                    schema::<runs::Submitted>,
                ),
            ],
        )
    },
    Operation {
        problems: SUBMIT,
        ..write(
            "submitRuns",
            "/api/v1/runs:batch",
            Role::Operator,
            "Queue up to 1,000 runs in one commit",
            || post(runs::batch),
            schema::<runs::Batch>,
            &[json(
                200,
                "Every run, in request order",
                schema::<runs::BatchSubmitted>,
            )],
        )
    },
    Operation {
        problems: &[400, 401, 403, 404, 429, 503],
        ..read(
            "getRun",
            "/api/v1/runs/{id}",
            "One run: the `flow show --json` object",
            || get(runs::show),
            None,
            &[json(200, "The run", schema::<RunView>)],
        )
    },
    Operation {
        problems: &[400, 401, 403, 404, 429, 503],
        ..read(
            "listItems",
            "/api/v1/runs/{id}/items",
            "A `for_each` node's items, by key, a page at a time (the run groups them: counts and the items that did not simply succeed)",
            || get(items::list),
            Some(schema::<items::ItemQuery>),
            &[json(200, "A page of items", schema::<items::ItemPage>)],
        )
    },
    change(
        "cancelRun",
        "/api/v1/runs/{id}/cancel",
        "Cancel a run",
        || post(steer::cancel),
        schema::<steer::Why>,
    ),
    change(
        "resumeRun",
        "/api/v1/runs/{id}/resume",
        "Put a run back on the queue for the daemons",
        || post(steer::resume),
        schema::<steer::Why>,
    ),
    change(
        "redriveRun",
        "/api/v1/runs/{id}/redrive",
        "Put a failed run back on the queue: its failed nodes run again as new attempts (new keys), succeeded ones are replayed; 409 when the run is not failed or has a call in doubt",
        || post(steer::redrive),
        schema::<steer::RedriveBody>,
    ),
    read(
        "listApprovals",
        "/api/v1/approvals",
        "Approvals waiting for a decision (or every one with all=true): the request as it will be sent, its digest, who approved so far",
        || get(approvals::list),
        Some(schema::<HoldQuery>),
        &[json(
            200,
            "Oldest request first",
            schema::<approvals::ApprovalList>,
        )],
    ),
    Operation {
        problems: ON_A_RUN,
        ..write(
            "decideApproval",
            "/api/v1/runs/{id}/approvals/{node}",
            Role::Operator,
            "Approve (a vote) or deny a node's call; 403 not an approver or forbid_self, 409 already decided (naming the winner), past the deadline (naming it), run finished or request changed since `digest`",
            || post(approvals::decide),
            schema::<approvals::DecideBody>,
            &[json(
                200,
                "What became of the decision",
                schema::<approvals::DecisionAnswer>,
            )],
        )
    },
    read(
        "listWaits",
        "/api/v1/waits",
        "Nodes waiting for an event or a callback (or every wait with all=true), earliest deadline first",
        || get(waits::list),
        Some(schema::<HoldQuery>),
        &[json(
            200,
            "Earliest deadline first",
            schema::<waits::WaitList>,
        )],
    ),
    write(
        "publishEvent",
        "/api/v1/events:publish",
        Role::Operator,
        "Publish an event for `wait:` nodes (idempotent on event_id); waits match events from their lookback before they began",
        || post(waits::publish),
        schema::<waits::PublishBody>,
        &[json(
            200,
            "What the publish came to",
            schema::<waits::PublishAnswer>,
        )],
    ),
    Operation {
        role: None,
        problems: &[400, 404, 413],
        ..write(
            "completeCallback",
            "/api/v1/callbacks/{token}",
            Role::Viewer,
            "Complete the node that handed out this callback URL (no bearer token: the token is the credential); 404 for an unknown, used or expired token",
            || post(waits::callback),
            schema::<waits::CallbackBody>,
            &[json(
                200,
                "The wait after it",
                schema::<waits::CallbackAnswer>,
            )],
        )
    },
    Operation {
        role: None,
        problems: &[400, 404],
        body: None,
        body_required: false,
        ..write(
            "heartbeatCallback",
            "/api/v1/callbacks/{token}/heartbeat",
            Role::Viewer,
            "The work behind a callback is alive: its deadline moves one heartbeat interval ahead (never past its timeout); 404 as for a callback",
            || post(waits::heartbeat),
            schema::<waits::CallbackBody>,
            &[json(
                200,
                "The wait after it",
                schema::<waits::CallbackAnswer>,
            )],
        )
    },
    read(
        "listSchedules",
        "/api/v1/schedules",
        "The schedules of the server's flow.toml: next tick, last run, last skip, paused",
        || get(schedules::list),
        None,
        &[json(
            200,
            "In file order",
            schema::<schedules::ScheduleList>,
        )],
    ),
    Operation {
        body_required: false,
        problems: ON_A_SCHEDULE,
        ..write(
            "pauseSchedule",
            "/api/v1/schedules/{schedule}/pause",
            Role::Operator,
            "Pause a schedule: its ticks start nothing (recorded with the token's name)",
            || post(schedules::pause),
            schema::<steer::Why>,
            SCHEDULE_CHANGED,
        )
    },
    Operation {
        body_required: false,
        problems: ON_A_SCHEDULE,
        ..write(
            "resumeSchedule",
            "/api/v1/schedules/{schedule}/resume",
            Role::Operator,
            "Resume a schedule from now (the ticks of the pause are not caught up)",
            || post(schedules::resume),
            schema::<steer::Why>,
            SCHEDULE_CHANGED,
        )
    },
    Operation {
        body_required: false,
        problems: ON_A_SCHEDULE,
        ..write(
            "triggerSchedule",
            "/api/v1/schedules/{schedule}/trigger",
            Role::Operator,
            "Start one run of a schedule now, with its own id; 409 when its workflow does not validate",
            || post(schedules::trigger),
            schema::<steer::Why>,
            &[json(200, "The run started", schema::<schedules::Triggered>)],
        )
    },
    read(
        "listConnections",
        "/api/v1/connections",
        "The connections: who signed in when, scopes, expiry, refresh state (never a token)",
        || get(connections::list),
        None,
        &[json(200, "By name", schema::<connections::ConnectionList>)],
    ),
    Operation {
        body_required: false,
        problems: &[400, 401, 403, 404, 409, 429, 502, 503],
        ..write(
            "connectConnection",
            "/api/v1/connections/{name}/connect",
            Role::Admin,
            "Begin a sign-in (authorization code + PKCE): open authorize_url in a browser; it comes back to [api] public_url",
            || post(connections::connect),
            |_| schemars::json_schema!({"type": "object"}),
            &[json(
                200,
                "The sign-in begun",
                schema::<connections::SignInStarted>,
            )],
        )
    },
    Operation {
        body_required: true,
        ..change(
            "resolveCall",
            "/api/v1/runs/{id}/resolve",
            "Settle one call in doubt; 409 when it is not in doubt",
            || post(steer::resolve),
            schema::<steer::ResolveBody>,
        )
    },
    Operation {
        answers: &[json(
            200,
            "What each probe found, and the run after",
            schema::<probe::ProbeAnswer>,
        )],
        ..change(
            "probeRun",
            "/api/v1/runs/{id}/reconcile",
            "Probe now: ask the downstream about the run's calls in doubt (tools with reconcile:); 409 when the run is running",
            || post(probe::reconcile),
            schema::<steer::Why>,
        )
    },
    read(
        "listInDoubt",
        "/api/v1/in-doubt",
        "Every call in doubt across runs, oldest first (at most 1,000)",
        || get(in_doubt::list),
        Some(schema::<in_doubt::CallFilter>),
        &[json(200, "The calls", schema::<in_doubt::InDoubtList>)],
    ),
    write(
        "resolveCalls",
        "/api/v1/in-doubt:resolve",
        Role::Admin,
        "Settle many calls in doubt; dry_run lists what it would settle",
        || post(in_doubt::resolve_many),
        schema::<in_doubt::Bulk>,
        &[json(
            200,
            "What was (or would be) settled",
            schema::<in_doubt::BulkResolved>,
        )],
    ),
    read(
        "listEvents",
        "/api/v1/events",
        "Outbox events, oldest first",
        || get(in_doubt::events),
        Some(schema::<in_doubt::EventsQuery>),
        &[json(200, "A page of events", schema::<in_doubt::EventPage>)],
    ),
    read(
        "streamEvents",
        "/api/v1/events:stream",
        "The event feed as Server-Sent Events (id = seq; Last-Event-ID resumes); a live view, not a delivery",
        || get(stream::stream),
        Some(schema::<stream::StreamQuery>),
        &[Answer {
            status: 200,
            description: "Server-Sent Events: `id` the seq, `event` the type, `data` one event as JSON",
            body: Some(schema::<EventView>),
            media: "text/event-stream",
        }],
    ),
    Operation {
        role: None,
        problems: &[],
        ..read(
            "getOpenApi",
            "/api/v1/openapi.json",
            "This document",
            || get(openapi),
            None,
            &[Answer {
                status: 200,
                description: "The OpenAPI 3.1 document",
                body: Some(|_| schemars::json_schema!({"type": "object"})),
                media: "application/json",
            }],
        )
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

/// The query of the lists of holds — `GET /api/v1/approvals` and `GET /api/v1/waits`:
/// one shape for every kind of parked node.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldQuery {
    /// Only this run's.
    pub(crate) run: Option<String>,
    /// Settled ones too: decided, completed, timed out, cancelled (default: pending only).
    #[serde(default)]
    pub(crate) all: bool,
    /// At most this many, 1 to 1,000 (default 1,000).
    #[schemars(range(min = 1, max = 1000))]
    pub(crate) limit: Option<u32>,
}

impl HoldQuery {
    /// The run asked for, checked as a run id (400 naming `run`).
    pub(crate) fn run(&self) -> Result<Option<String>, Problem> {
        if let Some(run) = &self.run {
            flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, run)
                .map_err(|e| Problem::bad_request(format!("run: {e}")))?;
        }
        Ok(self.run.clone())
    }

    /// The page size: `limit` within 1 to 1,000, 1,000 when not given.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.unwrap_or(1000).clamp(1, 1000)
    }
}

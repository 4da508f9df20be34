//! The OpenAPI 3.1 document of the API, built from [`ROUTES`] (the table the README's
//! endpoint list follows) and served at `/api/v1/openapi.json`. `docs/openapi.json` is
//! the committed copy; a test fails when it differs from what the server serves.

use serde_json::{Map, Value as Json, json};

use super::auth::Role;

/// One operation of the API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// `get` or `post`.
    pub method: &'static str,
    /// The path, parameters in braces.
    pub path: &'static str,
    /// The least role allowed (`None`: no token needed).
    pub role: Option<Role>,
    /// What it does.
    pub summary: &'static str,
    /// The success status.
    pub ok: u16,
    /// The query parameters.
    pub query: &'static [&'static str],
    /// The body's top-level fields (empty: no body).
    pub body: &'static [&'static str],
}

/// Every operation `api::routes` serves.
pub const ROUTES: &[Route] = &[
    Route {
        method: "get",
        path: "/api/v1/runs",
        role: Some(Role::Viewer),
        summary: "Runs, newest first, keyset-paged: {runs, next_cursor}",
        ok: 200,
        query: &["status", "workflow", "since", "limit", "cursor"],
        body: &[],
    },
    Route {
        method: "post",
        path: "/api/v1/runs",
        role: Some(Role::Operator),
        summary: "Queue a run (idempotent with run_id): 201 new, 200 existing, 409 other workflow or inputs, 422 invalid workflow",
        ok: 201,
        query: &[],
        body: &["workflow", "inputs", "run_id"],
    },
    Route {
        method: "post",
        path: "/api/v1/runs:batch",
        role: Some(Role::Operator),
        summary: "Queue up to 1,000 runs in one commit",
        ok: 200,
        query: &[],
        body: &["runs"],
    },
    Route {
        method: "get",
        path: "/api/v1/runs/{id}",
        role: Some(Role::Viewer),
        summary: "One run: the `flow show --json` object",
        ok: 200,
        query: &[],
        body: &[],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/cancel",
        role: Some(Role::Operator),
        summary: "Cancel a run",
        ok: 200,
        query: &[],
        body: &["reason"],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/resume",
        role: Some(Role::Operator),
        summary: "Put a run back on the queue for the daemons",
        ok: 200,
        query: &[],
        body: &["reason"],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/resolve",
        role: Some(Role::Operator),
        summary: "Settle one call in doubt; 409 when it is not in doubt",
        ok: 200,
        query: &[],
        body: &["node", "outcome", "output", "error", "reason"],
    },
    Route {
        method: "post",
        path: "/api/v1/runs/{id}/reconcile",
        role: Some(Role::Operator),
        summary: "Probe now: ask the downstream about the paused run's calls in doubt (tools with reconcile:); {probes, run}; 409 when the run is not paused",
        ok: 200,
        query: &[],
        body: &["reason"],
    },
    Route {
        method: "get",
        path: "/api/v1/in-doubt",
        role: Some(Role::Viewer),
        summary: "Every call in doubt across runs: {calls}",
        ok: 200,
        query: &["run", "node", "tool"],
        body: &[],
    },
    Route {
        method: "post",
        path: "/api/v1/in-doubt:resolve",
        role: Some(Role::Admin),
        summary: "Settle many calls in doubt; dry_run counts them",
        ok: 200,
        query: &[],
        body: &["filter", "outcome", "output", "error", "reason", "dry_run"],
    },
    Route {
        method: "get",
        path: "/api/v1/events",
        role: Some(Role::Viewer),
        summary: "Outbox events, oldest first: {events, next_after}",
        ok: 200,
        query: &["after", "limit", "run"],
        body: &[],
    },
    Route {
        method: "get",
        path: "/api/v1/events:stream",
        role: Some(Role::Viewer),
        summary: "The event feed as Server-Sent Events (id = seq; Last-Event-ID resumes); a live view, not a delivery",
        ok: 200,
        query: &["after", "run"],
        body: &[],
    },
    Route {
        method: "get",
        path: "/api/v1/openapi.json",
        role: None,
        summary: "This document",
        ok: 200,
        query: &[],
        body: &[],
    },
];

/// The statuses every authenticated operation may answer besides its success.
const PROBLEMS: &[(u16, &str)] = &[
    (
        400,
        "Malformed JSON, unknown field or wrong type (detail names the field); a control character (NUL…) in the path or query; a run id outside the id grammar",
    ),
    (401, "No valid bearer token"),
    (403, "The token's role is too low"),
    (404, "No such run, call or route"),
    (409, "Conflicts with the current state"),
    (413, "Body over 16 MiB"),
    (
        422,
        "The workflow does not validate (errors lists every diagnostic)",
    ),
    (
        429,
        "Too many failed authentications from this address (Retry-After says when to retry)",
    ),
];

fn operation(r: &Route) -> Json {
    let mut responses = Map::new();
    responses.insert(r.ok.to_string(), json!({"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}));
    if r.role.is_some() {
        for (status, why) in PROBLEMS {
            responses.insert(status.to_string(), json!({"description": why, "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}));
        }
    }
    let mut params: Vec<Json> = r
        .query
        .iter()
        .map(|q| json!({"name": q, "in": "query", "required": false, "schema": {"type": "string"}}))
        .collect();
    if r.path.contains("{id}") {
        params.push(
            json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}),
        );
    }
    let mut op = json!({
        "summary": r.summary,
        "parameters": params,
        "responses": responses,
        "security": if r.role.is_some() { json!([{"bearer": []}]) } else { json!([]) },
    });
    if let Some(role) = r.role {
        op["x-flow-role"] = json!(role.as_str());
    }
    if !r.body.is_empty() {
        let props: Map<String, Json> = r
            .body
            .iter()
            .map(|f| ((*f).to_string(), json!({})))
            .collect();
        op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false, "properties": props}}}});
    }
    op
}

/// The document.
pub fn document() -> Json {
    let mut paths = Map::new();
    for r in ROUTES {
        let entry = paths.entry(r.path.to_string()).or_insert_with(|| json!({}));
        entry[r.method] = operation(r);
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "flow operator API", "version": env!("CARGO_PKG_VERSION"), "description": "Runs, calls in doubt and their resolution. Roles: viewer reads; operator also submits, cancels, resumes, resolves; admin also bulk operations."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Problem": {"type": "object", "description": "RFC 9457", "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"}}, "required": ["type", "title", "status", "detail"]}},
        },
    })
}

/// The document as served and committed: pretty JSON with a final newline.
pub fn text() -> String {
    let mut t = serde_json::to_string_pretty(&document()).unwrap_or_default();
    t.push('\n');
    t
}

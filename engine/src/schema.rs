//! The JSON Schema of workflow files (`flow schema`, committed as `workflows/schema.json`).
//!
//! Editors use it for completion and inline errors. It mirrors the keys that
//! [`crate::workflow`] accepts; a test checks every example against it, and another that
//! the committed copy is current. Validation proper (references, cycles, expressions)
//! is `flow validate`'s job: a schema cannot express it.

use serde_json::{Value, json};

/// `approval:` on a node.
fn approval() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["timeout"],
        "description": "People approve the node's call before it leaves; what is approved (its digest) is exactly what is sent.",
        "properties": {
            "message": { "type": "string", "description": "What approvers read; may hold `${{ expr }}` (no secrets)." },
            "approvers": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "roles": { "type": "array", "items": { "enum": ["operator", "admin"] } },
                    "tokens": { "type": "array", "items": { "type": "string" } },
                    "min": { "type": "integer", "minimum": 1, "maximum": 20 }
                }
            },
            "forbid_self": { "type": "boolean", "description": "The token that submitted the run may not approve it." },
            "inputs": { "type": "object", "description": "What approvers give, declared like the workflow's `inputs`." },
            "timeout": duration(),
            "on_timeout": { "enum": ["fail", "skip"] },
            "remind": { "type": "array", "maxItems": 10, "items": duration() }
        }
    })
}

/// `wait:` on a node (which then calls no tool).
fn wait() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["event", "timeout"],
        "description": "The node calls no tool: it completes when an event its `match` accepts is published (`flow publish`, `POST /api/v1/events:publish`); its output is the event's data.",
        "properties": {
            "event": {
                "type": "object",
                "additionalProperties": false,
                "required": ["name"],
                "properties": {
                    "name": { "type": "string", "minLength": 1, "maxLength": 200 },
                    "match": { "type": ["string", "boolean"], "description": "One expression over `event` (the event's data), `inputs`, `nodes` and `run`; default: any event of the name." },
                    "lookback": duration()
                }
            },
            "timeout": duration(),
            "on_timeout": { "enum": ["fail", "skip"] }
        }
    })
}

/// `workflow:` on a node: the child workflow's file.
fn child_workflow() -> Value {
    json!({ "type": "string", "minLength": 1, "description": "Run this workflow file (relative to this one) as a child run of its own; the node's `with` is its inputs, its output the node's." })
}

/// `on_parent_cancel:` of a `workflow:` node.
fn on_parent_cancel() -> Value {
    json!({ "enum": ["cancel", "abandon"], "description": "A `workflow:` node's child when this run is cancelled: cancelled too (default) or left running." })
}

/// `schedules:` (stored with `flow schedules apply`).
fn schedules() -> Value {
    json!({
        "type": "array",
        "description": "When the workflow runs by itself; stored with `flow schedules apply FILE` and fired by every daemon (`flow run` ignores them).",
        "items": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "cron"],
            "properties": {
                "id": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "description": "Unique in the installation; part of each tick's run id." },
                "cron": { "type": "string", "description": "Five fields (six with seconds first) or @hourly, @daily, @weekly, @monthly, @yearly." },
                "timezone": { "type": "string", "description": "IANA name; default UTC." },
                "inputs": { "type": "object", "description": "The run's inputs; strings may read `${{ schedule.time }}` and `${{ schedule.id }}`." },
                "overlap": { "enum": ["skip", "buffer_one", "allow"] },
                "catchup_window": { "type": "string", "description": "How late a tick missed while no daemon ran may still start (e.g. 6h; at most 31 days); default 1m." }
            }
        }
    })
}

/// `included:`, which flow adds to a stored run's text.
fn included() -> Value {
    json!({
        "type": "object",
        "description": "Added by flow to a stored run's text: each sub-workflow's file (as its `workflow:` names it) and its text.",
        "additionalProperties": { "type": "string" }
    })
}

/// `for_each:` on a node with a tool.
fn for_each() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["items", "key"],
        "description": "Call the node's tool once per item of a list, each item a step `<node>[<key>]` whose call key is `<run>:<node>[<key>]`; the node's output is `{items: {<key>: output}, succeeded, failed, skipped}`.",
        "properties": {
            "items": { "description": "The list: a JSON array, usually one expression (`${{ nodes.list.output.customers }}`) over `inputs`, `nodes` and `run`." },
            "key": { "type": "string", "description": "The item's identity, one expression over `item` giving a string or a number (1 to 200 visible ASCII characters), never its position." },
            "max_items": { "type": "integer", "minimum": 1, "maximum": 1000000, "description": "A longer list fails the node before anything is sent (default 10000)." },
            "concurrency": { "type": "integer", "minimum": 1, "maximum": 1024, "description": "Items in flight at once (default and ceiling: the run's `max_parallel`)." },
            "tolerate": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "failed": { "oneOf": [ { "type": "integer", "minimum": 0 }, { "type": "string", "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*%\\s*$" } ], "description": "Failed items tolerated: a count or a percentage of the list (default 0)." }
                }
            },
            "in_doubt": { "enum": ["hold"], "description": "An item in doubt holds only itself; the run pauses once nothing else can run." }
        }
    })
}

/// `callback:` on a node with a tool.
fn callback() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["timeout"],
        "description": "After its call succeeds the node waits for `POST` to `${{ callback.url }}` (built from `[api] public_url`); its output is the callback's `output`.",
        "properties": {
            "timeout": duration(),
            "heartbeat": duration(),
            "on_timeout": { "enum": ["fail", "skip"] }
        }
    })
}

fn duration() -> Value {
    json!({
        "type": "string",
        "pattern": "^\\s*[0-9]+\\s*[a-zµ]+(\\s*[0-9]+\\s*[a-zµ]+)*\\s*$",
        "description": "A duration: `250ms`, `30s`, `5m`, `1h`, `1h30m`.",
        "examples": ["250ms", "30s", "5m", "1h"]
    })
}

fn string_map(description: &str) -> Value {
    json!({
        "type": "object",
        "additionalProperties": { "type": ["string", "number", "boolean"] },
        "description": description
    })
}

fn argv(description: &str) -> Value {
    json!({ "type": "array", "items": { "type": "string" }, "minItems": 1, "description": description })
}

/// `retry_policy`, as nodes and `defaults` both take it.
fn retry_policy() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "description": "Node retries. Each retry is a step `<node>_retry<n>` created with a durable `not_before`.",
        "properties": {
            "max_retries": { "type": "integer", "minimum": 0, "maximum": 100, "description": "Retries after the first attempt (2 = at most 3 steps)." },
            "backoff": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "initial": duration(),
                    "max": duration(),
                    "multiplier": { "type": "number", "minimum": 1, "maximum": 10 },
                    "jitter": { "type": "number", "minimum": 0, "maximum": 1, "description": "Fraction of each delay drawn at random." }
                }
            }
        }
    })
}

/// A tool's `reconcile:` block (which probe keys apply depends on the kind; `flow
/// validate` says which).
fn reconcile() -> Value {
    let verdict = |what: &str| json!({ "type": ["string", "boolean"], "description": what });
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["found", "not_found"],
        "description": "How to ask the downstream whether an in-doubt call took effect, before a human is asked.",
        "properties": {
            "request": { "type": "object", "additionalProperties": false, "required": ["url"],
                "description": "http tools: the probe request (sees `call.key`, `call.request`, `call.outbound_at`, `inputs`, secrets).",
                "properties": {
                    "method": { "enum": ["GET", "HEAD", "get", "head"] },
                    "url": { "type": "string" },
                    "headers": string_map("Probe headers (templated)."),
                    "query": string_map("Probe query parameters (templated).")
                } },
            "tool": { "type": "string", "description": "mcp tools: another tool of the same server." },
            "with": { "description": "mcp tools: the probe tool's arguments (templated)." },
            "command": argv("command tools: the probe program; the call arrives as JSON on stdin."),
            "env": string_map("command tools: the probe program's environment."),
            "found": verdict("One expression over `response` (`status`, `headers`, `body`): the effect took place."),
            "not_found": verdict("One expression over `response`: the effect did not take place (trusted only `after` the request left)."),
            "output": { "description": "The node's output when found (templated over `response`); default the response body." },
            "after": duration(),
            "max_probes": { "type": "integer", "minimum": 1, "maximum": 100, "default": 5,
                "description": "Probes with an unknown answer before a human is asked." },
            "max_resends": { "type": "integer", "minimum": 0, "maximum": 10, "default": 1,
                "description": "Re-sends of the same key on a trusted `not_found` before a human is asked (counted in the ledger across processes)." },
            "interval": duration(),
            "timeout": duration()
        }
    })
}

/// One entry of `tools`: the common keys, then each kind's own under `if kind = …`.
fn tool() -> Value {
    let common = json!({
        "kind": { "enum": ["function", "command", "http", "mcp"] },
        "description": { "type": "string" },
        "timeout": duration(),
        "rate_limit": { "type": "object", "additionalProperties": false, "minProperties": 1,
            "properties": {
                "per_second": { "type": "integer", "minimum": 1, "maximum": 100000 },
                "per_minute": { "type": "integer", "minimum": 1, "maximum": 1000000 } },
            "description": "Requests per second and/or per minute, counted in the ledger across all workers." },
        "quota": { "type": "object", "additionalProperties": false, "required": ["per_day"],
            "properties": { "per_day": { "type": "integer", "minimum": 1, "maximum": 100000000 } },
            "description": "Requests per UTC day, counted in the ledger across all workers." },
        "concurrency": { "type": "integer", "minimum": 1, "maximum": 100000,
            "description": "At most this many calls of the tool between the outbound mark and their outcome, counted in the ledger across all workers; a call in doubt keeps its slot until resolved. Calls waiting for a slot hold no worker." },
        "idempotency": { "enum": ["none", "header"], "description": "`header`: the downstream dedupes on the idempotency-key header, so an unknown outcome may be re-sent with the same key." },
        "read_only": { "type": "boolean", "description": "Safe to repeat: an unknown outcome is retried instead of going in doubt." },
        "reconcile": reconcile()
    });
    let with_kind = |kind: &str, required: &[&str], extra: Value| {
        let mut props = common.clone();
        if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
            p.insert("kind".into(), json!({ "const": kind }));
        }
        let mut req = vec!["kind".to_string()];
        req.extend(required.iter().map(|s| (*s).to_string()));
        json!({
            "if": { "properties": { "kind": { "const": kind } }, "required": ["kind"] },
            "then": { "type": "object", "additionalProperties": false, "required": req, "properties": props }
        })
    };
    json!({
        "type": "object",
        "required": ["kind"],
        "properties": { "kind": { "enum": ["function", "command", "http", "mcp"] } },
        "allOf": [
            with_kind("function", &["function"], json!({
                "function": { "type": "string", "description": "Registry name, e.g. `core.echo`." }
            })),
            with_kind("command", &["command"], json!({
                "command": argv("Program and arguments (no shell). `with` arrives as JSON on stdin."),
                "env": string_map("Environment for the program (templated); the only way secrets reach it."),
                "cwd": { "type": "string" },
                "env_allow": { "type": "array", "items": { "type": "string" }, "description": "Inherited variable names." }
            })),
            with_kind("http", &["url"], json!({
                "method": { "enum": ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "get", "head", "options", "post", "put", "patch", "delete"] },
                "url": { "type": "string" },
                "headers": string_map("Request headers (templated)."),
                "query": string_map("Query parameters (templated)."),
                "body": { "description": "JSON body (templated); default: the node's `with` for non-GET methods." },
                "idempotency_header": { "type": "string", "default": "Idempotency-Key" },
                "follow_redirects": { "type": "boolean", "default": false },
                "max_response_bytes": { "type": "integer", "minimum": 1 }
            })),
            with_kind("mcp", &["server", "tool"], json!({
                "server": {
                    "type": "object",
                    "oneOf": [
                        { "additionalProperties": false, "required": ["command"], "properties": {
                            "command": argv("Server program (stdio transport)."),
                            "args": { "type": "array", "items": { "type": "string" } },
                            "env": string_map("Environment for the server."),
                            "cwd": { "type": "string" } } },
                        { "additionalProperties": false, "required": ["url"], "properties": {
                            "url": { "type": "string", "description": "Streamable HTTP endpoint." },
                            "headers": string_map("Request headers.") } }
                    ]
                },
                "tool": { "type": "string" },
                "auth": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "bearer": { "type": "string" },
                        "connection": { "type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$",
                            "description": "A connection of flow.toml (`[[connections]]`), signed in with `flow connect NAME`." },
                        "oauth": { "type": "object", "additionalProperties": false,
                            "required": ["client_id"],
                            "properties": {
                                "token_url": { "type": "string", "description": "Token endpoint; omitted: discovered from the server's 401." },
                                "client_id": { "type": "string" },
                                "client_secret": { "type": "string" },
                                "private_key": { "type": "string", "description": "PKCS#8 PEM key for private_key_jwt." },
                                "signing_algorithm": { "enum": ["ES256", "RS256"], "default": "ES256" },
                                "token_endpoint_auth": { "enum": ["client_secret_basic", "client_secret_post"] },
                                "scope": { "type": "string" } } }
                    }
                },
                "annotations": {
                    "type": "object", "additionalProperties": false,
                    "description": "The tool's behaviour hints as reviewed, used instead of the server's listing for side-effect classes and [[policy.approvals]].",
                    "properties": {
                        "read_only": { "type": "boolean", "default": false },
                        "destructive": { "type": "boolean", "default": true },
                        "idempotent": { "type": "boolean", "default": false }
                    }
                },
                "propagate_trace": {
                    "type": "boolean", "default": true,
                    "description": "Send `_meta` with each call: its idempotency key (`io.flow/idempotency-key`) and trace context (`traceparent` / `tracestate`); false for a server that refuses unknown `_meta` keys."
                },
                "elicitation": {
                    "description": "How the server's elicitation requests are answered; default decline.",
                    "oneOf": [
                        { "enum": ["decline", "accept_defaults"] },
                        { "type": "object", "additionalProperties": false, "required": ["accept"],
                          "properties": { "accept": { "type": "object",
                            "additionalProperties": { "type": ["string", "number", "boolean"] } } } }
                    ]
                }
            }))
        ]
    })
}

/// The schema as a JSON value.
pub fn workflow_schema() -> Value {
    let mut schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://flow.dev/schema/workflow.json",
        "title": "flow workflow",
        "description": "A DAG of nodes, each calling one tool. Strings may hold `${{ expr }}` expressions.",
        "type": "object",
        "additionalProperties": false,
        "required": ["nodes"],
        "properties": {
            "name": { "type": "string" },
            "description": { "type": "string" },
            "inputs": {
                "type": "object",
                "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" },
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["type"],
                    "properties": {
                        "type": { "enum": ["string", "integer", "number", "boolean", "object", "array"] },
                        "required": { "type": "boolean" },
                        "default": {},
                        "description": { "type": "string" }
                    }
                }
            },
            "defaults": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "timeout": duration(),
                    "deadline": duration(),
                    "retry_policy": retry_policy()
                }
            },
            "max_parallel": { "type": "integer", "minimum": 1, "maximum": 1024 },
            "included": included(),
            "tools": {
                "type": "object",
                "propertyNames": { "pattern": "^[A-Za-z0-9_.-]+$" },
                "additionalProperties": tool()
            },
            "nodes": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": { "pattern": "^[a-z0-9_-]+$", "maxLength": 128, "not": { "pattern": "_retry[0-9]+$" } },
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": false,
                    "oneOf": [ { "required": ["tool"] }, { "required": ["wait"] }, { "required": ["workflow"] } ],
                    "properties": {
                        "tool": { "type": "string" },
                        "needs": { "oneOf": [ { "type": "string" }, { "type": "array", "items": { "type": "string" } } ] },
                        "with": { "description": "Arguments; strings may hold `${{ expr }}`." },
                        "if": { "type": ["string", "boolean"], "description": "Skip the node (and its dependents) when false: `true`, `false` or one expression, with or without `${{ }}` (text around it is refused)." },
                        "retry_policy": retry_policy(),
                        "timeout": duration(),
                        "deadline": duration(),
                        "idempotency_key": { "type": "string", "description": "Names the effect across runs; default `<run_id>:<node>`." },
                        "continue_on_error": { "type": "boolean" },
                        "description": { "type": "string" },
                        "approval": approval(),
                        "wait": wait(),
                        "callback": callback(),
                        "for_each": for_each(),
                        "workflow": child_workflow(),
                        "on_parent_cancel": on_parent_cancel()
                    }
                }
            }
        }
    });
    // Beside the rest: one more level in the literal passes `json!`'s recursion limit.
    schema["properties"]["schedules"] = schedules();
    schema
}

/// The schema as pretty JSON with a trailing newline (the committed file's exact text).
pub fn workflow_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&workflow_schema()).unwrap_or_default();
    text.push('\n');
    text
}

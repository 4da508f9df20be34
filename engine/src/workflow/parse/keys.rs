//! What a workflow file may say: the keys each mapping accepts, the tool kinds and HTTP
//! methods, and the limits on values. One place, so adding a key starts here (then
//! `model.rs` and `schema.rs`).

use std::time::Duration;

/// Longest per-attempt timeout accepted: a day. Anything longer is a typo or a job for
/// a queue, not a request.
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Longest whole-node deadline accepted: 30 days.
pub(super) const MAX_DEADLINE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most retries a node may declare.
pub(super) const MAX_RETRIES: u32 = 100;
/// Largest `max_parallel`.
pub(super) const MAX_PARALLEL: u32 = 1024;

pub(super) const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "inputs",
    "defaults",
    "max_parallel",
    "tools",
    "nodes",
    "included",
    "schedules",
];
pub(super) const SCHEDULE_KEYS: &[&str] = &[
    "id",
    "cron",
    "timezone",
    "inputs",
    "overlap",
    "catchup_window",
];
pub(super) const INPUT_KEYS: &[&str] = &["type", "required", "default", "description"];
pub(super) const DEFAULTS_KEYS: &[&str] = &["timeout", "deadline", "retry_policy"];
pub(super) const RETRY_KEYS: &[&str] = &["max_retries", "backoff"];
pub(super) const BACKOFF_KEYS: &[&str] = &["initial", "max", "multiplier", "jitter"];
pub(super) const NODE_KEYS: &[&str] = &[
    "tool",
    "needs",
    "with",
    "if",
    "retry_policy",
    "timeout",
    "deadline",
    "idempotency_key",
    "continue_on_error",
    "description",
    "approval",
    "wait",
    "callback",
    "for_each",
];
pub(super) const FOR_EACH_KEYS: &[&str] = &[
    "items",
    "key",
    "max_items",
    "concurrency",
    "tolerate",
    "in_doubt",
];
pub(super) const TOLERATE_KEYS: &[&str] = &["failed"];
/// What a sub-workflow node may say besides `workflow:` (it calls no tool; retries
/// belong to the child's nodes: a new child would send every call again).
pub(super) const CHILD_NODE_KEYS: &[&str] = &[
    "workflow",
    "needs",
    "with",
    "if",
    "description",
    "for_each",
    "on_parent_cancel",
    "continue_on_error",
];
/// What a `wait:` node may say besides `wait:` (it calls no tool).
pub(super) const WAIT_NODE_KEYS: &[&str] = &["needs", "if", "description", "wait"];
pub(super) const WAIT_KEYS: &[&str] = &["event", "timeout", "on_timeout"];
pub(super) const WAIT_EVENT_KEYS: &[&str] = &["name", "match", "lookback"];
pub(super) const CALLBACK_KEYS: &[&str] = &["timeout", "heartbeat", "on_timeout"];
/// Longest `wait` / `callback` timeout and `lookback`: a year is a typo; 90 days is not.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(90 * 24 * 3600);
pub(super) const APPROVAL_KEYS: &[&str] = &[
    "message",
    "approvers",
    "forbid_self",
    "inputs",
    "timeout",
    "on_timeout",
    "remind",
];
pub(super) const APPROVERS_KEYS: &[&str] = &["roles", "tokens", "min"];
/// The roles an approval may name (a viewer never decides).
pub(super) const APPROVER_ROLES: &[&str] = &["operator", "admin"];
/// Most distinct approvers an approval may require.
pub(super) const MAX_APPROVERS: u32 = 20;
/// Most reminders an approval may declare.
pub(super) const MAX_REMINDERS: usize = 10;
pub(super) const TOOL_COMMON_KEYS: &[&str] = &[
    "kind",
    "description",
    "timeout",
    "rate_limit",
    "quota",
    "concurrency",
    "idempotency",
    "read_only",
    "reconcile",
];
pub(super) const RECONCILE_KEYS: &[&str] = &[
    "request",
    "tool",
    "with",
    "command",
    "env",
    "found",
    "not_found",
    "output",
    "after",
    "max_probes",
    "max_resends",
    "interval",
    "timeout",
];
pub(super) const RECONCILE_REQUEST_KEYS: &[&str] = &["method", "url", "headers", "query"];
pub(super) const FUNCTION_KEYS: &[&str] = &["function"];
pub(super) const COMMAND_KEYS: &[&str] = &["command", "env", "cwd", "env_allow"];
pub(super) const HTTP_KEYS: &[&str] = &[
    "method",
    "url",
    "headers",
    "query",
    "body",
    "idempotency_header",
    "follow_redirects",
    "max_response_bytes",
];
pub(super) const MCP_KEYS: &[&str] = &[
    "server",
    "tool",
    "auth",
    "elicitation",
    "propagate_trace",
    "annotations",
];
pub(super) const TOOL_KINDS: &[&str] = &["function", "command", "http", "mcp"];
pub(super) const HTTP_METHODS: &[&str] =
    &["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"];

//! One `tools/call`: the run it starts or joins, waiting for that run, and the answer
//! an agent can act on.
//!
//! The run id is what makes a call start at most one run: derived from the caller, the
//! tool and the call's idempotency key ([`run_id_for_key`]), or — without a key — from
//! the caller, the tool, the canonical arguments and the window the call arrived in
//! ([`Front::coalesce`]). The ledger's enqueue is idempotent on the id, so two
//! processes deriving one id start one run.

use std::time::Duration;

use flow_ledger::{Actor, CallStatus, NewRun, Run, RunStatus, canonical_hash};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, MetaObject};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::catalog::Entry;
use super::{COALESCED_META, Front, RUN_META, STATUS_TOOL, SUBMITTER_PREFIX};
use crate::view::RunView;

/// One call as the agent made it.
#[derive(Debug)]
pub struct Call<'a> {
    /// Who calls: the API token's name, or the OS user of a stdio server.
    pub principal: &'a str,
    /// The tool (a workflow's name).
    pub tool: &'a str,
    /// Its arguments (the workflow's inputs).
    pub arguments: JsonObject,
    /// `_meta["io.flow/idempotency-key"]`, when the client sent one.
    pub key: Option<&'a str>,
}

/// The run a call started or joined.
#[derive(Debug)]
pub struct Joined {
    /// The run.
    pub run: Run,
    /// False when an earlier call (same key, or identical within the window) started it.
    pub created: bool,
}

/// Why a call was refused before any run: said to the agent as a tool error.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The arguments do not fit the workflow's inputs.
    #[error("{0}")]
    Arguments(String),
    /// The key was used before with other arguments.
    #[error(
        "idempotency key `{key}` was used before with other arguments (run {run}): one key is one call; use a new key for a new call"
    )]
    KeyReused {
        /// The key.
        key: String,
        /// The run it names.
        run: String,
    },
    /// The ledger could not be reached or refused the write.
    #[error("flow could not record the call: {0}; nothing was started, so calling again is safe")]
    Ledger(#[from] flow_ledger::Error),
}

/// The run id of a call with an idempotency key: the same caller, tool and key always
/// give the same id, on any server sharing the ledger.
pub fn run_id_for_key(principal: &str, tool: &str, key: &str) -> String {
    format!("mcp_{}", digest(&[principal, tool, key]))
}

/// The run id of a call without a key arriving in window number `window` (time since
/// the epoch divided by the window's length).
fn run_id_in_window(principal: &str, tool: &str, arguments: &str, window: i64) -> String {
    format!("mcp_{}_{window}", digest(&[principal, tool, arguments]))
}

/// 32 hex digits of SHA-256 over `parts`, each length-prefixed (no two splits of one
/// text collide).
fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let out = h.finalize();
    out.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

impl Front {
    /// Starts or joins the run of `call`.
    pub async fn start(&self, entry: &Entry, call: &Call<'_>) -> Result<Joined, Refused> {
        let given = if entry.proxied {
            let mut wrapped = JsonObject::new();
            wrapped.insert("arguments".into(), Json::Object(call.arguments.clone()));
            wrapped
        } else {
            call.arguments.clone()
        };
        let inputs = crate::inputs::from_json(&entry.workflow, given)
            .map_err(|e| Refused::Arguments(format!("arguments: {e}")))?;
        match call.key {
            Some(key) => {
                let id = run_id_for_key(call.principal, call.tool, key);
                self.join_or_enqueue(entry, call, id.clone(), inputs)
                    .await?
                    .ok_or_else(|| Refused::KeyReused {
                        key: key.to_owned(),
                        run: id,
                    })
            }
            None => self.coalesce(entry, call, inputs).await,
        }
    }

    /// Without a key: the run of an identical call (same caller, tool and canonical
    /// arguments) that started less than a window ago, else a new run named after this
    /// window. The previous window's run is joined while it is younger than a window,
    /// so two calls 3 ms apart across a window's edge still share one run.
    async fn coalesce(
        &self,
        entry: &Entry,
        call: &Call<'_>,
        inputs: Json,
    ) -> Result<Joined, Refused> {
        let _one_at_a_time = self.joining.lock().await;
        let now = self.clock.now();
        let width = i64::try_from(self.window.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        let window = now.0.div_euclid(width);
        let args = canonical_hash(&inputs);
        let previous = run_id_in_window(call.principal, call.tool, &args, window - 1);
        match self.ledger.get_run(&previous).await {
            Ok(run) if now.0 - run.created_at.0 < width => {
                return Ok(Joined {
                    run,
                    created: false,
                });
            }
            Ok(_) | Err(flow_ledger::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let id = run_id_in_window(call.principal, call.tool, &args, window);
        self.join_or_enqueue(entry, call, id, inputs)
            .await?
            .ok_or_else(|| {
                Refused::Arguments("an identical call's run has other inputs".to_owned())
            })
    }

    /// The run `id` when it exists with these inputs (`None`: other inputs), else a new
    /// one. A run found is answered from whatever workflow text it carries: the call
    /// is the same call even if the file was edited since.
    async fn join_or_enqueue(
        &self,
        entry: &Entry,
        call: &Call<'_>,
        id: String,
        inputs: Json,
    ) -> Result<Option<Joined>, Refused> {
        for _ in 0..2 {
            match self.ledger.get_run(&id).await {
                Ok(run) => {
                    let same = canonical_hash(&run.inputs) == canonical_hash(&inputs);
                    return Ok(same.then_some(Joined {
                        run,
                        created: false,
                    }));
                }
                Err(flow_ledger::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let new = NewRun {
                id: id.clone(),
                workflow_name: entry.workflow.name.clone(),
                workflow_text: entry.text.clone(),
                inputs: inputs.clone(),
                priority: 0,
                not_before: None,
                trace_parent: None,
            };
            let actor = Actor {
                by: format!("{SUBMITTER_PREFIX}{}", call.principal),
                reason: Some(format!("MCP tools/call {}", call.tool)),
            };
            match self
                .ledger
                .enqueue_as(new, Some(actor), self.clock.now())
                .await
            {
                Ok(enq) => {
                    return Ok(Some(Joined {
                        run: enq.run,
                        created: enq.created,
                    }));
                }
                // Another server enqueued it first (perhaps from an edited file): read
                // what it stored.
                Err(flow_ledger::Error::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(Refused::Arguments(format!(
            "run {id} exists but could not be read back"
        )))
    }

    /// The run once it is finished or paused, or as it is when `self.wait` has passed
    /// or `stop` fired (the agent gave up; the run goes on).
    pub async fn settle(
        &self,
        run: Run,
        stop: &CancellationToken,
    ) -> Result<Run, flow_ledger::Error> {
        let deadline = tokio::time::Instant::now() + self.wait;
        // A run this process executes wakes the wait when it ends (subscribed before the
        // first read: no end is missed); one executed elsewhere is polled, backing off.
        let mut settled = self.ledger.runs_settled_here();
        let mut run = self.ledger.get_run(&run.id).await?;
        let mut pause = Duration::from_millis(10);
        while !(run.status.is_terminal() || run.status == RunStatus::Paused) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::select! {
                changed = settled.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(pause.min(left)).await;
                    }
                }
                () = tokio::time::sleep(pause.min(left)) => {
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                () = stop.cancelled() => break,
            }
            run = self.ledger.get_run(&run.id).await?;
        }
        Ok(run)
    }

    /// Whether `run` is a proxied call (`super::proxy`): its workflow is named after the
    /// proxied tool.
    fn is_proxied(&self, run: &Run) -> bool {
        self.catalog
            .get(&run.workflow_name)
            .is_some_and(|e| e.proxied)
    }

    /// What the agent is told about `run`: its output, or what it fails or waits on
    /// and what to do, with the run id in `structuredContent` and `_meta`.
    pub async fn answer(&self, run: &Run, coalesced: bool) -> CallToolResult {
        let shape = match run.status {
            RunStatus::Succeeded => {
                let mut out = run.output.clone().unwrap_or_else(|| json!({}));
                // A proxied call answers with its one node's output: the server's.
                if self.is_proxied(run) {
                    out = out.get(super::proxy::NODE).cloned().unwrap_or(Json::Null);
                }
                let text = serde_json::to_string(&out).unwrap_or_default();
                return finish(
                    run,
                    coalesced,
                    Shape::ok("succeeded", text).with("output", out),
                );
            }
            RunStatus::Failed => Shape::error(
                "failed",
                format!(
                    "run {} failed: {}. flow does not run it again by itself; an operator can redrive it (`flow redrive {}`).",
                    run.id,
                    run.error.as_deref().unwrap_or("no reason recorded"),
                    run.id
                ),
            ),
            RunStatus::Cancelled => Shape::error(
                "cancelled",
                format!("run {} was cancelled by an operator.", run.id),
            ),
            RunStatus::Queued | RunStatus::Running => Shape::ok(
                "running",
                format!(
                    "run {} is still running after {}. Call `{}` with run_id \"{}\" for its result (calling this tool again starts another run unless it carries the same `_meta` \"io.flow/idempotency-key\").",
                    run.id,
                    crate::duration_text::duration(self.wait),
                    STATUS_TOOL,
                    run.id
                ),
            ),
            RunStatus::Paused => return self.paused(run, coalesced).await,
        };
        let shape = match &run.error {
            Some(e) => shape.with("error", json!(e)),
            None => shape,
        };
        finish(run, coalesced, shape)
    }

    /// A paused run: a call in doubt (an operator resolves it; never a retry), an
    /// approval (a person decides; never this agent), or an event or callback.
    async fn paused(&self, run: &Run, coalesced: bool) -> CallToolResult {
        let view = match RunView::load(&self.ledger, &run.id).await {
            Ok(v) => v,
            Err(e) => {
                let text = format!(
                    "run {} is paused; its details could not be read: {e}",
                    run.id
                );
                return finish(run, coalesced, Shape::error("waiting", text));
            }
        };
        if let Some(c) = view
            .tool_calls
            .iter()
            .find(|c| c.status == CallStatus::InDoubt)
        {
            let what = if self.is_proxied(run) {
                format!("the call to `{}`", run.workflow_name)
            } else {
                format!("node `{}` (tool `{}`)", c.node, c.tool)
            };
            let text = format!(
                "the outcome of {what} is unknown: the request may or may not have taken effect. flow will not send it again; an operator is resolving run {}. Do not retry this call: calling again answers from the same run.",
                run.id
            );
            let shape = Shape::error("in_doubt", text)
                .with("waiting_for", json!({"kind": "resolution", "node": c.node}));
            return finish(run, coalesced, shape);
        }
        let place = self
            .public_url
            .as_deref()
            .map(|u| format!("{}/ui/runs/{}", u.trim_end_matches('/'), run.id));
        if let Some(a) = view
            .approvals
            .iter()
            .find(|a| a.status == flow_ledger::ApprovalStatus::Pending)
        {
            let who = approvers(&a.roles, &a.tokens);
            let at = place
                .as_deref()
                .map(|p| format!(" at {p}"))
                .unwrap_or_default();
            let text = format!(
                "run {} waits for {who} to approve node `{}`{}{at} (or `flow approve {} {}`). You cannot approve it: the caller that started a run never decides its approvals. Once decided, call `{}` with run_id \"{}\" for the result (calling this tool again starts another run unless it carries the same `_meta` \"io.flow/idempotency-key\").",
                run.id,
                a.node,
                a.message
                    .as_deref()
                    .map(|m| format!(" (\"{m}\")"))
                    .unwrap_or_default(),
                run.id,
                a.node,
                STATUS_TOOL,
                run.id
            );
            let waiting = json!({
                "kind": "approval", "node": a.node, "roles": a.roles, "tokens": a.tokens,
                "still_needed": a.still_needed, "deadline": a.deadline, "where": place,
            });
            return finish(
                run,
                coalesced,
                Shape::ok("waiting", text).with("waiting_for", waiting),
            );
        }
        let (kind, node) = view
            .waits
            .iter()
            .find(|w| w.status == flow_ledger::WaitStatus::Pending)
            .map_or(("operator", None), |w| {
                (w.kind.as_str(), Some(w.node.clone()))
            });
        let text = format!(
            "run {} is paused, waiting for {} ({}). Call `{}` with run_id \"{}\" later for its result.",
            run.id,
            node.as_deref()
                .map_or_else(|| "an operator".to_owned(), |n| format!("node `{n}`")),
            run.pause_reason.as_deref().unwrap_or(kind),
            STATUS_TOOL,
            run.id
        );
        let shape = Shape::ok("waiting", text).with(
            "waiting_for",
            json!({"kind": kind, "node": node, "where": place}),
        );
        finish(run, coalesced, shape)
    }
}

/// Who may approve, in words.
fn approvers(roles: &[String], tokens: &[String]) -> String {
    let mut who = Vec::new();
    if !roles.is_empty() {
        who.push(format!("a person with role {}", roles.join(" or ")));
    }
    if !tokens.is_empty() {
        who.push(format!("token {}", tokens.join(" or ")));
    }
    if who.is_empty() {
        "an operator".to_owned()
    } else {
        who.join(" or ")
    }
}

/// An answer being built: its status, whether it is an error, its text and the fields
/// of `structuredContent` beyond `run_id` and `status`.
struct Shape {
    status: &'static str,
    error: bool,
    text: String,
    fields: Vec<(&'static str, Json)>,
}

impl Shape {
    fn ok(status: &'static str, text: String) -> Self {
        Self {
            status,
            error: false,
            text,
            fields: Vec::new(),
        }
    }

    fn error(status: &'static str, text: String) -> Self {
        Self {
            error: true,
            ..Self::ok(status, text)
        }
    }

    fn with(mut self, key: &'static str, value: Json) -> Self {
        self.fields.push((key, value));
        self
    }
}

/// The result: the text, `structuredContent` `{run_id, status, …}`, `_meta` with the
/// run id and whether the call joined an earlier one.
fn finish(run: &Run, coalesced: bool, shape: Shape) -> CallToolResult {
    let mut structured = serde_json::Map::new();
    structured.insert("run_id".into(), json!(run.id));
    structured.insert("status".into(), json!(shape.status));
    for (k, v) in shape.fields {
        structured.insert(k.into(), v);
    }
    let mut result = if shape.error {
        CallToolResult::error(vec![ContentBlock::text(shape.text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(shape.text)])
    };
    result.structured_content = Some(Json::Object(structured));
    let mut meta = MetaObject::new();
    meta.insert(RUN_META.into(), json!(run.id));
    meta.insert(COALESCED_META.into(), json!(coalesced));
    result.meta = Some(meta);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_one_run_per_caller_and_tool() {
        let a = run_id_for_key("agent", "refund", "k1");
        assert_eq!(a, run_id_for_key("agent", "refund", "k1"));
        assert_ne!(a, run_id_for_key("other", "refund", "k1"));
        assert_ne!(a, run_id_for_key("agent", "refund2", "k1"));
        assert_ne!(a, run_id_for_key("agent", "refund", "k2"));
        // Length-prefixed parts: moving text between parts changes the id.
        assert_ne!(
            run_id_for_key("ab", "c", "k"),
            run_id_for_key("a", "bc", "k")
        );
        flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, &a).expect("a valid run id");
        let w = run_id_in_window("agent", "refund", "h", 123_456);
        flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, &w).expect("a valid run id");
    }
}

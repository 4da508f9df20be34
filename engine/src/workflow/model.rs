//! The workflow model: what a valid workflow file means, after validation.
//!
//! Everything here is already checked: ids are legal, references resolve, durations and
//! counts are in range, expressions parse. The executor never re-validates.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::diagnostic::Pos;
use super::expr::{TValue, Template};
use super::tool::ToolDecl;

/// Default per-attempt timeout when neither node, tool nor workflow defaults set one: no
/// request is ever sent without a timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `max_parallel`: enough for fan-outs of network calls, bounded so a 1,000-way
/// fan-out does not open 1,000 sockets at once.
pub const DEFAULT_MAX_PARALLEL: u32 = 8;

/// A validated workflow.
#[derive(Debug, Clone)]
pub struct Workflow {
    /// `name:` or, when absent, the file stem.
    pub name: String,
    /// `description:`.
    pub description: Option<String>,
    /// Declared inputs, in file order.
    pub inputs: Vec<InputDecl>,
    /// Workflow-wide defaults for nodes.
    pub defaults: Defaults,
    /// Most nodes running at once in one run.
    pub max_parallel: u32,
    /// Tools by name.
    pub tools: BTreeMap<String, ToolDecl>,
    /// Nodes in file order; [`crate::plan::Plan`] indexes them by position.
    pub nodes: Vec<NodeDecl>,
    /// `included:`: the sub-workflows' files carried in the text (path as a `workflow:`
    /// names it → that file's text, itself carrying its own). flow appends it when it
    /// stores a run of a workflow with sub-workflows, so the stored text is whole: a
    /// daemon on another host, or a resume after the files changed, runs what was
    /// submitted.
    pub included: BTreeMap<String, String>,
    /// `schedules:`: when this workflow should run by itself. Stored (and then fired by
    /// every daemon) with `flow schedules apply FILE`; `flow run` ignores them.
    pub schedules: Vec<WorkflowSchedule>,
}

/// One `schedules:` item, checked.
#[derive(Debug, Clone)]
pub struct WorkflowSchedule {
    /// Where it is in the file.
    pub at: Pos,
    /// Its fields (id, cron, time zone, inputs, overlap, catch-up window).
    pub fields: super::schedule_fields::Fields,
}

impl Workflow {
    /// The node with this id.
    pub fn node(&self, id: &str) -> Option<&NodeDecl> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Each node id's position in `nodes`: validation and the executor address nodes by
    /// position, and look an id up once per reference rather than scan the list.
    pub fn node_positions(&self) -> HashMap<&str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect()
    }

    /// The input declaration with this name.
    pub fn input(&self, name: &str) -> Option<&InputDecl> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The effective retry policy of a node: its own, else the workflow default, else none.
    pub fn retry_policy(&self, node: &NodeDecl) -> RetryPolicy {
        node.retry_policy
            .clone()
            .or_else(|| self.defaults.retry_policy.clone())
            .unwrap_or_default()
    }

    /// The per-attempt timeout of a node: node, then tool, then workflow default, then 30 s.
    pub fn timeout(&self, node: &NodeDecl) -> Duration {
        node.timeout
            .or_else(|| self.tool_of(node).and_then(|t| t.timeout))
            .or(self.defaults.timeout)
            .unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Every secret name the run may read: in any node's `with`, `if` and
    /// `idempotency_key`, and in the spec of every tool a node uses. `flow run` and
    /// `flow resume` check them all before anything is claimed, so a missing one stops
    /// the run before an earlier node sends a request.
    pub fn secret_names(&self) -> Vec<String> {
        let mut templates: Vec<&Template> = Vec::new();
        for node in &self.nodes {
            templates.extend(node.with.templates());
            templates.extend(node.condition.iter());
            templates.extend(node.idempotency_key.iter());
            if let Some(tool) = self.tool_of(node) {
                templates.extend(tool.kind.templates());
                if let Some(r) = &tool.reconcile {
                    templates.extend(r.request_templates());
                }
            }
        }
        super::expr::secret_names(templates)
    }

    /// The tool a call node calls (`None` for the kinds that call none).
    pub fn tool_of(&self, node: &NodeDecl) -> Option<&ToolDecl> {
        node.tool().and_then(|t| self.tools.get(t))
    }

    /// The whole-node deadline (all attempts and backoff), if any.
    pub fn deadline(&self, node: &NodeDecl) -> Option<Duration> {
        node.deadline.or(self.defaults.deadline)
    }
}

/// The JSON type an input must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    /// A JSON string.
    String,
    /// A whole number.
    Integer,
    /// Any JSON number.
    Number,
    /// `true` / `false`.
    Boolean,
    /// A JSON object.
    Object,
    /// A JSON array.
    Array,
}

impl InputType {
    /// Every type name accepted in `type:`.
    pub const NAMES: [&'static str; 6] =
        ["string", "integer", "number", "boolean", "object", "array"];

    /// Parses a `type:` value.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "boolean" => Self::Boolean,
            "object" => Self::Object,
            "array" => Self::Array,
            _ => return None,
        })
    }

    /// The name used in files and messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Boolean => "boolean",
            Self::Object => "object",
            Self::Array => "array",
        }
    }

    /// Whether a JSON value has this type.
    pub fn accepts(self, value: &serde_json::Value) -> bool {
        use serde_json::Value as J;
        match self {
            Self::String => value.is_string(),
            Self::Integer => value.is_i64() || value.is_u64(),
            Self::Number => value.is_number(),
            Self::Boolean => value.is_boolean(),
            Self::Object => matches!(value, J::Object(_)),
            Self::Array => matches!(value, J::Array(_)),
        }
    }
}

/// One declared input.
#[derive(Debug, Clone)]
pub struct InputDecl {
    /// The input's name, as used in `${{ inputs.<name> }}`.
    pub name: String,
    /// Its type.
    pub ty: InputType,
    /// Whether a run must supply it (when it has no default).
    pub required: bool,
    /// Value used when the run does not supply one.
    pub default: Option<serde_json::Value>,
    /// Free text for humans.
    pub description: Option<String>,
}

/// Workflow-wide defaults that nodes inherit.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    /// Per-attempt timeout.
    pub timeout: Option<Duration>,
    /// Whole-node deadline (every attempt and backoff).
    pub deadline: Option<Duration>,
    /// Node retry policy.
    pub retry_policy: Option<RetryPolicy>,
}

/// How a node is retried: plain data; the delay maths lives in [`crate::retry`].
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt: `max_retries: 2` means at most 3 steps.
    pub max_retries: u32,
    /// Delay before retry 1.
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
    /// Growth factor per retry.
    pub multiplier: f64,
    /// Fraction of each delay drawn at random (0 = none, 1 = anywhere in `[0, delay]`).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 0,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

/// A node of the DAG.
#[derive(Debug, Clone)]
pub struct NodeDecl {
    /// The node id (`[a-z0-9_-]+`).
    pub id: String,
    /// Where the node is declared.
    pub pos: Pos,
    /// Nodes that must finish first.
    pub needs: Vec<String>,
    /// Where each `needs` entry is written (same order as `needs`).
    pub needs_pos: Vec<Pos>,
    /// Arguments (templated).
    pub with: TValue,
    /// Condition; a false condition skips the node and its dependents. Always exactly one
    /// expression (`Template::whole_expr` is `Some`): parsing turns `if: false`, a bare
    /// string and `"${{ x }} "` into one, so the condition is evaluated, never taken as a
    /// non-empty (true) string.
    pub condition: Option<Template>,
    /// Where `if:` is written.
    pub condition_pos: Option<Pos>,
    /// Node-level retry policy.
    pub retry_policy: Option<RetryPolicy>,
    /// Per-attempt timeout.
    pub timeout: Option<Duration>,
    /// Whole-node deadline.
    pub deadline: Option<Duration>,
    /// Idempotency key template (default `<run_id>:<node>`).
    pub idempotency_key: Option<Template>,
    /// Whether the run goes on (and dependents run) when this node fails.
    pub continue_on_error: bool,
    /// Free text for humans.
    pub description: Option<String>,
    /// The node runs once per item of a list (`for_each:`), each item a step of its own.
    pub for_each: Option<ForEachDecl>,
    /// What the node is: a call of a tool, a wait for an event, or a child run. Only
    /// what its kind allows can be written down: a wait with a tool or a child with an
    /// approval is refused by the parser and cannot be represented here.
    pub kind: NodeKind,
}

/// What a node does when it runs.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// It calls a tool (`tool:`), perhaps behind an approval, perhaps then waiting for
    /// a callback: the only kind that crosses the gateway.
    Call(CallDecl),
    /// It calls no tool: it waits for a published event (`wait:`).
    Wait(WaitDecl),
    /// It calls no tool: it runs another workflow as a run of its own (`workflow:`),
    /// whose output is the node's.
    Child(ChildDecl),
}

/// A call node's tool and what guards or follows its call.
#[derive(Debug, Clone)]
pub struct CallDecl {
    /// The tool it calls (a key of the workflow's `tools`).
    pub tool: String,
    /// Where `tool:` is written.
    pub tool_pos: Pos,
    /// People must approve the call before it leaves (`approval:`).
    pub approval: Option<ApprovalDecl>,
    /// After its call succeeds the node waits for a callback to a token it handed the
    /// downstream (`callback:`); its output is the callback's.
    pub callback: Option<CallbackDecl>,
}

/// The tool name a wait node's steps are recorded under (they call none).
pub const WAIT_STEP_TOOL: &str = "wait";
/// The tool name a sub-workflow node's steps are recorded under (they call none).
pub const CHILD_STEP_TOOL: &str = "workflow";

impl NodeDecl {
    /// The call this node makes, if it is a call node.
    pub fn call(&self) -> Option<&CallDecl> {
        match &self.kind {
            NodeKind::Call(c) => Some(c),
            _ => None,
        }
    }

    /// The tool this node calls, if it is a call node.
    pub fn tool(&self) -> Option<&str> {
        self.call().map(|c| c.tool.as_str())
    }

    /// What the node's steps are recorded as calling: its tool, or `wait` / `workflow`
    /// for the kinds that call none (the name the ledger, `flow show` and the console
    /// have always shown).
    pub fn step_tool(&self) -> &str {
        match &self.kind {
            NodeKind::Call(c) => &c.tool,
            NodeKind::Wait(_) => WAIT_STEP_TOOL,
            NodeKind::Child(_) => CHILD_STEP_TOOL,
        }
    }

    /// The node's `approval:`, if it is a call node that has one.
    pub fn approval(&self) -> Option<&ApprovalDecl> {
        self.call().and_then(|c| c.approval.as_ref())
    }

    /// The node's `callback:`, if it is a call node that has one.
    pub fn callback(&self) -> Option<&CallbackDecl> {
        self.call().and_then(|c| c.callback.as_ref())
    }

    /// The node's `wait:`, if it is a wait node.
    pub fn wait(&self) -> Option<&WaitDecl> {
        match &self.kind {
            NodeKind::Wait(w) => Some(w),
            _ => None,
        }
    }

    /// The node's `workflow:`, if it is a sub-workflow node.
    pub fn child(&self) -> Option<&ChildDecl> {
        match &self.kind {
            NodeKind::Child(c) => Some(c),
            _ => None,
        }
    }
}

/// A sub-workflow node's `workflow:`: the child workflow it runs, each time as a run of
/// its own (README, "Sub-workflows"). The child's inputs are the node's `with`.
#[derive(Debug, Clone)]
pub struct ChildDecl {
    /// Where `workflow:` is written.
    pub pos: Pos,
    /// The child's file, relative to the file that names it.
    pub path: String,
    /// What a cancel of the parent run does to the child (`on_parent_cancel:`).
    pub on_parent_cancel: flow_ledger::OnParentCancel,
}

/// Default `for_each.max_items`: a list longer than this fails the node before anything
/// is sent (a list that long by accident is a bug upstream, not a mailing).
pub const DEFAULT_MAX_ITEMS: u32 = 10_000;
/// Largest `for_each.max_items` a file may declare.
pub const MAX_MAX_ITEMS: u32 = 1_000_000;

/// `for_each:` on a node: its call is made once per item of `items`, under a key that is
/// the item's identity (README, "Fan-out: for_each"). Each item is a step `node[<key>]`
/// whose call key is `<run>:node[<key>]`, so re-evaluating or reordering the list never
/// changes what an item is sent under.
#[derive(Debug, Clone)]
pub struct ForEachDecl {
    /// Where `for_each:` is written.
    pub pos: Pos,
    /// The list: one expression (or a literal list) over `inputs`, `nodes` and `run`.
    pub items: TValue,
    /// The item's identity: one expression over `item` (a string or a number).
    pub key: Template,
    /// Longest list accepted.
    pub max_items: u32,
    /// Items in flight at once (`None` = the run's `max_parallel`, which also bounds it).
    pub concurrency: Option<u32>,
    /// Failed items the node tolerates before it fails.
    pub tolerate: Tolerance,
}

/// How many failed items a `for_each` node tolerates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// At most this many.
    Count(u32),
    /// At most this share of the list, in percent (rounded down to whole items).
    Percent(f64),
}

impl Tolerance {
    /// The most failed items tolerated in a list of `n`.
    pub fn allowed(self, n: usize) -> usize {
        match self {
            Self::Count(c) => c as usize,
            Self::Percent(p) => ((n as f64) * p / 100.0).floor() as usize,
        }
    }
}

/// `wait:` on a node: it completes when an event its `match` accepts is published
/// (README, "Waits and callbacks").
#[derive(Debug, Clone)]
pub struct WaitDecl {
    /// Where `wait:` is written.
    pub pos: Pos,
    /// The event's name.
    pub event: String,
    /// Which events of that name count: one expression over `event` (the event's
    /// data), `inputs`, `nodes` and `run`; `None` = any.
    pub matcher: Option<Template>,
    /// How long before the wait began a published event still counts.
    pub lookback: Duration,
    /// How long it may wait (required).
    pub timeout: Duration,
    /// What a timeout does.
    pub on_timeout: OnTimeout,
}

/// `callback:` on a node with a tool: its call carries `${{ callback.url }}` (or
/// `callback.token`), and the node completes when that URL is called.
#[derive(Debug, Clone)]
pub struct CallbackDecl {
    /// Where `callback:` is written.
    pub pos: Pos,
    /// How long it may wait after the call (required).
    pub timeout: Duration,
    /// Each heartbeat must come within this long of the previous one (or of the start).
    pub heartbeat: Option<Duration>,
    /// What a timeout does.
    pub on_timeout: OnTimeout,
}

/// `approval:` on a node: who must approve its call, with what, within how long. The
/// gateway freezes the rendered request and its digest, and sends only that request once
/// approved (README, "Approvals").
#[derive(Debug, Clone)]
pub struct ApprovalDecl {
    /// Where `approval:` is written.
    pub pos: Pos,
    /// What approvers read (templated like `with`, no secrets).
    pub message: Option<Template>,
    /// Roles whose tokens may approve (`viewer` never may); empty with `tokens` empty
    /// means any operator or admin.
    pub roles: Vec<String>,
    /// Token names that may approve.
    pub tokens: Vec<String>,
    /// Distinct approvers needed (at least 1).
    pub min: u32,
    /// Whether the token that submitted the run is refused as an approver.
    pub forbid_self: bool,
    /// What approvers must give, typed and checked like run inputs.
    pub inputs: Vec<InputDecl>,
    /// How long it may wait (required).
    pub timeout: Duration,
    /// What a timeout does (it never approves).
    pub on_timeout: OnTimeout,
    /// When to remind (offsets from the request), each an `approval.reminder` event.
    pub remind: Vec<Duration>,
}

/// What an approval's timeout does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// The node fails (permanently: no retry re-asks).
    Fail,
    /// The node is skipped (and its dependents, as any skip).
    Skip,
}

impl OnTimeout {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

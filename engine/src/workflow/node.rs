//! A workflow's nodes: what each one is (a call, a wait, a child run) and the options
//! every kind shares (`needs`, `if`, `for_each`, retries, deadlines).
//!
//! The kind is in the type so the executor and the gateway never guess it from which
//! options happen to be set: the executor runs waits and child runs itself and hands
//! the gateway only calls, each with its tool.

use std::time::Duration;

use super::diagnostic::Pos;
use super::expr::{TValue, Template};
use super::model::{InputDecl, RetryPolicy};

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

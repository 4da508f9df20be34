//! A run as readers see it: [`RunSummary`] in a listing, [`RunView`] whole (what
//! `flow show --json`, `GET /api/v1/runs/{id}` and the console's run page are made of).

use flow_ledger::{Event, EventFilter, Ledger, Run, RunStatus, Step, StepStatus};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value as Json;

use super::{AuditEntry, CallView, ErrorView, ProbeView};
use flow_ledger::Timestamp;

/// A run in a listing (`flow runs --json`, `GET /api/v1/runs`, the console's list).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunSummary {
    /// The run id.
    pub id: String,
    /// Where the run is in its life.
    pub status: RunStatus,
    /// The workflow's `name:`.
    pub workflow: String,
    /// When it was queued.
    pub created_at: Timestamp,
    /// When a worker first started it.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// Why it failed, or why it is paused.
    pub error: Option<String>,
    /// The run whose sub-workflow node started this one (a child run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentView>,
}

/// Where a child run came from: its parent run and the parent's step it is the child of.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ParentView {
    /// The parent run.
    pub run: String,
    /// The parent's step (`node`, or `node[<key>]` for an item).
    pub step: String,
}

/// A run's children (the runs its sub-workflow nodes started), by id.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct ChildrenView {
    /// The first [`CHILDREN_LISTED`] children, by id.
    pub runs: Vec<RunSummary>,
    /// Whether it has more (`flow runs --parent <run>` lists them all).
    pub more: bool,
}

/// How many children a [`RunView`] lists.
pub const CHILDREN_LISTED: u32 = 100;

impl RunSummary {
    /// The summary of `r`.
    pub fn of(r: &Run) -> RunSummary {
        RunSummary {
            id: r.id.clone(),
            status: r.status,
            workflow: r.workflow_name.clone(),
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            error: r.error.clone().or_else(|| r.pause_reason.clone()),
            parent: r.parent.as_ref().map(|p| ParentView {
                run: p.run_id.clone(),
                step: p.step_id.clone(),
            }),
        }
    }
}

/// The `run` member of a [`RunView`]: the summary, with inputs and output.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunInfo {
    /// What a listing shows.
    #[serde(flatten)]
    pub summary: RunSummary,
    /// The run's inputs, as typed by the workflow's declarations.
    pub inputs: Json,
    /// The run's output, once it succeeded.
    pub output: Option<Json>,
}

/// A node of the workflow, in plan order: what it needs, its tool and where it is.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NodeView {
    /// The node id.
    pub id: String,
    /// The nodes it waits for.
    pub needs: Vec<String>,
    /// Its tool (empty for a node the stored workflow no longer names).
    pub tool: String,
    /// Its last step's state (`null`: not started; a `for_each` node whose items run
    /// and that has no step of its own yet: `running`).
    pub status: Option<StepStatus>,
    /// A `for_each` node's items, grouped (their steps are not in the run's `steps`).
    pub items: Option<super::ItemsView>,
}

/// One step: one attempt of a node (`<node>`, then `<node>_retry<n>`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepView {
    /// The step id.
    pub id: String,
    /// Its node.
    pub node: String,
    /// Which retry (0: the first attempt).
    pub retry: u32,
    /// Its state.
    pub status: StepStatus,
    /// A pending retry's earliest start.
    pub not_before: Option<Timestamp>,
    /// When it started.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// Why it failed.
    pub error: Option<ErrorView>,
    /// Deprecated (one release): `id`.
    #[schemars(extend("deprecated" = true))]
    pub step_id: String,
    /// Deprecated (one release): `node`.
    #[schemars(extend("deprecated" = true))]
    pub node_id: String,
}

impl StepView {
    /// The view of `s`.
    pub fn of(s: &Step) -> StepView {
        StepView {
            id: s.step_id.clone(),
            node: s.node_id.clone(),
            retry: s.retry,
            status: s.status,
            not_before: s.not_before,
            started_at: s.started_at,
            finished_at: s.finished_at,
            error: ErrorView::of(s.error_kind, s.error_message.as_ref()),
            step_id: s.step_id.clone(),
            node_id: s.node_id.clone(),
        }
    }
}

/// A run whole: the one object `flow show --json`, `GET /api/v1/runs/{id}` (and every
/// answer to a change of one run) and the console's run page are made of.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunView {
    /// The run.
    pub run: RunInfo,
    /// Its nodes in plan order (then any the stored workflow does not name).
    pub nodes: Vec<NodeView>,
    /// Its steps, in creation order (a `for_each` node's items are in its node's
    /// `items`).
    pub steps: Vec<StepView>,
    /// Its tool calls (of a `for_each` node's items, those that did not succeed).
    pub tool_calls: Vec<CallView>,
    /// Every probe of its calls, oldest first.
    pub probes: Vec<ProbeView>,
    /// Who changed it by hand, when and why, oldest first.
    pub audit: Vec<AuditEntry>,
    /// Its nodes' approvals (`approval:`), pending and decided, oldest first.
    pub approvals: Vec<super::ApprovalView>,
    /// Its nodes' waits (`wait:`, `callback:`), pending and settled.
    pub waits: Vec<super::WaitView>,
    /// The runs its sub-workflow nodes started.
    pub children: ChildrenView,
}

impl RunView {
    /// Reads run `run_id` whole (`NotFound` when there is none).
    pub async fn load(ledger: &Ledger, run_id: &str) -> Result<RunView, flow_ledger::Error> {
        let run = ledger.get_run(run_id).await?;
        let steps = steps_as_seen(ledger, run_id).await?;
        let calls = ledger.list_calls(run_id).await?;
        let probes = ledger.list_probes(run_id).await?;
        let events = run_events(ledger, run_id).await?;
        let approvals = ledger
            .list_approvals(flow_ledger::ApprovalFilter {
                run_id: Some(run_id.to_owned()),
                status: None,
                limit: 1000,
                // As of now: one past its deadline shows as timed out, not waiting.
                as_of: Some(flow_ledger::Clock::now(&flow_ledger::SystemClock)),
            })
            .await?;
        let waits = ledger
            .list_waits(flow_ledger::WaitFilter {
                run_id: Some(run_id.to_owned()),
                status: None,
                limit: 1000,
            })
            .await?;
        let wf = crate::snapshot::snapshot(&run).ok();
        let children = children(ledger, run_id).await?;
        let fans: Vec<&str> = wf
            .iter()
            .flat_map(|wf| &wf.nodes)
            .filter(|n| n.for_each.is_some())
            .map(|n| n.id.as_str())
            .collect();
        let mut totals = Vec::with_capacity(fans.len());
        for node in &fans {
            let stored = ledger.get_fanout(run_id, node).await?;
            totals.push(stored.map(|f| f.keys.len() + f.vanished.len()));
        }
        let is_item = |s: &Step| fans.iter().any(|n| super::items::item_key(n, s).is_some());
        let item_call = |id: &str| fans.iter().any(|n| crate::item_id::is_item_of(n, id));
        Ok(RunView {
            approvals: approvals.iter().map(super::ApprovalView::of).collect(),
            waits: waits.iter().map(super::WaitView::of).collect(),
            nodes: nodes(wf.as_ref(), &steps, &totals),
            steps: steps
                .iter()
                .filter(|s| !is_item(s))
                .map(StepView::of)
                .collect(),
            tool_calls: calls
                .iter()
                .filter(|c| {
                    !(item_call(&c.tool_call_id) && c.status == flow_ledger::CallStatus::Succeeded)
                })
                .map(|c| CallView::of(c, &events))
                .collect(),
            probes: probes.iter().map(ProbeView::of).collect(),
            audit: AuditEntry::trail(&events),
            children,
            run: RunInfo {
                summary: RunSummary::of(&run),
                inputs: run.inputs,
                output: run.output,
            },
        })
    }

    /// The approvals still waiting for a decision.
    pub fn awaiting_approval(&self) -> impl Iterator<Item = &super::ApprovalView> {
        self.approvals
            .iter()
            .filter(|a| a.status == flow_ledger::ApprovalStatus::Pending)
    }

    /// The calls in doubt.
    pub fn in_doubt(&self) -> impl Iterator<Item = &CallView> {
        self.tool_calls
            .iter()
            .filter(|c| c.status == flow_ledger::CallStatus::InDoubt)
    }
}

/// The steps of `run_id` as a reader should see them: a step still `running` in the
/// ledger while the child run it waits for is paused (a call in doubt, an approval) is
/// shown `paused` — the node waits for a person, not for work, as its child does.
pub async fn steps_as_seen(ledger: &Ledger, run_id: &str) -> Result<Vec<Step>, flow_ledger::Error> {
    let mut steps = ledger.list_steps(run_id).await?;
    if !steps.iter().any(|s| s.status == StepStatus::Running) {
        return Ok(steps);
    }
    let paused = ledger
        .list_runs(flow_ledger::RunFilter {
            parent: Some(run_id.to_string()),
            status: Some(flow_ledger::RunStatus::Paused),
            limit: 10_000,
            ..Default::default()
        })
        .await?;
    let waiting: std::collections::HashSet<&str> = paused
        .iter()
        .filter_map(|r| r.parent.as_ref())
        .map(|p| p.step_id.as_str())
        .collect();
    for s in &mut steps {
        if s.status == StepStatus::Running && waiting.contains(s.step_id.as_str()) {
            s.status = StepStatus::Paused;
        }
    }
    Ok(steps)
}

/// The first [`CHILDREN_LISTED`] children of `run_id`.
pub async fn children(ledger: &Ledger, run_id: &str) -> Result<ChildrenView, flow_ledger::Error> {
    let filter = flow_ledger::RunFilter {
        parent: Some(run_id.to_string()),
        limit: CHILDREN_LISTED + 1,
        ..Default::default()
    };
    let mut runs = ledger.list_runs(filter).await?;
    let more = runs.len() > CHILDREN_LISTED as usize;
    runs.truncate(CHILDREN_LISTED as usize);
    runs.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(ChildrenView {
        runs: runs.iter().map(RunSummary::of).collect(),
        more,
    })
}

/// The run's events, oldest first (the audit trail, elicitations and in-doubt reasons
/// are read from them: one query for all).
async fn run_events(ledger: &Ledger, run_id: &str) -> Result<Vec<Event>, flow_ledger::Error> {
    ledger
        .list_events(EventFilter {
            run_id: Some(run_id.to_string()),
            ..Default::default()
        })
        .await
}

/// The run's nodes in plan order (from its stored workflow), then any node a step names
/// that the workflow does not, each with its last step's state.
fn nodes(
    wf: Option<&crate::workflow::ValidWorkflow>,
    steps: &[Step],
    totals: &[Option<usize>],
) -> Vec<NodeView> {
    let mut out: Vec<NodeView> = match wf {
        Some(wf) => wf
            .plan()
            .order()
            .iter()
            .map(|&i| {
                let n = &wf.nodes[i];
                NodeView {
                    id: n.id.clone(),
                    needs: n.needs.clone(),
                    // A `wait:` node calls no tool; its steps name the built-in `wait`
                    // (a sub-workflow node's, `workflow`).
                    tool: n.step_tool().to_owned(),
                    status: None,
                    items: None,
                }
            })
            .collect(),
        None => Vec::new(),
    };
    let fans: Vec<&str> = wf
        .iter()
        .flat_map(|wf| &wf.nodes)
        .filter(|n| n.for_each.is_some())
        .map(|n| n.id.as_str())
        .collect();
    for (node, total) in fans.iter().zip(totals) {
        if let Some(n) = out.iter_mut().find(|n| n.id == *node) {
            let items = super::ItemsView::of(node, steps, *total);
            if items.total.is_some() {
                // Items in doubt and none running: the node waits for a person.
                let held = items.in_doubt > 0 && items.running == 0;
                n.status = Some(if held {
                    StepStatus::Paused
                } else {
                    StepStatus::Running
                });
            }
            n.items = Some(items);
        }
    }
    for s in steps {
        if fans.iter().any(|n| super::items::item_key(n, s).is_some()) {
            continue;
        }
        match out.iter_mut().find(|n| n.id == s.node_id) {
            Some(n) => n.status = Some(s.status),
            None => out.push(NodeView {
                id: s.node_id.clone(),
                needs: Vec::new(),
                tool: String::new(),
                status: Some(s.status),
                items: None,
            }),
        }
    }
    out
}

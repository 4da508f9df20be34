//! An approval as readers see it ([`ApprovalView`]): `flow approvals`, `flow show`,
//! the API's approvals inbox and the console's.

use flow_ledger::{Approval, ApprovalStatus, ApprovalVote, Timestamp};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value as Json;

use crate::approval::rule_strings;

/// One approval: the request awaiting (or given) approval with its digest, what it
/// takes, who approved so far and what is still needed, and its deadline.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalView {
    /// The run.
    pub run: String,
    /// The node whose call awaits approval.
    pub node: String,
    /// The step that asked.
    pub step: String,
    /// The node's tool.
    pub tool: String,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// The rendered message for approvers.
    pub message: Option<String>,
    /// The request exactly as it will be sent, secrets as `{"$secret": "NAME"}`.
    pub request: Json,
    /// The request's SHA-256 digest: an approval binds to it (pass it back to be sure
    /// you approve what you saw).
    pub digest: String,
    /// Roles whose tokens may approve (empty with `tokens` empty: any operator).
    pub roles: Vec<String>,
    /// Token names that may approve.
    pub tokens: Vec<String>,
    /// Distinct approvers needed.
    pub min: u32,
    /// Who approved this digest so far.
    pub approved_by: Vec<String>,
    /// How many more approvers are needed (0 once decided).
    pub still_needed: u32,
    /// Whether the run's submitter is refused as an approver.
    pub forbid_self: bool,
    /// Who submitted the run, when known.
    pub submitted_by: Option<String>,
    /// The inputs approvers give (name, type, required, default).
    pub inputs: Json,
    /// What a timeout does: `fail` or `skip`.
    pub on_timeout: String,
    /// When the current request was asked.
    pub requested_at: Timestamp,
    /// When it times out.
    pub deadline: Timestamp,
    /// When it was decided.
    pub decided_at: Option<Timestamp>,
    /// Who decided.
    pub decided_by: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// The deciding approver's inputs (visible to the node's dependents as
    /// `nodes.<id>.approval.inputs`).
    pub decision_inputs: Option<Json>,
    /// Every vote, older digests included (the audit trail).
    pub votes: Vec<ApprovalVote>,
}

impl ApprovalView {
    /// The view of a stored approval.
    pub fn of(a: &Approval) -> Self {
        let approved_by: Vec<String> = a.approvers().into_iter().map(str::to_owned).collect();
        let have = u32::try_from(approved_by.len()).unwrap_or(u32::MAX);
        Self {
            run: a.run_id.clone(),
            node: a.node_id.clone(),
            step: a.step_id.clone(),
            tool: a.tool.clone(),
            status: a.status,
            message: a.message.clone(),
            request: a.request.clone(),
            digest: a.digest.clone(),
            roles: rule_strings(&a.rule, "roles"),
            tokens: rule_strings(&a.rule, "tokens"),
            min: a.min_approvals,
            still_needed: if a.status == ApprovalStatus::Pending {
                a.min_approvals.saturating_sub(have)
            } else {
                0
            },
            approved_by,
            forbid_self: a
                .rule
                .get("forbid_self")
                .and_then(Json::as_bool)
                .unwrap_or(false),
            submitted_by: a.submitted_by.clone(),
            inputs: a.rule.get("inputs").cloned().unwrap_or(Json::Array(vec![])),
            on_timeout: a
                .rule
                .get("on_timeout")
                .and_then(Json::as_str)
                .unwrap_or("fail")
                .to_owned(),
            requested_at: a.requested_at,
            deadline: a.deadline,
            decided_at: a.decided_at,
            decided_by: a.decided_by.clone(),
            reason: a.reason.clone(),
            decision_inputs: a.inputs.clone(),
            votes: a.votes.clone(),
        }
    }
}

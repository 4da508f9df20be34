//! Approvals through the API: the inbox (`GET /api/v1/approvals`) and a decision
//! (`POST /api/v1/runs/{id}/approvals/{node}`), which goes through the same rule and
//! compare-and-set as `flow approve` (`crate::approval::decide`). The token decides: its
//! name is recorded (and refused under `forbid_self` when it submitted the run), its
//! role must be an approver's; a viewer is refused before the body is read.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use flow_ledger::{ApprovalFilter, ApprovalStatus, Decided};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json_};

use super::HoldQuery;
use crate::approval::{self, Decider, Decision, Refusal};
use crate::serve::App;
use crate::serve::auth::{Authed, Operator, Viewer};
use crate::serve::problem::{ApiJson, ApiQuery, Problem};
use crate::view::ApprovalView;

/// Approvals, oldest request first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ApprovalList {
    /// Each with its request, digest, what it takes and who approved so far.
    pub items: Vec<ApprovalView>,
}

/// `GET /api/v1/approvals`: what waits for a decision (or every approval with `all`).
pub async fn list(
    _: Authed<Viewer>,
    State(app): State<Arc<App>>,
    ApiQuery(q): ApiQuery<HoldQuery>,
) -> Result<Response, Problem> {
    let filter = ApprovalFilter {
        run_id: q.run()?,
        status: (!q.all).then_some(ApprovalStatus::Pending),
        limit: q.limit(),
        as_of: Some(app.now()),
    };
    let items = app
        .ledger
        .list_approvals(filter)
        .await
        .map_err(|e| Problem::ledger(&e))?;
    let items = items.iter().map(ApprovalView::of).collect();
    Ok(Json(ApprovalList { items }).into_response())
}

/// Approve or deny.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// A vote: approved once `min` distinct approvers approved this digest.
    Approve,
    /// Nothing is sent; the node fails with the reason.
    Deny,
}

/// The body of `POST /api/v1/runs/{id}/approvals/{node}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// `approve` or `deny`.
    pub(crate) decision: ApprovalDecision,
    /// The inputs the approval declares (an approve's are type-checked).
    #[serde(default)]
    pub(crate) inputs: Map<String, Json_>,
    /// Why (required to deny).
    pub(crate) reason: Option<String>,
    /// The digest of the request you reviewed: 409 if the request changed since.
    pub(crate) digest: Option<String>,
}

/// What became of a decision.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DecisionAnswer {
    /// `approved` (the run goes on and sends exactly this request), `denied`, or
    /// `voted` (more approvers are needed).
    pub outcome: ApprovalOutcome,
    /// The approval after the decision.
    pub approval: ApprovalView,
}

/// What a decision came to.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// The last vote needed: the request may leave.
    Approved,
    /// Denied: nothing is sent.
    Denied,
    /// Counted; more approvers are needed.
    Voted,
}

/// `POST /api/v1/runs/{id}/approvals/{node}`: 200 with what became of it; 403 for a
/// token that is not an approver (or submitted the run under `forbid_self`); 409 when it
/// is already decided (naming the winner), past its deadline (naming it: the approval
/// timed out), the run finished, or the request changed since the digest given; 404
/// when the node has not asked.
pub async fn decide(
    Authed(caller, _): Authed<Operator>,
    State(app): State<Arc<App>>,
    Path((id, node)): Path<(String, String)>,
    ApiJson(body): ApiJson<DecideBody>,
) -> Result<Response, Problem> {
    let approve = matches!(body.decision, ApprovalDecision::Approve);
    if !approve && body.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(Problem::bad_request(
            "a denial needs a `reason`: the node fails with it",
        ));
    }
    let who = Decider {
        name: caller.name.clone(),
        role: caller.role.as_str().to_owned(),
    };
    let d = Decision {
        run: id.clone(),
        node: node.clone(),
        approve,
        inputs: body.inputs,
        reason: body.reason,
        digest: body.digest,
    };
    let decided = crate::approval::decide(&app.ledger, &who, d, app.now())
        .await
        .map_err(|e| refused(e, &id))?;
    let (outcome, a) = match &decided {
        Decided::Approved(a) => (ApprovalOutcome::Approved, a),
        Decided::Denied(a) => (ApprovalOutcome::Denied, a),
        Decided::Voted { approval, .. } => (ApprovalOutcome::Voted, approval),
    };
    let answer = DecisionAnswer {
        outcome,
        approval: ApprovalView::of(a),
    };
    Ok(Json(answer).into_response())
}

/// A refused decision as a problem.
pub(crate) fn refused(e: approval::Error, run: &str) -> Problem {
    use flow_ledger::Error as E;
    match e {
        e @ approval::Error::NotFound { .. } => Problem::not_found(e.to_string()),
        approval::Error::Refused(e @ (Refusal::Decided { .. } | Refusal::PastDeadline { .. })) => {
            Problem::conflict(e.to_string())
        }
        approval::Error::Refused(Refusal::Forbidden(m)) => {
            Problem::new(axum::http::StatusCode::FORBIDDEN, m)
        }
        approval::Error::Refused(e @ Refusal::BadInputs(_)) => Problem::bad_request(e.to_string()),
        approval::Error::Ledger(E::Terminal { status }) => Problem::conflict(format!(
            "run `{run}` is {status}: its approvals can no longer be decided"
        )),
        approval::Error::Ledger(e @ E::Stale { .. }) => Problem::conflict(e.to_string()),
        approval::Error::Ledger(e) => Problem::ledger(&e),
    }
}

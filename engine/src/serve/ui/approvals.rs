//! The Approvals inbox: `GET /ui/approvals` (one card per pending approval: its run,
//! workflow, node, tool, message, the request as it will be sent, its digest, who
//! approved so far, what is still needed, the deadline, and the form) and `POST
//! /ui/approvals/decide` (approve with the declared inputs, or deny with a reason).
//!
//! Deciding takes the one path every way of deciding takes, `crate::approval::decide`,
//! with the signed-in token as the decider: its name is recorded and refused under
//! `forbid_self`, its role must be an approver's, and the ledger's compare-and-set names
//! the winner to whoever lost a race. The form carries the digest it showed, so an
//! approval never lands on a request that changed since the page was rendered (the
//! ledger answers `Stale`, the page shows why and keeps what was typed).

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, RawForm, State};
use axum::http::StatusCode;
use flow_ledger::{Approval, ApprovalFilter, ApprovalStatus, Decided};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::forms::{reason, url};
use super::live::last_seq;
use super::session::Signed;
use super::{Page, Ui, who};
use crate::approval::{self, Decider, Decision, Refusal, authorize, rule_inputs};
use crate::role::Role;
use crate::serve::api::approvals::refused;
use crate::serve::problem::Problem;
use crate::view::ApprovalView;

/// Approvals the page shows at once (the oldest requests): a worklist, not an archive.
const PAGE_ROWS: u32 = 200;

/// The prefix of a declared input's form field (`in_reason`), so an input called
/// `reason` or `csrf` cannot collide with the form's own fields.
const INPUT: &str = "in_";

/// The query of the page: a run filter, and what the last decision came to (after the
/// redirect that follows a decision).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ApprovalsQuery {
    /// Only this run's approvals (the run page links here).
    run: String,
    /// `RUN/NODE` just decided by this user.
    decided: String,
    /// `approved`, `denied` or `voted`.
    outcome: String,
    /// With `voted`: how many more approvers are needed.
    needed: Option<u32>,
}

impl ApprovalsQuery {
    /// The page's own address under its filter (what the live script fetches again).
    fn address(&self) -> String {
        match self.run.trim() {
            "" => "/ui/approvals".into(),
            run => format!("/ui/approvals?run={}", url(run)),
        }
    }

    /// The notice of a decision just made, if the redirect said so.
    fn notice(&self) -> Json {
        let done = self.decided.trim();
        let text = match (self.outcome.as_str(), self.needed) {
            _ if done.is_empty() => return json!({}),
            ("approved", _) => {
                format!("Approved {done}: the run goes on and sends exactly the request shown.")
            }
            ("denied", _) => {
                format!("Denied {done}: nothing is sent and the node fails with your reason.")
            }
            ("voted", Some(n)) => format!("Your approval of {done} counted: {n} more needed."),
            _ => return json!({}),
        };
        json!({ "info": text })
    }
}

/// `GET /ui/approvals?run=`: what waits for a decision, oldest first.
pub async fn page(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    q: Result<Query<ApprovalsQuery>, QueryRejection>,
) -> Result<Page, Page> {
    let Query(q) = q.map_err(|e| Page::error(StatusCode::BAD_REQUEST, e.body_text()))?;
    let notice = q.notice();
    inbox(&ui, &signed, &q, StatusCode::OK, notice).await
}

/// The page under `q` with `notice` (`{error}` or `{info}`; after a refused form also
/// `run`, `node`, `field`, `inputs` and `reason`: where the error goes and what was
/// typed), answered with `status`.
async fn inbox(
    ui: &Ui,
    signed: &Signed,
    q: &ApprovalsQuery,
    status: StatusCode,
    mut notice: Json,
) -> Result<Page, Page> {
    let run = Some(q.run.trim().to_string()).filter(|r| !r.is_empty());
    if let Some(r) = &run {
        flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, r)
            .map_err(|e| Page::error(StatusCode::BAD_REQUEST, format!("run: {e}")))?;
    }
    let live_after = last_seq(&ui.app.ledger).await?;
    let ledger_err = |e: flow_ledger::Error| Page::from(Problem::ledger(&e));
    let mut pending = ui
        .app
        .ledger
        .list_approvals(ApprovalFilter {
            run_id: run,
            status: Some(ApprovalStatus::Pending),
            limit: PAGE_ROWS + 1,
            as_of: Some(ui.app.now()),
        })
        .await
        .map_err(ledger_err)?;
    let more = pending.len() > PAGE_ROWS as usize;
    pending.truncate(PAGE_ROWS as usize);
    let ids: Vec<String> = pending
        .iter()
        .map(|a| a.run_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let names = ui.app.ledger.run_names(&ids).await.map_err(ledger_err)?;
    let decider = decider(signed);
    let cards: Vec<Json> = pending
        .iter()
        .map(|a| {
            let workflow = names
                .iter()
                .find(|n| n.id == a.run_id)
                .map_or("", |n| n.workflow.as_str());
            card(a, workflow, &decider)
        })
        .collect();
    // A refusal about an approval no longer listed (decided meanwhile) goes on top.
    if let Some(n) = notice.as_object_mut() {
        let (r, nd) = (n.get("run").cloned(), n.get("node").cloned());
        let beside = pending
            .iter()
            .any(|a| Some(json!(a.run_id)) == r && Some(json!(a.node_id)) == nd);
        n.insert("beside".into(), json!(beside));
    }
    let ctx = json!({
        "title": "Approvals",
        "nav": "approvals",
        "who": who(signed, ui).await?,
        "cards": cards,
        "more": more,
        "run": q.run.trim(),
        "notice": notice,
        "live_url": q.address(),
        "live_after": live_after,
    });
    Ok(Page::render(status, "approvals.html", &ctx))
}

/// The signed-in user as a decider.
fn decider(signed: &Signed) -> Decider {
    Decider {
        name: signed.caller.name.clone(),
        role: signed.caller.role.as_str().to_owned(),
    }
}

/// One approval as the page shows it: the view, the run's workflow, and whether this
/// user may decide it (the one rule, [`authorize`], asked without deciding) or why not.
fn card(a: &Approval, workflow: &str, decider: &Decider) -> Json {
    let may = authorize(a, decider, false, Map::new());
    json!({
        "a": ApprovalView::of(a),
        "workflow": workflow,
        "can_decide": may.is_ok(),
        "why_not": may.err().map(|e| e.to_string()),
        "id": format!("{}-{}", a.run_id, a.node_id),
    })
}

/// The decide form, read by hand: its declared inputs' names are the approval's own
/// (`in_NAME`), which no fixed struct can list.
#[derive(Debug, Default)]
struct DecideForm {
    csrf: String,
    run: String,
    node: String,
    digest: String,
    /// `approve` or `deny`.
    decision: String,
    reason: String,
    /// `(NAME, text)` of each declared input, as typed.
    inputs: Vec<(String, String)>,
}

impl DecideForm {
    fn parse(body: &[u8]) -> DecideForm {
        let mut f = DecideForm::default();
        for (k, v) in url::form_urlencoded::parse(body) {
            let v = v.into_owned();
            match k.as_ref() {
                "csrf" => f.csrf = v,
                "run" => f.run = v,
                "node" => f.node = v,
                "digest" => f.digest = v,
                "decision" => f.decision = v,
                "reason" => f.reason = v,
                other => {
                    if let Some(name) = other.strip_prefix(INPUT) {
                        f.inputs.push((name.to_string(), v));
                    }
                }
            }
        }
        f
    }

    /// What was typed, to show again beside a refusal.
    fn kept(&self, error: &str, field: Option<&str>) -> Json {
        let typed: Map<String, Json> = self
            .inputs
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        json!({
            "error": error, "field": field, "run": self.run, "node": self.node,
            "inputs": typed, "reason": self.reason,
        })
    }
}

/// `POST /ui/approvals/decide`: session → CSRF (403) → role (a viewer: 403) → the
/// form's values (400, beside the field) → `crate::approval::decide` as the signed-in
/// token. A decision recorded redirects (303) back to the page with what it came to;
/// a refused one shows the page again with why beside the form and what was typed
/// kept, nothing written.
pub async fn decide(
    signed: Signed,
    State(ui): State<Arc<Ui>>,
    RawForm(body): RawForm,
) -> Result<Page, Page> {
    let f = DecideForm::parse(&body);
    signed.check_csrf(&ui, &f.csrf)?;
    signed.need(Role::Operator)?;
    let q = ApprovalsQuery::default();
    let again = |status: StatusCode, error: String, field: Option<&'static str>| {
        let notice = f.kept(&error, field);
        inbox(&ui, &signed, &q, status, notice)
    };
    let approve = match f.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            let why = format!("decision: `{other}` is not approve or deny; nothing was written");
            return again(StatusCode::BAD_REQUEST, why, None).await;
        }
    };
    if !approve && reason(&f.reason).is_none() {
        let why = "a denial needs a reason: the node fails with it; nothing was written";
        return again(StatusCode::BAD_REQUEST, why.into(), Some("reason")).await;
    }
    let inputs = if approve {
        match typed_inputs(&ui, &f).await {
            Ok(i) => i,
            Err(why) => return again(StatusCode::BAD_REQUEST, why, Some("inputs")).await,
        }
    } else {
        Map::new()
    };
    let d = Decision {
        run: f.run.clone(),
        node: f.node.clone(),
        approve,
        inputs,
        reason: reason(&f.reason),
        digest: Some(f.digest.clone()).filter(|d| !d.is_empty()),
    };
    let now = ui.app.now();
    match crate::approval::decide(&ui.app.ledger, &decider(&signed), d, now).await {
        Ok(done) => {
            let (outcome, needed) = match done {
                Decided::Approved(_) => ("approved", None),
                Decided::Denied(_) => ("denied", None),
                Decided::Voted { needed, .. } => ("voted", Some(needed)),
            };
            let needed = needed.map(|n| format!("&needed={n}")).unwrap_or_default();
            Ok(Page::redirect(format!(
                "/ui/approvals?decided={}&outcome={outcome}{needed}",
                url(&format!("{}/{}", f.run, f.node))
            )))
        }
        Err(e) => {
            let field = match &e {
                approval::Error::Refused(Refusal::BadInputs(_)) => Some("inputs"),
                _ => None,
            };
            let p = refused(e, &f.run);
            again(p.status, p.detail, field).await
        }
    }
}

/// The typed inputs of an approve, as the CLI's `--input NAME=VALUE` are typed: by the
/// approval's stored declaration (a string as typed, anything else parsed as its type);
/// a blank field is left out, so a default applies and a missing required input is
/// named by the one rule. An approval not found types nothing (`decide` says why).
async fn typed_inputs(ui: &Ui, f: &DecideForm) -> Result<Map<String, Json>, String> {
    let decls = match ui.app.ledger.get_approval(&f.run, &f.node).await {
        Ok(Some(a)) => rule_inputs(&a.rule),
        _ => return Ok(Map::new()),
    };
    let pairs: Vec<String> = f
        .inputs
        .iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    crate::inputs::pairs_to_json(&decls, &pairs).map_err(|e| format!("approval inputs: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_reads_declared_inputs_apart_from_its_own_fields() {
        let f = DecideForm::parse(
            b"csrf=c&run=r1&node=refund&digest=sha256%3Aab&decision=approve&reason=ok&in_reason=dup+charge&in_csrf=x&other=y",
        );
        assert_eq!(
            (f.csrf.as_str(), f.run.as_str(), f.node.as_str()),
            ("c", "r1", "refund")
        );
        assert_eq!(
            (f.digest.as_str(), f.decision.as_str()),
            ("sha256:ab", "approve")
        );
        assert_eq!(f.reason, "ok");
        assert_eq!(
            f.inputs,
            vec![
                ("reason".to_string(), "dup charge".to_string()),
                ("csrf".to_string(), "x".to_string())
            ]
        );
    }

    #[test]
    fn the_notice_says_what_a_decision_came_to() {
        let q = |outcome: &str, needed: Option<u32>| ApprovalsQuery {
            decided: "r1/refund".into(),
            outcome: outcome.into(),
            needed,
            ..ApprovalsQuery::default()
        };
        assert!(
            q("voted", Some(1)).notice()["info"]
                .as_str()
                .is_some_and(|t| t.contains("1 more needed"))
        );
        assert!(
            q("approved", None).notice()["info"]
                .as_str()
                .is_some_and(|t| t.starts_with("Approved r1/refund"))
        );
        assert_eq!(q("nonsense", None).notice(), json!({}));
        assert_eq!(ApprovalsQuery::default().notice(), json!({}));
        let run = ApprovalsQuery {
            run: "run 1".into(),
            ..ApprovalsQuery::default()
        };
        assert_eq!(run.address(), "/ui/approvals?run=run+1");
    }
}

//! Approvals, the engine's half: what a node's `approval:` is stored as, the one rule
//! that decides whether a person may decide (and what their decision counts as), and
//! the reminder schedule. The ledger holds the state and the compare-and-set
//! (`ledger/src/approvals.rs`); the gateway asks it before a call is claimed.
//!
//! `authorize` is pure and table-tested below: the CLI, the API and the console all
//! call it with the approval as stored and the decider as authenticated, then hand the
//! decision to `Ledger::decide_approval`, which settles races.

use flow_ledger::{Approval, ApprovalStatus, Timestamp};
use serde_json::{Map, Value as Json, json};

use crate::duration_text::whole_millis;
use crate::workflow::InputType;
use crate::workflow::model::{ApprovalDecl, InputDecl};

/// How a run started by an agent over MCP records its submitter: `mcp:<principal>`.
/// That principal never decides the run's approvals ([`authorize`]).
pub const MCP_SUBMITTER: &str = "mcp:";

/// Who decides: a token's name and role (`viewer`, `operator`, `admin`), or, for the
/// local CLI (which holds the ledger itself), the operator's name as `admin`.
#[derive(Debug, Clone)]
pub struct Decider {
    /// The name recorded (token name, `--by`, or `$USER@host`).
    pub name: String,
    /// The role: `viewer`, `operator` or `admin`.
    pub role: String,
}

/// Why a person may not decide (each maps to one HTTP status and exit code).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The approval is no longer pending (409): who won.
    #[error("the approval is already {status}{}", by.as_ref().map(|b| format!(" (by {b})")).unwrap_or_default())]
    Decided {
        /// Its status.
        status: ApprovalStatus,
        /// Who decided.
        by: Option<String>,
    },
    /// The approval's deadline passed (409, as a decision that lost a race): it timed
    /// out, recorded by a sweep or not, and its `on_timeout` applies.
    #[error(
        "the approval timed out at its deadline {}: a decision after it is refused",
        deadline.to_rfc3339()
    )]
    PastDeadline {
        /// The deadline.
        deadline: Timestamp,
    },
    /// This decider may not decide this approval (403).
    #[error("{0}")]
    Forbidden(String),
    /// The approver's inputs do not match the declaration (400).
    #[error("approval inputs: {0}")]
    BadInputs(String),
}

/// What a node's `approval:` is stored as (`approvals.rule`): everything a decider and
/// the sweep need without the workflow.
pub fn rule(decl: &ApprovalDecl) -> Json {
    let inputs: Vec<Json> = decl
        .inputs
        .iter()
        .map(|i| {
            json!({
                "name": i.name, "type": i.ty.name(), "required": i.required,
                "default": i.default, "description": i.description,
            })
        })
        .collect();
    json!({
        "roles": decl.roles,
        "tokens": decl.tokens,
        "min": decl.min,
        "forbid_self": decl.forbid_self,
        "inputs": inputs,
        "timeout_ms": whole_millis(decl.timeout),
        "on_timeout": decl.on_timeout.as_str(),
        "remind_ms": decl.remind.iter().map(|d| whole_millis(*d)).collect::<Vec<_>>(),
    })
}

/// The first reminder's offset from the request, if the approval has reminders.
pub fn first_remind_ms(decl: &ApprovalDecl) -> Option<i64> {
    decl.remind.first().map(|d| whole_millis(*d))
}

/// When the reminder after the `sent`-th is due (`None`: no more), from the stored
/// rule: the sweep's schedule.
pub fn next_remind(rule: &Json, sent: u32, requested_at: Timestamp) -> Option<Timestamp> {
    let at = rule
        .get("remind_ms")?
        .as_array()?
        .get(sent as usize)?
        .as_i64()?;
    Some(Timestamp(requested_at.0.saturating_add(at)))
}

/// The declared inputs of a stored rule (for checking an approver's inputs).
pub fn rule_inputs(rule: &Json) -> Vec<InputDecl> {
    let Some(list) = rule.get("inputs").and_then(Json::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|i| {
            Some(InputDecl {
                name: i.get("name")?.as_str()?.to_owned(),
                ty: InputType::parse(i.get("type")?.as_str()?)?,
                required: i.get("required").and_then(Json::as_bool).unwrap_or(false),
                default: i.get("default").filter(|d| !d.is_null()).cloned(),
                description: None,
            })
        })
        .collect()
}

/// The list of strings under `key` of a stored rule (`roles`, `tokens`): what the rule
/// says and what readers are shown come from this one reading.
pub fn rule_strings(rule: &Json, key: &str) -> Vec<String> {
    rule.get(key)
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `who` may decide `approval` at all, and with what inputs (an approve's
/// inputs are checked and completed with defaults; a deny takes none). The one rule:
///
/// - only a `pending` approval is decided (else `Decided`, naming the winner, or
///   `PastDeadline` for one that timed out; a pending one past its deadline is refused
///   by the ledger, which judges the deadline in the decision's transaction);
/// - a `viewer` never decides;
/// - with `roles` or `tokens` listed, the decider's role (an admin counts as an
///   operator) or token name must be among them; with neither, any operator decides;
/// - with `forbid_self`, the name that submitted the run may not decide (deny included:
///   an agent must not settle its own call either way);
/// - the principal of a run started over MCP (submitted as `mcp:<name>`) never decides
///   it, with or without `forbid_self`;
/// - an approve needs every required input, typed as declared.
pub fn authorize(
    approval: &Approval,
    who: &Decider,
    approve: bool,
    inputs: Map<String, Json>,
) -> Result<Option<Json>, Refusal> {
    if approval.status == ApprovalStatus::TimedOut {
        return Err(Refusal::PastDeadline {
            deadline: approval.deadline,
        });
    }
    if approval.status != ApprovalStatus::Pending {
        return Err(Refusal::Decided {
            status: approval.status,
            by: approval.decided_by.clone(),
        });
    }
    let rank = |r: &str| match r {
        "admin" => 2,
        "operator" => 1,
        _ => 0,
    };
    if rank(&who.role) == 0 {
        return Err(Refusal::Forbidden(format!(
            "`{}` has role {}: a viewer cannot decide an approval",
            who.name, who.role
        )));
    }
    let (roles, tokens) = (
        rule_strings(&approval.rule, "roles"),
        rule_strings(&approval.rule, "tokens"),
    );
    let by_role = roles.iter().any(|r| rank(&who.role) >= rank(r));
    let by_token = tokens.contains(&who.name);
    let anyone = roles.is_empty() && tokens.is_empty();
    if !(anyone || by_role || by_token) {
        return Err(Refusal::Forbidden(format!(
            "`{}` is not an approver of node `{}` (roles: [{}], tokens: [{}])",
            who.name,
            approval.node_id,
            roles.join(", "),
            tokens.join(", ")
        )));
    }
    let forbid_self = approval
        .rule
        .get("forbid_self")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    if forbid_self && approval.submitted_by.as_deref() == Some(who.name.as_str()) {
        return Err(Refusal::Forbidden(format!(
            "`{}` submitted run {} and `forbid_self` refuses its own approval",
            who.name, approval.run_id
        )));
    }
    // An agent that started the run over MCP never decides it, `forbid_self` or not:
    // an agent approving its own call is the thing approvals exist to prevent.
    let agent = approval
        .submitted_by
        .as_deref()
        .and_then(|by| by.strip_prefix(MCP_SUBMITTER));
    if agent == Some(who.name.as_str()) {
        return Err(Refusal::Forbidden(format!(
            "`{}` started run {} over MCP: the caller that started a run never decides its approvals",
            who.name, approval.run_id
        )));
    }
    if !approve {
        return Ok(None);
    }
    let decls = rule_inputs(&approval.rule);
    crate::inputs::declared_from_json(&decls, inputs)
        .map(Some)
        .map_err(|e| Refusal::BadInputs(e.to_string()))
}

/// Why a decision was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node has not asked for approval in this run (or no such run).
    #[error("run {run} has no approval for node `{node}`")]
    NotFound {
        /// The run.
        run: String,
        /// The node.
        node: String,
    },
    /// The decider may not decide (or no longer can).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The ledger refused or failed (`Terminal`, `Stale`, unavailable, …).
    #[error(transparent)]
    Ledger(flow_ledger::Error),
}

/// A person's decision on a node's approval: the one path the CLI, the API and the
/// console take. Reads the approval, asks [`authorize`], then records it through the
/// ledger's compare-and-set (a loser of a race is `Refused(Decided)` naming the
/// winner).
pub async fn decide(
    ledger: &flow_ledger::Ledger,
    who: &Decider,
    d: Decision,
    now: Timestamp,
) -> Result<flow_ledger::Decided, Error> {
    let not_found = || Error::NotFound {
        run: d.run.clone(),
        node: d.node.clone(),
    };
    let approval = match ledger.get_approval(&d.run, &d.node).await {
        Ok(Some(a)) => a,
        Ok(None) | Err(flow_ledger::Error::NotFound { .. }) => return Err(not_found()),
        Err(e) => return Err(Error::Ledger(e)),
    };
    let inputs = authorize(&approval, who, d.approve, d.inputs)?;
    let req = flow_ledger::Decide {
        run_id: d.run.clone(),
        node_id: d.node.clone(),
        by: who.name.clone(),
        approve: d.approve,
        reason: d.reason,
        inputs,
        digest: d.digest,
    };
    ledger.decide_approval(req, now).await.map_err(|e| match e {
        flow_ledger::Error::Decided { status, by } => {
            Error::Refused(Refusal::Decided { status, by })
        }
        flow_ledger::Error::PastDeadline { deadline } => {
            Error::Refused(Refusal::PastDeadline { deadline })
        }
        flow_ledger::Error::NotFound { .. } => not_found(),
        other => Error::Ledger(other),
    })
}

/// What a person decides.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The run.
    pub run: String,
    /// The node.
    pub node: String,
    /// Approve (a vote) or deny.
    pub approve: bool,
    /// The approver's inputs (an approve's are checked against the declaration).
    pub inputs: Map<String, Json>,
    /// Why.
    pub reason: Option<String>,
    /// The digest the decider saw (refused as stale if the request changed since).
    pub digest: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(rule: Json, status: ApprovalStatus, submitted_by: Option<&str>) -> Approval {
        Approval {
            run_id: "r1".into(),
            node_id: "refund".into(),
            step_id: "refund".into(),
            tool: "payments".into(),
            status,
            request: json!({}),
            digest: "d".into(),
            message: None,
            rule,
            min_approvals: 1,
            submitted_by: submitted_by.map(str::to_owned),
            requested_at: Timestamp(0),
            deadline: Timestamp(1),
            reminders_sent: 0,
            next_remind_at: None,
            decided_at: None,
            decided_by: Some("carol".into()).filter(|_| status.is_decided()),
            reason: None,
            inputs: None,
            votes: Vec::new(),
        }
    }

    fn who(name: &str, role: &str) -> Decider {
        Decider {
            name: name.into(),
            role: role.into(),
        }
    }

    fn reason_input() -> Json {
        json!([{ "name": "reason", "type": "string", "required": true }])
    }

    /// What `authorize` answered, in one word.
    fn verdict(r: Result<Option<Json>, Refusal>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(Refusal::Forbidden(_)) => "forbidden",
            Err(Refusal::Decided { by: Some(_), .. }) => "decided",
            Err(Refusal::Decided { by: None, .. }) => "decided-anonymously",
            Err(Refusal::BadInputs(_)) => "bad",
            Err(Refusal::PastDeadline { .. }) => "late",
        }
    }

    /// The table: rule, status, submitter, decider `name/role`, approve?, inputs → verdict.
    #[test]
    fn who_may_decide_what() {
        use ApprovalStatus::{Approved as A, Pending as P, TimedOut as T};
        let any = json!({});
        let (ops, admins) = (
            json!({ "roles": ["operator"] }),
            json!({ "roles": ["admin"] }),
        );
        let (named, mixed) = (
            json!({ "tokens": ["alice"] }),
            json!({ "roles": ["admin"], "tokens": ["al"] }),
        );
        let selfless = json!({ "forbid_self": true });
        let reason = json!({ "inputs": reason_input() });
        let table = [
            (&any, P, None, "x/operator", true, "{}", "ok"),
            (&any, P, None, "x/admin", false, "{}", "ok"),
            (&any, P, None, "x/viewer", true, "{}", "forbidden"),
            (&any, P, None, "x/viewer", false, "{}", "forbidden"),
            (&any, A, None, "x/admin", true, "{}", "decided"),
            (&any, T, None, "x/admin", true, "{}", "late"),
            (&any, T, None, "x/admin", false, "{}", "late"),
            (&ops, P, None, "x/admin", true, "{}", "ok"),
            (&admins, P, None, "x/operator", true, "{}", "forbidden"),
            (&named, P, None, "alice/operator", true, "{}", "ok"),
            (&named, P, None, "carol/admin", true, "{}", "forbidden"),
            (&mixed, P, None, "al/operator", true, "{}", "ok"),
            (&mixed, P, None, "d/admin", true, "{}", "ok"),
            (&mixed, P, None, "d/operator", true, "{}", "forbidden"),
            (
                &selfless,
                P,
                Some("bot"),
                "bot/admin",
                true,
                "{}",
                "forbidden",
            ),
            (
                &selfless,
                P,
                Some("bot"),
                "bot/admin",
                false,
                "{}",
                "forbidden",
            ),
            (&selfless, P, Some("bot"), "al/operator", true, "{}", "ok"),
            (&any, P, Some("bot"), "bot/operator", true, "{}", "ok"),
            (&reason, P, None, "x/operator", true, "{}", "bad"),
            (
                &reason,
                P,
                None,
                "x/operator",
                true,
                r#"{"reason": 3}"#,
                "bad",
            ),
            (
                &reason,
                P,
                None,
                "x/operator",
                true,
                r#"{"why": "a"}"#,
                "bad",
            ),
            (
                &reason,
                P,
                None,
                "x/operator",
                true,
                r#"{"reason": "ok"}"#,
                "ok",
            ),
            (&reason, P, None, "x/operator", false, "{}", "ok"),
        ];
        for (i, (rule, status, submitter, decider, approve, inputs, expect)) in
            table.into_iter().enumerate()
        {
            let a = approval(rule.clone(), status, submitter);
            let (name, role) = decider.split_once('/').expect("name/role");
            let inputs: Map<String, Json> = serde_json::from_str(inputs).expect("an object");
            let got = verdict(authorize(&a, &who(name, role), approve, inputs));
            assert_eq!(got, expect, "row {i}: {decider}");
        }
    }

    #[test]
    fn reminders_follow_the_rule_and_stop() {
        let rule = json!({ "remind_ms": [1_000, 5_000] });
        assert_eq!(
            next_remind(&rule, 0, Timestamp(100)),
            Some(Timestamp(1_100))
        );
        assert_eq!(
            next_remind(&rule, 1, Timestamp(100)),
            Some(Timestamp(5_100))
        );
        assert_eq!(next_remind(&rule, 2, Timestamp(100)), None);
        assert_eq!(next_remind(&json!({}), 0, Timestamp(100)), None);
    }

    #[test]
    fn an_approvers_inputs_are_typed_and_defaulted() {
        let rule = json!({ "inputs": [
            { "name": "reason", "type": "string", "required": true },
            { "name": "amount", "type": "integer", "default": 5 },
        ]});
        let a = approval(rule, ApprovalStatus::Pending, None);
        let mut given = Map::new();
        given.insert("reason".into(), json!("dup"));
        let got = authorize(&a, &who("x", "operator"), true, given).expect("valid");
        assert_eq!(got, Some(json!({ "reason": "dup", "amount": 5 })));
    }
}

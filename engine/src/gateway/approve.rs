//! The approval gate: before a node with `approval:` claims its call, the rendered
//! request (secrets as names) and its digest go to the ledger, which answers whether
//! exactly this request is approved. Only then is the call claimed and marked outbound,
//! so the decision is in the ledger before the outbound mark, and a request that changed
//! after its approval (its digest differs) never leaves: the approval goes back to
//! pending under the new digest (`approval.invalidated`). An item of a `for_each` node
//! is asked for under its call id, `node[<key>]`: one approval per item. The digest
//! binds the values of the secrets the request reads, keyed (see `approval_digest`).

use flow_ledger::{AskApproval, ErrorKind, Gate};

use super::render;
use super::{Gateway, Rendered, StepCall, StepResult, Target};
use crate::approval;
use crate::policy::{Facts, Policy};
use crate::workflow::model::{ApprovalDecl, OnTimeout};

/// The secret that keys the approval digest of a request that reads secrets
/// ([`Gateway::approval_digest`]): set it the same on every worker, like any secret.
pub(crate) const DIGEST_KEY: &str = "APPROVAL_DIGEST_KEY";

impl Gateway {
    /// The approval a call needs: the node's own, or the first `[[policy.approvals]]`
    /// rule that gates it (with the node's own, the stricter `min`); `None` when
    /// neither asks.
    pub(super) fn approval_for(
        &self,
        c: &StepCall<'_>,
        target: &Target,
        mcp_destructive: Option<bool>,
    ) -> Option<ApprovalDecl> {
        let policy = &self.inner.policy;
        if policy.approvals.is_empty() {
            return c.node.approval().cloned();
        }
        let kind = match target {
            Target::Function { .. } => "function",
            Target::Command(_) => "command",
            Target::Http(_) => "http",
            Target::Mcp(_) => "mcp",
        };
        let method = match target {
            Target::Http(spec) => Some(spec.method.as_str()),
            _ => None,
        };
        let facts = Facts {
            tool: &c.tool.name,
            kind,
            method,
            host: target.hosts().into_iter().next(),
            mcp_destructive,
        };
        match (policy.gate(&facts), c.node.approval()) {
            (Some((_, rule)), Some(own)) => Some(Policy::merged(own, rule)),
            (Some((_, rule)), None) => Some(rule.approval()),
            (None, own) => own.cloned(),
        }
    }

    /// What an approval of this request binds to. The stored request shows secrets by
    /// name, so its hash alone would let an approval given for one value of a secret
    /// send another (a payee account swapped after the approval). A request that reads
    /// secrets (`Rendered::bound_secrets`: not credentials) is bound by value too: an
    /// HMAC keyed by the secret [`DIGEST_KEY`] over the request's hash and the values,
    /// so the ledger holds no value nor anything a reader of it could test guesses
    /// against. Without that key such a request cannot be approved: the step fails
    /// with a message saying so (never an approval that ignores the values).
    fn approval_digest(&self, c: &StepCall<'_>, r: &Rendered) -> Result<String, String> {
        if r.bound_secrets.is_empty() {
            return Ok(r.request_hash.clone());
        }
        let secrets = self.secrets_of(c);
        let Some(key) = secrets.get(DIGEST_KEY).filter(|k| !k.is_empty()) else {
            return Err(format!(
                "node `{}` asks approval of a request that reads secret{} {}: set secret `{DIGEST_KEY}` (FLOW_SECRET_{DIGEST_KEY}, the same on every worker) so the approval binds their values",
                c.call_id,
                if r.bound_secrets.len() == 1 { "" } else { "s" },
                r.bound_secrets
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        let values: serde_json::Map<String, serde_json::Value> = r
            .bound_secrets
            .iter()
            .map(|n| (n.clone(), secrets.get(n).unwrap_or_default().into()))
            .collect();
        let bound = flow_ledger::canonical_hash(&serde_json::Value::Object(values));
        let text = format!("{}\n{bound}", r.request_hash);
        let mac = crate::sign::Key::new(key).sign(text.as_bytes());
        Ok(format!(
            "hmac-sha256:{}",
            mac.strip_prefix("sha256=").unwrap_or(&mac)
        ))
    }

    /// Asks the ledger about the node's approval: `None` when exactly this request is
    /// approved (go on and claim), else the step's result — awaiting, failed (denied,
    /// timed out with `on_timeout: fail`, a message that does not render) or skipped.
    pub(super) async fn approval_gate(
        &self,
        c: &StepCall<'_>,
        decl: &ApprovalDecl,
        r: &Rendered,
    ) -> Result<Option<StepResult>, flow_ledger::Error> {
        // An item of a `for_each` node has an approval of its own (`node[<key>]`): each
        // item's request is a different one, and approvers decide each.
        let node_id = c.call_id.as_str();
        let message = match decl.message.as_ref().map(|t| t.render_string(&c.ctx)) {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                let message = format!(
                    "`approval.message` of node `{node_id}`: {}",
                    render::describe(&e, &self.inner.secrets)
                );
                return self
                    .fail_claimed_step(c, ErrorKind::Permanent, message)
                    .await
                    .map(Some);
            }
        };
        let digest = match self.approval_digest(c, r) {
            Ok(d) => d,
            Err(message) => {
                return self
                    .fail_claimed_step(c, ErrorKind::Permanent, message)
                    .await
                    .map(Some);
            }
        };
        let ask = AskApproval {
            node_id: node_id.to_owned(),
            step_id: c.step_id.clone(),
            tool: c.tool.name.clone(),
            request: r.request.clone(),
            digest,
            message,
            rule: approval::rule(decl),
            min: decl.min,
            timeout_ms: crate::duration_text::whole_millis(decl.timeout),
            first_remind_ms: approval::first_remind_ms(decl),
        };
        let gate = self
            .inner
            .ledger
            .approval_gate(c.run(), ask, self.now())
            .await?;
        match gate {
            Gate::Approved(a) => {
                tracing::info!(node = node_id, by = ?a.decided_by, digest = %a.digest, "approved: sending the approved request");
                Ok(None)
            }
            Gate::Pending(a) => {
                tracing::info!(node = node_id, deadline = %a.deadline.to_rfc3339(), "awaiting approval");
                Ok(Some(StepResult::AwaitingApproval {
                    deadline: a.deadline,
                }))
            }
            Gate::Denied(a) => {
                let message = format!(
                    "approval denied by {}{}",
                    a.decided_by.as_deref().unwrap_or("an approver"),
                    a.reason.map(|r| format!(": {r}")).unwrap_or_default()
                );
                self.fail_claimed_step(c, ErrorKind::Permanent, message)
                    .await
                    .map(Some)
            }
            Gate::TimedOut(_) => {
                let waited = crate::duration_text::duration(decl.timeout);
                let why = format!("approval timed out: nobody decided within {waited}");
                match decl.on_timeout {
                    OnTimeout::Fail => self
                        .fail_claimed_step(c, ErrorKind::Permanent, why)
                        .await
                        .map(Some),
                    OnTimeout::Skip => self.skip_claimed_step(c, why).await.map(Some),
                }
            }
        }
    }
}

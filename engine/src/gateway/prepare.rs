//! Rendering a node's call before anything is claimed: the secrets it reads, `with`,
//! the idempotency key, the tool's target and the stored (scrubbed) request, with
//! egress checked.

use flow_ledger::canonical_hash;
use serde_json::Value as Json;

use super::render::{self, Target};
use super::{Gateway, Rendered, StepCall};
use crate::workflow::ToolDecl;
use crate::workflow::expr::secret_names;

impl Gateway {
    /// Renders a node's call before anything is claimed: the secrets it reads (all
    /// set), `with`, the idempotency key, the tool's target and the stored (scrubbed)
    /// request, with egress checked. An error is the message the step fails with.
    pub(super) fn render_request(&self, c: &StepCall<'_>) -> Result<Rendered, String> {
        let secrets = self.secrets_of(c);
        let node_id = c.node.id.as_str();

        // 1. Secrets, `with`, the idempotency key and the tool spec.
        let mut needed = secret_names(c.node.with.templates());
        needed.extend(secret_names(tool_templates(c.tool)));
        if let Some(name) = secrets.missing(needed.iter().map(String::as_str)) {
            let message = format!(
                "secret `{name}` is not set: provide FLOW_SECRET_{name} in the environment or a line `{name}=…` in --secrets-file"
            );
            return Err(message);
        }
        let mut ctx = c.ctx.clone();
        if let Json::Object(map) = &mut ctx {
            map.insert(
                "secrets".into(),
                secrets.context(needed.iter().map(String::as_str), false),
            );
        }
        let args = match c.node.with.render(&ctx) {
            Ok(args) => args,
            Err(e) => {
                let message = format!(
                    "`with` of node `{node_id}`: {}",
                    render::describe(&e, secrets)
                );
                return Err(message);
            }
        };
        let base_key = match &c.node.idempotency_key {
            Some(t) => match t.render_string(&c.ctx) {
                Ok(k) if !k.is_empty() => k,
                Ok(_) => {
                    return Err(format!(
                        "`idempotency_key` of node `{node_id}` rendered empty"
                    ));
                }
                Err(e) => {
                    let message = format!(
                        "`idempotency_key` of node `{node_id}`: {}",
                        render::describe(&e, secrets)
                    );
                    return Err(message);
                }
            },
            None => format!("{}:{}", c.run().run_id, c.call_id),
        };
        let (mut target, request) = match render::render(c.tool, &args, &ctx, secrets) {
            Ok(r) => r,
            Err(message) => {
                let message = format!("tool `{}`: {message}", c.tool.name);
                return Err(message);
            }
        };

        // 2. Egress.
        for host in target.hosts() {
            if !self.inner.egress.allows(&host) {
                let message = format!(
                    "egress to `{host}` is not allowed by `egress.allow` in flow.toml (tool `{}`)",
                    c.tool.name
                );
                return Err(message);
            }
        }
        if let Target::Http(spec) = &mut target {
            spec.allow_hosts.clone_from(&self.inner.allow_list);
        }
        let request_hash = canonical_hash(&request);
        let mut bound_secrets = secret_names(c.node.with.templates());
        bound_secrets.extend(secret_names(c.tool.kind.request_templates()));
        bound_secrets.sort();
        bound_secrets.dedup();
        Ok(Rendered {
            args,
            base_key,
            target,
            request,
            request_hash,
            bound_secrets,
        })
    }
}

fn tool_templates(tool: &ToolDecl) -> Vec<&crate::workflow::expr::Template> {
    tool.kind.templates()
}

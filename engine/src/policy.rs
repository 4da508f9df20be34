//! `[[policy.approvals]]` in `flow.toml`: the installation's rule that some calls need
//! an approval whatever the workflow says ("every destructive MCP tool", "every write
//! to api.stripe.com"). Applied twice: at validation (`flow validate --config` says
//! which nodes it gates, or may gate when the facts are known only at call time) and by
//! the gateway on every call, which is what makes it a rule rather than advice.
//!
//! ```toml
//! [[policy.approvals]]
//! name = "destructive-mcp"
//! match = { mcp_destructive = true }   # annotations say destructiveHint (or nothing)
//! require = { roles = ["operator"], min = 1 }
//!
//! [[policy.approvals]]
//! match = { tool_kind = "http", method = ["POST", "DELETE"], host = "api.stripe.com" }
//! require = { roles = ["admin"] }
//! timeout = "24h"                       # default 24h; on_timeout = "fail" (default) | "skip"
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::workflow::model::{ApprovalDecl, OnTimeout};

/// How long a policy's approval waits when the rule names no `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `[policy]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// `[[policy.approvals]]`, first match wins.
    #[serde(default)]
    pub approvals: Vec<ApprovalRule>,
}

/// One `[[policy.approvals]]` rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// Named in messages (default `policy.approvals[<index>]`).
    pub name: Option<String>,
    /// Which calls it gates: every given field must match.
    #[serde(rename = "match")]
    pub matches: Match,
    /// Who must approve.
    #[serde(default)]
    pub require: Require,
    /// How long the approval waits (default 24h).
    pub timeout: Option<String>,
    /// `fail` (default) or `skip`.
    pub on_timeout: Option<String>,
}

/// One or several values.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    fn values(&self) -> Vec<&str> {
        match self {
            Self::One(v) => vec![v.as_str()],
            Self::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// What a rule matches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// `function`, `command`, `http` or `mcp`.
    pub tool_kind: Option<OneOrMany>,
    /// The workflow's tool name(s).
    pub tool: Option<OneOrMany>,
    /// HTTP method(s), upper case.
    pub method: Option<OneOrMany>,
    /// Host pattern(s) of the URL (`api.example.com`, `*.example.com`), as `[egress]`.
    pub host: Option<OneOrMany>,
    /// An MCP tool whose annotations say it may destroy data (MCP's default when a
    /// server says nothing) — or, with `false`, one that says it does not.
    pub mcp_destructive: Option<bool>,
}

/// Who must approve (as a workflow's `approvers:`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Require {
    /// Roles that may approve.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Token names that may approve.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Distinct approvers needed (default 1).
    pub min: Option<u32>,
    /// Whether the run's submitter is refused.
    #[serde(default)]
    pub forbid_self: bool,
}

/// What is known of a call when a rule is matched. At validation some facts are
/// unknown (`None`): a templated URL's host, an MCP tool's annotations.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// The workflow's tool name.
    pub tool: &'a str,
    /// The tool's kind.
    pub kind: &'a str,
    /// The HTTP method.
    pub method: Option<&'a str>,
    /// The URL's host.
    pub host: Option<String>,
    /// For an MCP tool: whether its annotations say destructive.
    pub mcp_destructive: Option<bool>,
}

/// Whether a rule gates a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gates {
    /// It does.
    Yes,
    /// It does not.
    No,
    /// It depends on what is known only at call time (the host, the annotations).
    Maybe,
}

impl ApprovalRule {
    /// The rule's name in messages.
    pub fn label(&self, index: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("policy.approvals[{index}]"))
    }

    /// Whether this rule gates a call with `facts`.
    pub fn gates(&self, f: &Facts<'_>) -> Gates {
        let m = &self.matches;
        let any = |v: &Option<OneOrMany>, x: &str, case: bool| {
            v.as_ref().is_none_or(|v| {
                v.values().iter().any(|p| {
                    if case {
                        p.eq_ignore_ascii_case(x)
                    } else {
                        *p == x
                    }
                })
            })
        };
        if !any(&m.tool_kind, f.kind, false) || !any(&m.tool, f.tool, false) {
            return Gates::No;
        }
        if m.method.is_some() && !f.method.is_some_and(|x| any(&m.method, x, true)) {
            return Gates::No;
        }
        let mut maybe = false;
        if let Some(hosts) = &m.host {
            match &f.host {
                Some(h) => {
                    let list = flow_adapters::egress::AllowList::new(hosts.values());
                    if !list.allows(h) {
                        return Gates::No;
                    }
                }
                None if f.kind == "http" || f.kind == "mcp" => maybe = true,
                None => return Gates::No,
            }
        }
        if let Some(want) = m.mcp_destructive {
            if f.kind != "mcp" {
                return Gates::No;
            }
            match f.mcp_destructive {
                Some(d) if d != want => return Gates::No,
                Some(_) => {}
                None => maybe = true,
            }
        }
        if maybe { Gates::Maybe } else { Gates::Yes }
    }

    /// The approval this rule asks for.
    pub fn approval(&self) -> ApprovalDecl {
        let timeout = self
            .timeout
            .as_deref()
            .and_then(|t| crate::workflow::parse_duration(t).ok())
            .unwrap_or(DEFAULT_TIMEOUT);
        ApprovalDecl {
            pos: crate::workflow::diagnostic::Pos::default(),
            message: None,
            roles: self.require.roles.clone(),
            tokens: self.require.tokens.clone(),
            min: self.require.min.unwrap_or(1).max(1),
            forbid_self: self.require.forbid_self,
            inputs: Vec::new(),
            timeout,
            on_timeout: match self.on_timeout.as_deref() {
                Some("skip") => OnTimeout::Skip,
                _ => OnTimeout::Fail,
            },
            remind: Vec::new(),
        }
    }

    /// Checks the rule when `flow.toml` is loaded: the message says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let m = &self.matches;
        if m.tool_kind.is_none()
            && m.tool.is_none()
            && m.method.is_none()
            && m.host.is_none()
            && m.mcp_destructive.is_none()
        {
            return Err("`match` is empty: it would gate every call; name what it gates".into());
        }
        if let Some(kinds) = &m.tool_kind {
            for k in kinds.values() {
                if !["function", "command", "http", "mcp"].contains(&k) {
                    return Err(format!(
                        "unknown tool_kind `{k}` (function, command, http, mcp)"
                    ));
                }
            }
        }
        if let Some(hosts) = &m.host {
            for h in hosts.values() {
                crate::host_pattern::HostPattern::parse(h)?;
            }
        }
        for r in &self.require.roles {
            if r != "operator" && r != "admin" {
                return Err(format!(
                    "require.roles names `{r}`: approvers are `operator` or `admin`"
                ));
            }
        }
        if self.require.min == Some(0) || self.require.min.is_some_and(|n| n > 20) {
            return Err("require.min must be 1 to 20".into());
        }
        if let Some(t) = &self.timeout {
            crate::workflow::parse_duration(t).map_err(|e| format!("timeout `{t}`: {e}"))?;
        }
        if let Some(o) = &self.on_timeout
            && o != "fail"
            && o != "skip"
        {
            return Err(format!("on_timeout `{o}`: use `fail` or `skip`"));
        }
        Ok(())
    }
}

impl Policy {
    /// The first rule that gates a call with `facts` (for the gateway: facts are known).
    pub fn gate(&self, facts: &Facts<'_>) -> Option<(usize, &ApprovalRule)> {
        self.approvals
            .iter()
            .enumerate()
            .find(|(_, r)| r.gates(facts) == Gates::Yes)
    }

    /// What a node's own approval becomes under the policy: the stricter `min`.
    pub fn merged(own: &ApprovalDecl, rule: &ApprovalRule) -> ApprovalDecl {
        let mut out = own.clone();
        out.min = out.min.max(rule.require.min.unwrap_or(1));
        out
    }
}

/// What the policy does to one node of a workflow, as `flow validate --config` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGate {
    /// The node.
    pub node: String,
    /// The rule's name.
    pub rule: String,
    /// `Yes` or `Maybe` (decided at call time).
    pub gates: Gates,
}

impl Policy {
    /// The nodes of `wf` this policy gates, or may gate (what is known only at call time:
    /// a templated URL's host, an MCP tool's annotations), first matching rule each.
    pub fn gated_nodes(&self, wf: &crate::workflow::Workflow) -> Vec<NodeGate> {
        use crate::workflow::tool::{McpServer, ToolKind};
        let host_of =
            |t: &crate::workflow::expr::Template| t.as_literal().and_then(|u| literal_host(&u));
        let mut out = Vec::new();
        for node in &wf.nodes {
            let Some(tool) = wf.tool_of(node) else {
                continue;
            };
            let (method, host, destructive) = match &tool.kind {
                ToolKind::Http(h) => (Some(h.method.as_str()), host_of(&h.url), None),
                ToolKind::Mcp(m) => match &m.server {
                    McpServer::Http { url, .. } => (None, host_of(url), tool.read_only.map(|r| !r)),
                    McpServer::Stdio { .. } => (None, None, tool.read_only.map(|r| !r)),
                },
                _ => (None, None, None),
            };
            let facts = Facts {
                tool: &tool.name,
                kind: tool.kind.name(),
                method,
                host,
                mcp_destructive: destructive,
            };
            let found = self
                .approvals
                .iter()
                .enumerate()
                .map(|(i, r)| (i, r, r.gates(&facts)))
                .find(|(_, _, g)| *g != Gates::No);
            if let Some((i, r, gates)) = found {
                out.push(NodeGate {
                    node: node.id.clone(),
                    rule: r.label(i),
                    gates,
                });
            }
        }
        out
    }
}

/// The host of a literal URL (`https://api.example.com:443/x` → `api.example.com`).
fn literal_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        host.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(toml_text: &str) -> ApprovalRule {
        toml::from_str(toml_text).expect("rule")
    }

    fn facts<'a>(kind: &'a str, method: Option<&'a str>, host: Option<&str>) -> Facts<'a> {
        Facts {
            tool: "t",
            kind,
            method,
            host: host.map(str::to_owned),
            mcp_destructive: None,
        }
    }

    #[test]
    fn what_a_rule_gates() {
        let stripe = rule(
            "match = { tool_kind = \"http\", method = [\"POST\", \"DELETE\"], host = \"*.stripe.com\" }",
        );
        let destructive = rule("match = { mcp_destructive = true }");
        let table = [
            (
                &stripe,
                facts("http", Some("POST"), Some("api.stripe.com")),
                Gates::Yes,
            ),
            (
                &stripe,
                facts("http", Some("post"), Some("api.stripe.com")),
                Gates::Yes,
            ),
            (
                &stripe,
                facts("http", Some("GET"), Some("api.stripe.com")),
                Gates::No,
            ),
            (
                &stripe,
                facts("http", Some("POST"), Some("example.com")),
                Gates::No,
            ),
            (&stripe, facts("http", Some("POST"), None), Gates::Maybe),
            (
                &stripe,
                facts("mcp", None, Some("api.stripe.com")),
                Gates::No,
            ),
            (&destructive, facts("http", Some("POST"), None), Gates::No),
            (&destructive, facts("mcp", None, None), Gates::Maybe),
            (
                &destructive,
                Facts {
                    mcp_destructive: Some(true),
                    ..facts("mcp", None, None)
                },
                Gates::Yes,
            ),
            (
                &destructive,
                Facts {
                    mcp_destructive: Some(false),
                    ..facts("mcp", None, None)
                },
                Gates::No,
            ),
        ];
        for (i, (r, f, want)) in table.into_iter().enumerate() {
            assert_eq!(r.gates(&f), want, "row {i}: {f:?}");
        }
    }

    #[test]
    fn rules_are_checked_when_loaded() {
        assert!(
            rule("match = {}").check().is_err(),
            "an empty match gates everything"
        );
        assert!(rule("match = { tool_kind = \"ftp\" }").check().is_err());
        assert!(rule("match = { host = \"https://x\" }").check().is_err());
        assert!(
            rule("match = { tool_kind = \"http\" }\nrequire = { roles = [\"viewer\"] }")
                .check()
                .is_err()
        );
        assert!(
            rule("match = { tool_kind = \"http\" }\ntimeout = \"soon\"")
                .check()
                .is_err()
        );
        assert!(
            rule("match = { tool_kind = \"http\" }\nrequire = { min = 0 }")
                .check()
                .is_err()
        );
        let ok = rule(
            "match = { tool_kind = \"http\" }\nrequire = { roles = [\"admin\"], min = 2 }\ntimeout = \"2h\"",
        );
        assert!(ok.check().is_ok());
        let a = ok.approval();
        assert_eq!(
            (a.min, a.timeout, a.roles),
            (2, Duration::from_secs(7200), vec!["admin".to_owned()])
        );
    }
}

//! Checks that need the whole workflow: references between nodes, tools and inputs,
//! cycles, and what each expression may see.

use std::collections::{BTreeSet, HashMap};

use super::diagnostic::{Diagnostic, Pos, did_you_mean};
use super::expr::{Template, references};
use super::model::Workflow;
use super::tool::ToolKind;
use crate::plan::Plan;

/// Where an expression appears; decides which names it may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope<'a> {
    /// A node's `with`: inputs, ancestors' outputs, run, secrets.
    With { node: usize },
    /// A node's `if` or `idempotency_key`: no secrets (they would be stored or logged).
    NodeField { node: usize, field: &'a str },
    /// A tool's spec: inputs, `with`, run, secrets; node outputs come in through `with`.
    Tool,
    /// A tool's `reconcile` request: inputs, run, `call`, secrets.
    Probe { tool: &'a str },
    /// A tool's `reconcile` verdicts and output: inputs, run, `call`, `response`; no
    /// secrets (what they produce is stored).
    ProbeAnswer { tool: &'a str },
}

/// What `call.…` offers a probe (`gateway::reconcile` builds it).
const CALL_FIELDS: &[&str] = &["key", "request", "outbound_at", "attempt", "tool"];

/// Options for validation that depend on the embedding program.
#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    /// Function names that exist (`None` = do not check function names).
    pub functions: Option<BTreeSet<String>>,
    /// Function names that are pure (an `approval:` on a node calling one is refused).
    pub pure_functions: BTreeSet<String>,
}

/// Runs every cross-reference check, appending to `diags`; returns the plan it built
/// (`None` when the workflow has a cycle).
pub(crate) fn check(
    wf: &Workflow,
    opts: &ValidateOptions,
    declared_tools: &[String],
    diags: &mut Vec<Diagnostic>,
) -> Option<Plan> {
    let index = wf.node_positions();
    let node_ids: Vec<&str> = wf.nodes.iter().map(|n| n.id.as_str()).collect();
    let tool_names: Vec<&str> = wf.tools.keys().map(String::as_str).collect();

    for node in &wf.nodes {
        if let Some(call) = node.call()
            && !call.tool.is_empty()
            && !declared_tools.contains(&call.tool)
        {
            let mut d = Diagnostic::new(
                call.tool_pos,
                format!("node `{}` uses unknown tool `{}`", node.id, call.tool),
            );
            if let Some(near) = did_you_mean(&call.tool, tool_names.iter().copied()) {
                d = d.with_help(format!("did you mean `{near}`?"));
            } else if tool_names.is_empty() {
                d = d.with_help("declare it under `tools:`");
            }
            diags.push(d);
        }
        for (need, pos) in node.needs.iter().zip(&node.needs_pos) {
            if !index.contains_key(need.as_str()) {
                let mut d = Diagnostic::new(
                    *pos,
                    format!("node `{}` needs unknown node `{need}`", node.id),
                );
                if let Some(near) = did_you_mean(need, node_ids.iter().copied()) {
                    d = d.with_help(format!("did you mean `{near}`?"));
                }
                diags.push(d);
            }
        }
    }

    if let Some(functions) = &opts.functions {
        for tool in wf.tools.values() {
            if let ToolKind::Function { function } = &tool.kind
                && !functions.contains(function)
            {
                let mut d = Diagnostic::new(
                    tool.pos,
                    format!("tool `{}` names unknown function `{function}`", tool.name),
                );
                if let Some(near) = did_you_mean(function, functions.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{near}`?"));
                }
                diags.push(d);
            }
        }
    }

    let plan = match Plan::new(wf) {
        Ok(plan) => Some(plan),
        Err(cycles) => {
            for cycle in cycles {
                let mut names: Vec<&str> = cycle.iter().map(|&i| wf.nodes[i].id.as_str()).collect();
                names.push(names[0]);
                let first = &wf.nodes[cycle[0]];
                diags.push(
                    Diagnostic::new(
                        first.pos,
                        format!("dependency cycle: {}", names.join(" -> ")),
                    )
                    .with_help("a workflow is a DAG: remove one of these `needs`"),
                );
            }
            None
        }
    };
    let ancestors = plan.as_ref().map(Plan::ancestors);

    let mut checker = RefChecker {
        wf,
        index: &index,
        ancestors: ancestors.as_deref(),
        diags,
    };
    for i in 0..wf.nodes.len() {
        check_node(&mut checker, opts, i);
    }
    for tool in wf.tools.values() {
        for t in tool.kind.templates() {
            checker.template(t, Scope::Tool);
        }
        if let Some(r) = &tool.reconcile {
            let name = tool.name.as_str();
            for t in r.request_templates() {
                checker.template(t, Scope::Probe { tool: name });
            }
            for t in r.answer_templates() {
                checker.template(t, Scope::ProbeAnswer { tool: name });
            }
        }
    }
    plan
}

/// What a node's own expressions may read: `with`, `if`, `idempotency_key`, its
/// approval and its wait.
fn check_node(checker: &mut RefChecker<'_>, opts: &ValidateOptions, i: usize) {
    let node = &checker.wf.nodes[i];
    for t in node.with.templates() {
        checker.template(t, Scope::With { node: i });
    }
    let fields = [
        ("if", &node.condition),
        ("idempotency_key", &node.idempotency_key),
    ];
    for (field, t) in fields {
        if let Some(t) = t {
            checker.template(t, Scope::NodeField { node: i, field });
        }
    }
    check_approval(checker, opts, i);
    check_wait(checker, i);
    check_for_each(checker, i);
}

/// A `for_each:` node: its list reads what an `if:` may, its key reads `item`; and
/// what is still keyed by node alone (a wait, a callback) is refused on it.
fn check_for_each(checker: &mut RefChecker<'_>, i: usize) {
    let node = &checker.wf.nodes[i];
    let Some(fe) = &node.for_each else {
        return;
    };
    for t in fe.items.templates() {
        checker.template(
            t,
            Scope::NodeField {
                node: i,
                field: "for_each.items",
            },
        );
    }
    checker.template(
        &fe.key,
        Scope::NodeField {
            node: i,
            field: "for_each.key",
        },
    );
    if let Some(k) = &node.idempotency_key {
        let reads_item = k
            .exprs()
            .flat_map(crate::workflow::expr::references)
            .any(|p| p == "item" || p.starts_with("item."));
        if !reads_item {
            checker.error(
                k.pos,
                format!("`idempotency_key` of `for_each` node `{}` does not read `item`: every item would have the same key", node.id),
                Some("put the item's identity in it: `idempotency_key: \"refund-${{ item.id }}\"`".into()),
            );
        }
    }
    let unsupported = [
        ("wait", node.wait().is_some()),
        ("callback", node.callback().is_some()),
    ];
    for (what, set) in unsupported {
        if set {
            checker.error(
                fe.pos,
                format!(
                    "node `{}` has `for_each:` and `{what}:`, which cannot be combined yet",
                    node.id
                ),
                Some(format!(
                    "put the `{what}:` on a node before or after the fan-out"
                )),
            );
        }
    }
}

/// A node's `approval:`: its message reads what an `if:` may (no secrets), and a node
/// whose tool is a pure function has nothing to approve.
fn check_approval(checker: &mut RefChecker<'_>, opts: &ValidateOptions, i: usize) {
    let wf = checker.wf;
    let node = &wf.nodes[i];
    let Some(call) = node.call() else {
        return;
    };
    if let Some(t) = call.approval.as_ref().and_then(|a| a.message.as_ref()) {
        checker.template(
            t,
            Scope::NodeField {
                node: i,
                field: "approval.message",
            },
        );
    }
    if let Some(cb) = &call.callback
        && let Some(tool) = wf.tools.get(&call.tool)
        && let ToolKind::Function { function } = &tool.kind
        && opts.pure_functions.contains(function)
    {
        checker.error(
            cb.pos,
            format!(
                "node `{}` has `callback:`, but its tool `{}` is a pure function: nothing leaves the process to call back",
                node.id, call.tool
            ),
            Some("put `callback:` on the node whose call starts the outside work".into()),
        );
    }
    if let Some(a) = &call.approval
        && let Some(tool) = wf.tools.get(&call.tool)
        && let ToolKind::Function { function } = &tool.kind
        && opts.pure_functions.contains(function)
    {
        checker.error(
            a.pos,
            format!(
                "node `{}` asks for approval, but its tool `{}` is a pure function: nothing leaves the process, so there is nothing to approve",
                node.id, call.tool
            ),
            Some("put `approval:` on the node whose call has the side effect".into()),
        );
    }
}

/// A `wait:` node's `match` (what an `if:` may read, plus `event`); a node whose tool
/// spec reads `callback` must declare `callback:` (else the URL would not exist).
fn check_wait(checker: &mut RefChecker<'_>, i: usize) {
    let wf = checker.wf;
    let node = &wf.nodes[i];
    if let Some(t) = node.wait().and_then(|w| w.matcher.as_ref()) {
        checker.template(
            t,
            Scope::NodeField {
                node: i,
                field: "wait.event.match",
            },
        );
    }
    let Some(call) = node.call() else {
        return;
    };
    let reads_callback = wf.tools.get(&call.tool).is_some_and(|tool| {
        tool.kind.templates().iter().any(|t| {
            t.exprs().any(|src| {
                references(src)
                    .iter()
                    .any(|p| p == "callback" || p.starts_with("callback."))
            })
        })
    });
    if reads_callback && call.callback.is_none() {
        checker.error(
            call.tool_pos,
            format!(
                "node `{}` calls tool `{}`, whose spec reads `callback`, but the node has no `callback:`",
                node.id, call.tool
            ),
            Some("add `callback: { timeout: … }` to the node".into()),
        );
    }
}

/// Whether an expression is exactly `secrets.<NAME>`: the only way a secret may be used,
/// because scrubbing finds a value and its encodings, not what a filter, operator or
/// slice made of it (`secrets.X | upper`, `secrets.X ~ "y"`, `secrets.X[1:]`).
fn is_plain_secret(src: &str) -> bool {
    src.trim().strip_prefix("secrets.").is_some_and(|name| {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Whether `secrets` occurs in an expression as a name (outside string literals).
fn mentions_secrets(src: &str) -> bool {
    let bytes = src.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 1;
            } else if b == q {
                quote = None;
            }
        } else if b == b'"' || b == b'\'' {
            quote = Some(b);
        } else if bytes[i..].starts_with(b"secrets")
            && (i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == b'.'))
            && bytes.get(i + 7).is_none_or(|&n| !ident(n))
        {
            return true;
        }
        i += 1;
    }
    false
}

struct RefChecker<'a> {
    wf: &'a Workflow,
    index: &'a HashMap<&'a str, usize>,
    ancestors: Option<&'a [fixedbitset::FixedBitSet]>,
    diags: &'a mut Vec<Diagnostic>,
}

/// Globals of the expression language that are not workflow data.
const LANGUAGE_GLOBALS: &[&str] = &["range", "dict", "namespace", "true", "false", "none"];

impl RefChecker<'_> {
    fn template(&mut self, t: &Template, scope: Scope<'_>) {
        for src in t.exprs() {
            let paths = references(src);
            // minijinja reports no variables for some forms (`secrets.X[0:8]`), so the
            // source is searched for the name too.
            let reads_secret = mentions_secrets(src)
                || paths
                    .iter()
                    .any(|p| p == "secrets" || p.starts_with("secrets."));
            let no_secrets = matches!(scope, Scope::NodeField { .. } | Scope::ProbeAnswer { .. });
            if reads_secret && !no_secrets && !is_plain_secret(src) {
                let where_ = self.where_(scope);
                self.error(
                    t.pos,
                    format!("`{src}` in {where_} applies an operation to a secret"),
                    Some("a secret may only appear alone, as `${{ secrets.<NAME> }}` (inside a longer string is fine): a value derived from it could not be scrubbed from what flow stores and logs".into()),
                );
            }
            let listed = paths
                .iter()
                .any(|p| p == "secrets" || p.starts_with("secrets."));
            if reads_secret && !listed && no_secrets {
                self.reference(t.pos, src, "secrets.?", scope);
            }
            for path in paths {
                self.reference(t.pos, src, &path, scope);
            }
        }
    }

    fn where_(&self, scope: Scope<'_>) -> String {
        match scope {
            Scope::With { node } => format!("`with` of node `{}`", self.wf.nodes[node].id),
            Scope::NodeField { node, field } => {
                format!("`{field}` of node `{}`", self.wf.nodes[node].id)
            }
            Scope::Tool => "a tool spec".to_string(),
            Scope::Probe { tool } => format!("`reconcile.request` of tool `{tool}`"),
            Scope::ProbeAnswer { tool } => format!("`reconcile` of tool `{tool}`"),
        }
    }

    fn error(&mut self, pos: Pos, message: String, help: Option<String>) {
        let mut d = Diagnostic::new(pos, message);
        d.help = help;
        self.diags.push(d);
    }

    /// A `nodes.<id>.output` reference: only node fields and `with` see node outputs,
    /// and only of a known node that is an ancestor of the reader.
    fn node_reference(&mut self, pos: Pos, src: &str, path: &str, scope: Scope<'_>) {
        let mut parts = path.split('.').skip(1);
        let (second, third) = (parts.next(), parts.next());
        let where_ = self.where_(scope);
        let (Scope::With { node } | Scope::NodeField { node, .. }) = scope else {
            self.error(
                pos,
                format!("`{src}` in {where_} reads node outputs, which tool specs cannot see"),
                Some(
                    "pass the value through the node's `with:` and read `with.<name>` in the tool"
                        .into(),
                ),
            );
            return;
        };
        let Some(target) = second else {
            self.error(
                pos,
                format!("`{src}` in {where_} reads `nodes` as a whole"),
                Some("read one node's output: `nodes.<id>.output`".into()),
            );
            return;
        };
        let Some(&t) = self.index.get(target) else {
            let ids: Vec<&str> = self.wf.nodes.iter().map(|n| n.id.as_str()).collect();
            let help = did_you_mean(target, ids.iter().copied())
                .map(|n| format!("did you mean `nodes.{n}`?"));
            self.error(
                pos,
                format!("`{src}` in {where_} reads unknown node `{target}`"),
                help,
            );
            return;
        };
        let rest = [third, parts.next(), parts.next()];
        if !self.exposes(pos, src, target, t, rest, &where_) {
            return;
        }
        if let Some(ancestors) = self.ancestors
            && !ancestors[node].contains(t)
        {
            let me = &self.wf.nodes[node].id;
            self.error(
                pos,
                format!(
                    "`{src}` in {where_} reads node `{target}`, which is not an ancestor of `{me}`"
                ),
                Some(format!(
                    "add `{target}` to `needs` of `{me}` (directly or through another node)"
                )),
            );
        }
    }

    /// Whether node `target` (index `t`) exposes `nodes.<target>.<third>.<fourth>.<fifth>`:
    /// its `output`, and with an approval `approval.by` and `approval.inputs[.<declared>]`.
    fn exposes(
        &mut self,
        pos: Pos,
        src: &str,
        target: &str,
        t: usize,
        [third, fourth, fifth]: [Option<&str>; 3],
        where_: &str,
    ) -> bool {
        // Each item of a `for_each` node has its own approval: the node exposes none.
        let approval = (self.wf.nodes[t].for_each.is_none())
            .then(|| self.wf.nodes[t].approval())
            .flatten();
        match (third, approval) {
            (Some("output"), _) => true,
            (Some("approval"), Some(a)) => {
                let declared = |n: &str| a.inputs.iter().any(|i| i.name == n);
                let ok = match fourth {
                    None | Some("by") => true,
                    Some("inputs") => fifth.is_none_or(declared),
                    Some(_) => false,
                };
                if !ok {
                    let names: Vec<&str> = a.inputs.iter().map(|i| i.name.as_str()).collect();
                    let message = format!(
                        "`{src}` in {where_}: the approval of `{target}` gives `by` and `inputs` ({})",
                        names.join(", ")
                    );
                    self.error(pos, message, None);
                }
                ok
            }
            _ => {
                let also =
                    approval.map_or(String::new(), |_| format!(" and `nodes.{target}.approval`"));
                let message = format!(
                    "`{src}` in {where_}: a node exposes only `nodes.{target}.output`{also}"
                );
                self.error(pos, message, None);
                false
            }
        }
    }

    fn reference(&mut self, pos: Pos, src: &str, path: &str, scope: Scope<'_>) {
        let mut parts = path.split('.');
        let root = parts.next().unwrap_or_default();
        let second = parts.next();
        let where_ = self.where_(scope);
        match root {
            "inputs" => match second {
                Some(name) if self.wf.input(name).is_some() => {}
                Some(name) => {
                    let names: Vec<&str> = self.wf.inputs.iter().map(|i| i.name.as_str()).collect();
                    let help = did_you_mean(name, names.iter().copied())
                        .map(|n| format!("did you mean `inputs.{n}`?"))
                        .or_else(|| {
                            Some(format!(
                                "declare it under `inputs:` (declared: {})",
                                if names.is_empty() {
                                    "none".to_string()
                                } else {
                                    names.join(", ")
                                }
                            ))
                        });
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads unknown input `{name}`"),
                        help,
                    );
                }
                None => self.error(
                    pos,
                    format!("`{src}` in {where_} reads `inputs` as a whole"),
                    Some("read one input: `inputs.<name>`".into()),
                ),
            },
            "nodes" => self.node_reference(pos, src, path, scope),
            "call" => self.call_reference(pos, src, second, scope),
            "response" => {
                if !matches!(scope, Scope::ProbeAnswer { .. }) {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads `response`, which only `reconcile.found`, `not_found` and `output` can see"),
                        None,
                    );
                }
            }
            "secrets" => {
                if let Scope::ProbeAnswer { .. } = scope {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads a secret; a probe's verdicts and output are stored, so they must not hold secrets"),
                        Some("secrets may appear in `reconcile.request` (url, headers, query)".into()),
                    );
                } else if let Scope::NodeField { field, .. } = scope {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads a secret; secrets are only visible in `with` and tool specs"),
                        Some(format!("`{field}` values are stored and logged, so they must not hold secrets")),
                    );
                } else if second.is_none() {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads `secrets` as a whole"),
                        Some("read one secret: `secrets.<NAME>`".into()),
                    );
                }
            }
            "run" => {
                if second != Some("id") {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads `{path}`; a run exposes only `run.id`"),
                        None,
                    );
                }
            }
            "event" => self.event_reference(pos, src, scope),
            "item" => self.item_reference(pos, src, scope),
            "callback" => self.callback_reference(pos, src, second, scope),
            "with" => {
                if !matches!(scope, Scope::Tool) {
                    self.error(
                        pos,
                        format!("`{src}` in {where_} reads `with`, which only tool specs can see"),
                        Some("read the value directly (`inputs.…`, `nodes.<id>.output…`)".into()),
                    );
                }
            }
            other if LANGUAGE_GLOBALS.contains(&other) => {}
            other => {
                let roots = match scope {
                    Scope::Tool => "inputs, with, run, secrets",
                    Scope::Probe { .. } => "inputs, run, call, secrets",
                    Scope::ProbeAnswer { .. } => "inputs, run, call, response",
                    _ => "inputs, nodes, run, secrets",
                };
                let help = did_you_mean(
                    other,
                    [
                        "inputs", "nodes", "run", "secrets", "with", "call", "response",
                    ],
                )
                .map_or_else(
                    || format!("expressions here can read: {roots}"),
                    |n| format!("did you mean `{n}`?"),
                );
                self.error(
                    pos,
                    format!("`{src}` in {where_} reads unknown name `{other}`"),
                    Some(help),
                );
            }
        }
    }

    /// An `item` reference: only a `for_each` node's `with`, `idempotency_key` and
    /// `for_each.key` see the item they are rendered for (its `if` and its list are
    /// evaluated once for the whole node).
    fn item_reference(&mut self, pos: Pos, src: &str, scope: Scope<'_>) {
        let allowed = match scope {
            Scope::With { node } => self.wf.nodes[node].for_each.is_some(),
            Scope::NodeField { node, field } => {
                self.wf.nodes[node].for_each.is_some()
                    && matches!(
                        field,
                        "idempotency_key" | "for_each.key" | "approval.message"
                    )
            }
            _ => false,
        };
        if !allowed {
            let where_ = self.where_(scope);
            self.error(
                pos,
                format!("`{src}` in {where_} reads `item`, which only the `with`, `idempotency_key`, `approval.message` and `for_each.key` of a `for_each` node can see"),
                Some("add `for_each: { items: …, key: … }` to the node, or remove the reference".into()),
            );
        }
    }

    /// An `event` reference: only a `wait:` node's `match` sees the event it tests.
    fn event_reference(&mut self, pos: Pos, src: &str, scope: Scope<'_>) {
        if !matches!(
            scope,
            Scope::NodeField {
                field: "wait.event.match",
                ..
            }
        ) {
            let where_ = self.where_(scope);
            self.error(
                pos,
                format!(
                    "`{src}` in {where_} reads `event`, which only a `wait:` node's `match` can see"
                ),
                Some("a later node reads the event as `nodes.<wait node>.output`".into()),
            );
        }
    }

    /// A `callback.url` / `callback.token` reference: only the `with` of a node with
    /// `callback:` and tool specs see it (the gateway refuses to render it for a node
    /// without one); never `if` or a key, which are stored as written.
    fn callback_reference(&mut self, pos: Pos, src: &str, field: Option<&str>, scope: Scope<'_>) {
        let where_ = self.where_(scope);
        let allowed = match scope {
            Scope::With { node } => self.wf.nodes[node].callback().is_some(),
            Scope::Tool => true,
            _ => false,
        };
        if !allowed {
            self.error(
                pos,
                format!("`{src}` in {where_} reads `callback`, which only the `with` of a node with `callback:` and tool specs can see"),
                Some("add `callback: { timeout: … }` to the node, or remove the reference".into()),
            );
        } else if !matches!(field, Some("url" | "token")) {
            self.error(
                pos,
                format!(
                    "`{src}` in {where_}: a callback exposes `callback.url` and `callback.token`"
                ),
                None,
            );
        }
    }

    /// A `call.<field>` reference: only a probe sees the call it asks about.
    fn call_reference(&mut self, pos: Pos, src: &str, field: Option<&str>, scope: Scope<'_>) {
        let where_ = self.where_(scope);
        if !matches!(scope, Scope::Probe { .. } | Scope::ProbeAnswer { .. }) {
            self.error(
                pos,
                format!(
                    "`{src}` in {where_} reads `call`, which only a tool's `reconcile` can see"
                ),
                None,
            );
            return;
        }
        match field {
            Some(f) if CALL_FIELDS.contains(&f) => {}
            _ => self.error(
                pos,
                format!(
                    "`{src}` in {where_}: a call exposes {}",
                    CALL_FIELDS
                        .iter()
                        .map(|f| format!("`call.{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None,
            ),
        }
    }
}

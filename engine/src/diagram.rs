//! Drawing a workflow's DAG as Mermaid or Graphviz DOT, for docs and reviews.

use std::fmt::Write;

use crate::plan::Plan;
use crate::workflow::{NodeKind, Workflow};

/// Output formats of `flow graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GraphFormat {
    /// Mermaid `flowchart` (renders on GitHub).
    Mermaid,
    /// Graphviz DOT.
    Dot,
}

fn label(wf: &Workflow, i: usize) -> String {
    let node = &wf.nodes[i];
    let mut label = match &node.kind {
        NodeKind::Wait(w) => format!("{}\nwait ({})", node.id, w.event),
        NodeKind::Child(c) => format!("{}\nworkflow ({})", node.id, c.path),
        NodeKind::Call(call) => {
            let kind = wf.tools.get(&call.tool).map_or("?", |t| t.kind.name());
            format!("{}\n{} ({kind})", node.id, call.tool)
        }
    };
    if node.condition.is_some() {
        label.push_str("\nif …");
    }
    label
}

/// Renders the plan in the given format; nodes appear in topological order.
pub fn draw(wf: &Workflow, plan: &Plan, format: GraphFormat) -> String {
    let mut out = String::new();
    match format {
        GraphFormat::Mermaid => {
            out.push_str("flowchart TD\n");
            for &i in plan.order() {
                let text = label(wf, i).replace('"', "#quot;").replace('\n', "<br/>");
                let _ = writeln!(out, "  {}[\"{text}\"]", mermaid_id(&wf.nodes[i].id));
            }
            for &i in plan.order() {
                for &c in plan.children(i) {
                    let _ = writeln!(
                        out,
                        "  {} --> {}",
                        mermaid_id(&wf.nodes[i].id),
                        mermaid_id(&wf.nodes[c].id)
                    );
                }
            }
        }
        GraphFormat::Dot => {
            let _ = writeln!(out, "digraph {} {{", dot_quote(&wf.name));
            out.push_str("  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n");
            for &i in plan.order() {
                let _ = writeln!(
                    out,
                    "  {} [label={}];",
                    dot_quote(&wf.nodes[i].id),
                    dot_quote(&label(wf, i))
                );
            }
            for &i in plan.order() {
                for &c in plan.children(i) {
                    let _ = writeln!(
                        out,
                        "  {} -> {};",
                        dot_quote(&wf.nodes[i].id),
                        dot_quote(&wf.nodes[c].id)
                    );
                }
            }
            out.push_str("}\n");
        }
    }
    out
}

/// Mermaid ids cannot hold `-`; node ids are `[a-z0-9_-]`, so mapping `-` to `__` is safe
/// enough for display and keeps ids readable.
fn mermaid_id(id: &str) -> String {
    format!("n_{}", id.replace('-', "__"))
}

fn dot_quote(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::parse_str;

    #[test]
    fn mermaid_and_dot_show_every_edge() {
        let wf = parse_str(
            "tools:\n  t: { kind: function, function: core.echo }\nnodes:\n  a: { tool: t }\n  b-2: { tool: t, needs: [a] }\n",
            "x.yaml",
        )
        .expect("valid");
        let plan = Plan::new(&wf).expect("acyclic");
        let m = draw(&wf, &plan, GraphFormat::Mermaid);
        assert!(m.contains("n_a --> n_b__2"), "{m}");
        let d = draw(&wf, &plan, GraphFormat::Dot);
        assert!(d.contains("\"a\" -> \"b-2\";"), "{d}");
        assert!(d.starts_with("digraph \"x\" {"), "{d}");
    }
}

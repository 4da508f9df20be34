//! A run's DAG drawn as SVG on the server, from the plan `flow graph` draws (the run's
//! stored workflow, validated again): no script and no layout library in the browser,
//! so the picture is there with JavaScript off and under the strict CSP.
//!
//! The layout is layered: a node's row is one below its deepest parent (the plan's
//! topological order makes that one pass), nodes of a row are left to right in plan
//! order, rows are centred. Each node is a link to its row of the nodes table
//! (`#node-<id>`) and carries its state as a class (`st-<state>`, the colours of
//! console.css, whose contrast the tests check) and as text, so the state is never told
//! by colour alone.

use std::fmt::Write as _;

use crate::workflow::{NodeKind, ValidWorkflow};

/// A node box's size and the gaps between boxes, in SVG user units (px at 100%).
const W: usize = 150;
const H: usize = 46;
const GAP_X: usize = 24;
const GAP_Y: usize = 40;
const PAD: usize = 8;

/// Longest node id drawn whole; longer ones are cut with `…` (the whole id is in the
/// box's tooltip and in the table row it links to).
const MAX_LABEL: usize = 18;

/// Most nodes drawn: past it a picture is unreadable and the page heavy; the page says
/// so and `flow graph` draws it instead.
pub(super) const MAX_NODES: usize = 300;

/// `s` escaped for XML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn label(id: &str) -> String {
    if id.chars().count() <= MAX_LABEL {
        return id.to_string();
    }
    let cut: String = id.chars().take(MAX_LABEL - 1).collect();
    format!("{cut}…")
}

/// Each node's (row, column), indexed like `wf.nodes`, and the widest row's width.
fn layout(wf: &ValidWorkflow) -> (Vec<(usize, usize)>, usize) {
    let plan = wf.plan();
    let mut row = vec![0usize; wf.nodes.len()];
    for &i in plan.order() {
        row[i] = plan
            .parents(i)
            .iter()
            .map(|&p| row[p] + 1)
            .max()
            .unwrap_or(0);
    }
    let rows = row.iter().copied().max().map_or(0, |m| m + 1);
    let mut filled = vec![0usize; rows];
    let mut at = vec![(0, 0); wf.nodes.len()];
    for &i in plan.order() {
        at[i] = (row[i], filled[row[i]]);
        filled[row[i]] += 1;
    }
    // Centre each row under the widest: shift its columns by half the difference,
    // counted in half boxes so odd differences centre too (stored doubled).
    let widest = filled.iter().copied().max().unwrap_or(0);
    for a in &mut at {
        a.1 = a.1 * 2 + (widest - filled[a.0]);
    }
    (at, widest)
}

/// The top-left corner of the box at (row, doubled column).
fn corner(at: (usize, usize)) -> (usize, usize) {
    let (row, col2) = at;
    (PAD + col2 * (W + GAP_X) / 2, PAD + row * (H + GAP_Y))
}

/// The SVG of `wf`'s DAG, each node coloured by `state(id)` (`None`: not started).
/// `None` when the workflow has more than [`MAX_NODES`] nodes.
pub(super) fn svg(wf: &ValidWorkflow, state: impl Fn(&str) -> Option<String>) -> Option<String> {
    let n = wf.nodes.len();
    if n > MAX_NODES {
        return None;
    }
    let (at, widest) = layout(wf);
    let rows = at.iter().map(|a| a.0 + 1).max().unwrap_or(0);
    let width = 2 * PAD + widest * W + widest.saturating_sub(1) * GAP_X;
    let height = 2 * PAD + rows * H + rows.saturating_sub(1) * GAP_Y;
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="graph" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-labelledby="graph-title"><title id="graph-title">The run's graph: {n} node(s), each coloured by its state and linked to its row below</title><defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path class="g-arrow" d="M0 0L10 5L0 10z"/></marker></defs>"##
    );
    let plan = wf.plan();
    for &i in plan.order() {
        let (x1, y1) = corner(at[i]);
        for &c in plan.children(i) {
            let (x2, y2) = corner(at[c]);
            let (sx, sy, ex, ey) = (x1 + W / 2, y1 + H, x2 + W / 2, y2);
            let mid = (sy + ey) / 2;
            let _ = write!(
                out,
                r#"<path class="g-edge" d="M{sx} {sy}C{sx} {mid} {ex} {mid} {ex} {ey}" marker-end="url(#arrow)"/>"#
            );
        }
    }
    for &i in plan.order() {
        let node = &wf.nodes[i];
        let status = state(&node.id);
        let shown = status.clone().unwrap_or_else(|| "not started".into());
        let class = shown.replace([' ', '_'], "-");
        let (x, y) = corner(at[i]);
        let tool = match &node.kind {
            NodeKind::Child(w) => w.path.as_str(),
            _ => node.step_tool(),
        };
        let (id, tool) = (esc(&node.id), esc(tool));
        let _ = write!(
            out,
            r##"<a href="#node-{id}" class="g-node st-{class}"><title>{id}: {shown} (tool {tool})</title><rect x="{x}" y="{y}" width="{W}" height="{H}" rx="6"/><text x="{tx}" y="{ty1}" class="g-id">{short}</text><text x="{tx}" y="{ty2}" class="g-state">{shown}</text></a>"##,
            shown = esc(&shown),
            class = esc(&class),
            tx = x + W / 2,
            ty1 = y + 19,
            ty2 = y + 36,
            short = esc(&label(&node.id)),
        );
    }
    out.push_str("</svg>");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wf(nodes: &str) -> ValidWorkflow {
        let text =
            format!("tools:\n  t: {{ kind: function, function: core.echo }}\nnodes:\n{nodes}");
        crate::workflow::parse_str(&text, "x.yaml").unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn nodes_are_layered_linked_and_coloured_by_state() {
        let w = wf(
            "  a: { tool: t }\n  b: { tool: t, needs: [a] }\n  c: { tool: t, needs: [a] }\n  d: { tool: t, needs: [b, c] }\n  a_very_long_node_name_indeed: { tool: t }\n",
        );
        let (at, widest) = layout(&w);
        assert_eq!(widest, 2, "b and c side by side, a and the long one too");
        let row = |id: &str| at[w.position(id).unwrap_or(usize::MAX)].0;
        assert_eq!((row("a"), row("b"), row("c"), row("d")), (0, 1, 1, 2));
        let svg = svg(&w, |id| match id {
            "a" => Some("succeeded".into()),
            "b" => Some("paused".into()),
            _ => None,
        })
        .unwrap_or_default();
        for want in [
            r##"<a href="#node-a" class="g-node st-succeeded">"##,
            r##"<a href="#node-b" class="g-node st-paused">"##,
            r##"<a href="#node-d" class="g-node st-not-started">"##,
            ">not started</text>",
            "a_very_long_node_…</text>",
            "<title>a_very_long_node_name_indeed: not started (tool t)</title>",
        ] {
            assert!(svg.contains(want), "{want} in {svg}");
        }
        // One edge per `needs`: a→b, a→c, b→d, c→d.
        assert_eq!(svg.matches(r#"class="g-edge""#).count(), 4, "{svg}");
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"));
        // d is alone in its row, so centred: between b's and c's columns.
        let col = |id: &str| at[w.position(id).unwrap_or(usize::MAX)].1;
        assert_eq!((col("b"), col("c"), col("d")), (0, 2, 1));
    }

    /// WCAG 2 relative luminance of `#rrggbb`.
    fn luminance(hex: &str) -> f64 {
        let channel = |i: usize| {
            let c = f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0)) / 255.0;
            if c <= 0.039_28 {
                c / 12.92
            } else {
                ((c + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5)
    }

    fn contrast(a: &str, b: &str) -> f64 {
        let (x, y) = (luminance(a), luminance(b));
        (x.max(y) + 0.05) / (x.min(y) + 0.05)
    }

    /// The state colours of console.css carry white text (state pills, graph boxes)
    /// and colour text on the white cards and grey page (timeline): each pair keeps
    /// WCAG AA's 4.5:1.
    #[test]
    fn state_colours_keep_aa_contrast() {
        let css = include_str!("assets/console.css");
        let colour = |name: &str| {
            let at = css
                .find(&format!("--{name}: #"))
                .unwrap_or_else(|| panic!("--{name} in console.css"));
            css[at + name.len() + 4..at + name.len() + 11].to_string()
        };
        assert!(contrast("#ffffff", "#000000") > 20.9, "the formula itself");
        assert!(
            contrast("#777777", "#ffffff") < 4.5,
            "a grey that fails, failing"
        );
        let (card, page) = (colour("card"), colour("bg"));
        for name in ["ok", "bad", "warn", "run", "idle", "muted"] {
            let c = colour(name);
            for (on, what) in [
                ("#ffffff", "white text"),
                (card.as_str(), "the card"),
                (page.as_str(), "the page"),
            ] {
                let ratio = contrast(&c, on);
                assert!(
                    ratio >= 4.5,
                    "--{name} {c} against {what} ({on}): {ratio:.2}:1 is under AA"
                );
            }
        }
        for state in ["succeeded", "failed", "paused", "running"] {
            assert!(
                css.contains(&format!(".g-node.st-{state} rect")),
                "the graph colours {state}"
            );
        }
    }

    #[test]
    fn text_is_escaped_and_huge_graphs_are_not_drawn() {
        assert_eq!(esc(r#"<a & "b">'"#), "&lt;a &amp; &quot;b&quot;&gt;&#39;");
        let many: String = (0..=MAX_NODES)
            .map(|i| format!("  n{i}: {{ tool: t }}\n"))
            .collect();
        assert!(svg(&wf(&many), |_| None).is_none());
    }
}

//! Benchmark: validate and plan a generated 10,000-node DAG.
//!
//! Target (issue 2): under 200 ms. Run with `cargo bench --bench validate_plan`.
//! The DAG is layered, 100 nodes wide: each node needs two nodes of the layer above and
//! reads one of their outputs in `with`, so reference checks (ancestors) do real work.

use std::time::{Duration, Instant};

use flow::plan::Plan;
use flow::workflow::parse_str;

fn generate(nodes: usize, width: usize) -> String {
    let mut text = String::from(
        "name: big\ninputs:\n  seed: { type: integer, default: 1 }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n",
    );
    for i in 0..nodes {
        if i >= width {
            let a = i - width;
            let b = i - width + usize::from(i % width + 1 < width);
            text.push_str(&format!(
                "  n{i}: {{ tool: e, needs: [n{a}, n{b}], with: {{ x: \"${{{{ nodes.n{a}.output }}}}\" }} }}\n"
            ));
        } else {
            text.push_str(&format!(
                "  n{i}: {{ tool: e, with: {{ s: \"${{{{ inputs.seed }}}}\" }} }}\n"
            ));
        }
    }
    text
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let text = generate(10_000, 100);
    println!("workflow text: {} bytes, 10000 nodes", text.len());
    let mut validate = Vec::new();
    let mut plan = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let wf = match parse_str(&text, "big.yaml") {
            Ok(wf) => wf,
            Err(d) => {
                eprintln!("generated workflow is invalid:\n{d}");
                std::process::exit(1);
            }
        };
        validate.push(started.elapsed());
        let started = Instant::now();
        let p = Plan::new(&wf).unwrap_or_else(|_| std::process::exit(1));
        let ready = p.ready(|_| false, |_| false);
        plan.push(started.elapsed());
        assert_eq!(ready.len(), 100);
    }
    let (v, p) = (median(validate), median(plan));
    println!("validate (parse + checks, incl. plan for ancestors): median {v:?} over 9 runs");
    println!("plan (petgraph DAG + topological order + ready set):  median {p:?}");
    println!("total: {:?} (target < 200 ms)", v + p);
}

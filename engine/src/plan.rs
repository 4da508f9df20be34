//! Planning: the DAG of a validated workflow, its topological order and ready set.
//!
//! The ready set is a pure function of the graph and what has finished, so the executor's
//! decisions can be tested without a database.

use fixedbitset::FixedBitSet;
use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::workflow::model::Workflow;

/// The DAG of one workflow; nodes are indexed by their position in [`Workflow::nodes`].
#[derive(Debug, Clone)]
pub struct Plan {
    graph: DiGraph<usize, ()>,
    order: Vec<usize>,
    parents: Vec<Vec<usize>>,
    children: Vec<Vec<usize>>,
}

/// A dependency cycle, as node indexes in order (the first is not repeated at the end).
pub type Cycle = Vec<usize>;

impl Plan {
    /// Builds the DAG from `needs`, ignoring references to unknown nodes (validation
    /// reports those). Fails with every cycle found.
    pub fn new(wf: &Workflow) -> Result<Self, Vec<Cycle>> {
        let n = wf.nodes.len();
        let index: std::collections::HashMap<&str, usize> = wf
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.id.as_str(), i))
            .collect();
        let mut graph = DiGraph::with_capacity(n, n);
        let ids: Vec<NodeIndex> = (0..n).map(|i| graph.add_node(i)).collect();
        let mut parents = vec![Vec::new(); n];
        let mut children = vec![Vec::new(); n];
        for (i, node) in wf.nodes.iter().enumerate() {
            for need in &node.needs {
                if let Some(&p) = index.get(need.as_str())
                    && !parents[i].contains(&p)
                {
                    graph.add_edge(ids[p], ids[i], ());
                    parents[i].push(p);
                    children[p].push(i);
                }
            }
        }
        let cycles = find_cycles(&graph, &children);
        if !cycles.is_empty() {
            return Err(cycles);
        }
        let order = topological_order(&parents, &children);
        Ok(Self {
            graph,
            order,
            parents,
            children,
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether the workflow has no nodes.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// Node indexes in an order where every node comes after all it needs (ties in file
    /// order, so output is stable).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Direct dependencies of a node.
    pub fn parents(&self, node: usize) -> &[usize] {
        &self.parents[node]
    }

    /// Direct dependents of a node.
    pub fn children(&self, node: usize) -> &[usize] {
        &self.children[node]
    }

    /// Nodes nothing depends on; their outputs form the run's output.
    pub fn sinks(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.children[i].is_empty())
            .collect()
    }

    /// The petgraph graph (node weight = node index), for rendering and analyses.
    pub fn graph(&self) -> &DiGraph<usize, ()> {
        &self.graph
    }

    /// For each node, the set of its transitive dependencies.
    pub fn ancestors(&self) -> Vec<FixedBitSet> {
        let n = self.len();
        let mut sets = vec![FixedBitSet::with_capacity(n); n];
        for &i in &self.order {
            let mut set = FixedBitSet::with_capacity(n);
            for &p in &self.parents[i] {
                set.union_with(&sets[p]);
                set.insert(p);
            }
            sets[i] = set;
        }
        sets
    }

    /// Nodes that may start now: not yet started, and every dependency settled.
    /// `settled(i)`: node `i` reached a state its dependents can proceed from (succeeded,
    /// skipped, or failed with `continue_on_error`). `started(i)`: node `i` has begun.
    pub fn ready(
        &self,
        settled: impl Fn(usize) -> bool,
        started: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        self.order
            .iter()
            .copied()
            .filter(|&i| !started(i) && self.parents[i].iter().all(|&p| settled(p)))
            .collect()
    }
}

/// Kahn's algorithm with a min-heap on the file index, so ties keep file order.
fn topological_order(parents: &[Vec<usize>], children: &[Vec<usize>]) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut indegree: Vec<usize> = parents.iter().map(Vec::len).collect();
    let mut heap: BinaryHeap<Reverse<usize>> = (0..parents.len())
        .filter(|&i| indegree[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(parents.len());
    while let Some(Reverse(i)) = heap.pop() {
        order.push(i);
        for &c in &children[i] {
            indegree[c] -= 1;
            if indegree[c] == 0 {
                heap.push(Reverse(c));
            }
        }
    }
    order
}

/// One cycle per strongly connected component with a loop, starting at its
/// earliest-declared node and following dependencies in flow direction.
fn find_cycles(graph: &DiGraph<usize, ()>, children: &[Vec<usize>]) -> Vec<Cycle> {
    let mut cycles = Vec::new();
    for component in tarjan_scc(graph) {
        let members: Vec<usize> = component.iter().map(|ix| graph[*ix]).collect();
        let is_loop = members.len() > 1 || children[members[0]].contains(&members[0]);
        if !is_loop {
            continue;
        }
        let Some(&start) = members.iter().min() else {
            continue;
        };
        // Shortest path back to `start` inside the component (BFS), so the cycle named is
        // a real one even when the component holds several.
        let n = children.len();
        let mut inside = FixedBitSet::with_capacity(n);
        for &m in &members {
            inside.insert(m);
        }
        let mut prev = vec![usize::MAX; n];
        let mut queue = std::collections::VecDeque::from([start]);
        let mut end = None;
        'bfs: while let Some(u) = queue.pop_front() {
            let mut next: Vec<usize> = children[u]
                .iter()
                .copied()
                .filter(|&c| inside.contains(c))
                .collect();
            next.sort_unstable();
            for c in next {
                if c == start {
                    end = Some(u);
                    break 'bfs;
                }
                if prev[c] == usize::MAX {
                    prev[c] = u;
                    queue.push_back(c);
                }
            }
        }
        let Some(mut at) = end else {
            continue;
        };
        let mut cycle = vec![at];
        while at != start {
            at = prev[at];
            cycle.push(at);
        }
        cycle.reverse();
        cycles.push(cycle);
    }
    cycles.sort();
    cycles
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::parse_str;

    fn workflow(nodes: &str) -> crate::workflow::ValidWorkflow {
        let text =
            format!("tools:\n  t: {{ kind: function, function: core.echo }}\nnodes:\n{nodes}");
        parse_str(&text, "test.yaml").expect("valid workflow")
    }

    #[test]
    fn topological_order_keeps_file_order_on_ties() {
        let wf = workflow("  c: { tool: t, needs: [a] }\n  a: { tool: t }\n  b: { tool: t }\n");
        let plan = Plan::new(&wf).expect("acyclic");
        let ids: Vec<&str> = plan
            .order()
            .iter()
            .map(|&i| wf.nodes[i].id.as_str())
            .collect();
        assert_eq!(ids, ["a", "c", "b"]);
    }

    #[test]
    fn ready_set_follows_settled_dependencies() {
        let wf = workflow(
            "  a: { tool: t }\n  b: { tool: t, needs: [a] }\n  c: { tool: t, needs: [a] }\n  d: { tool: t, needs: [b, c] }\n",
        );
        let plan = Plan::new(&wf).expect("acyclic");
        let none = |_: usize| false;
        assert_eq!(plan.ready(none, none), vec![0]);
        let settled = |i: usize| i == 0;
        let started = |i: usize| i == 0;
        assert_eq!(plan.ready(settled, started), vec![1, 2]);
        let settled = |i: usize| i <= 1;
        let started = |i: usize| i <= 2;
        assert_eq!(plan.ready(settled, started), Vec::<usize>::new());
        let settled = |i: usize| i <= 2;
        assert_eq!(plan.ready(settled, started), vec![3]);
        assert_eq!(plan.sinks(), vec![3]);
    }

    #[test]
    fn ancestors_are_transitive() {
        let wf = workflow(
            "  a: { tool: t }\n  b: { tool: t, needs: [a] }\n  c: { tool: t, needs: [b] }\n  x: { tool: t }\n",
        );
        let plan = Plan::new(&wf).expect("acyclic");
        let anc = plan.ancestors();
        assert!(anc[2].contains(0) && anc[2].contains(1));
        assert!(!anc[2].contains(3));
        assert!(anc[0].is_clear());
    }
}

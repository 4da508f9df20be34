//! Where one node of a run stands ([`NodeState`]): what [`super::decide`] decides from,
//! what [`super::state`] loads from the ledger and the loop keeps current. A `for_each`
//! node holds its items' states ([`Fan`]): each item's state (a [`NodeState`] of its own,
//! under the step id `node[<key>]`), which items may start next, and what the node comes
//! to when they are done. The bookkeeping is incremental (counts, the items waiting for
//! a retry, the items never started), so deciding what to start next costs what starts,
//! not the length of the list.

use std::collections::{BTreeSet, HashMap, VecDeque};

use flow_ledger::{ErrorKind, Timestamp};
use serde_json::{Map, Value as Json, json};

use crate::gateway::{Awaited, StepOrigin};
use crate::item_id::item_step_id;

/// Where one node stands in a run.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeState {
    /// No step yet.
    NotStarted,
    /// A retry step exists and waits for its durable `not_before`.
    Pending {
        /// The step id (`node_retry<n>`).
        step_id: String,
        /// Its retry number.
        retry: u32,
        /// When it may start.
        not_before: Timestamp,
    },
    /// A rate limit or quota deferred the step's attempt (never sent), or its call's
    /// remote task was still working at the attempt's timeout (sent; the task is asked
    /// about, the call is not sent again): its row is still `running`, and it starts
    /// again, keeping that row, once `until` has passed.
    Deferred {
        /// The step id.
        step_id: String,
        /// Its retry number.
        retry: u32,
        /// When it may start again.
        until: Timestamp,
    },
    /// A step is executing in this process.
    Running {
        /// The step id.
        step_id: String,
        /// Its retry number.
        retry: u32,
    },
    /// A step was running when its worker stopped (crash, takeover): resume it; the
    /// ledger's claim decides replay, takeover or in doubt.
    Interrupted {
        /// The step id.
        step_id: String,
        /// Its retry number.
        retry: u32,
    },
    /// Done, with its output.
    Succeeded {
        /// The node's output.
        output: Json,
    },
    /// Failed for good (no retry step follows).
    Failed {
        /// Error kind.
        kind: ErrorKind,
        /// Error message.
        message: String,
    },
    /// Not run: its condition was false or an upstream node was skipped.
    Skipped,
    /// Its call is in doubt; only a resolution moves it.
    InDoubt {
        /// The paused step.
        step_id: String,
    },
    /// Its call awaits approval (nothing sent); a decision re-queues the run.
    AwaitingApproval {
        /// The step that asked.
        step_id: String,
        /// Its retry number.
        retry: u32,
    },
    /// It waits for an event or its callback (nothing more to send); an event, a
    /// callback or the deadline re-queues the run.
    Waiting {
        /// The step that waits.
        step_id: String,
        /// Its retry number.
        retry: u32,
        /// What it waits for.
        on: crate::gateway::Awaited,
    },
    /// Stopped by a cancellation.
    Cancelled,
    /// A `for_each` node whose list is known: its items' states.
    FanOut(Box<Fan>),
}

impl NodeState {
    /// A state that will not change without outside help.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Succeeded { .. } | Self::Failed { .. } | Self::Skipped | Self::Cancelled
        )
    }
}

/// An item the loop should start: its position, step and where its row stands.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemStart {
    /// Position in the list.
    pub item: usize,
    /// The step id.
    pub step_id: String,
    /// Its retry number.
    pub retry: u32,
    /// Where the step's row stands.
    pub origin: StepOrigin,
}

/// A `for_each` node's items and their states.
#[derive(Debug, Clone, PartialEq)]
pub struct Fan {
    /// The node id (item step ids are built from it).
    node: String,
    /// Each item's key, in list order (then kept vanished items).
    pub keys: Vec<String>,
    /// Each item, same order.
    pub items: Vec<Json>,
    states: Vec<NodeState>,
    /// Most items in flight at once.
    limit: usize,
    /// Most failed items tolerated.
    tolerated: usize,
    /// Items never started, in list order.
    fresh: VecDeque<usize>,
    /// Items with a row to start again: a due retry, a deferred or interrupted step.
    again: BTreeSet<usize>,
    running: usize,
    /// Items deferred (a rate limit, or a remote task still working): each holds its
    /// place in `limit` (a task's request was sent).
    deferred: usize,
    /// Items waiting (on their sub-workflow's run): settled by the child's end.
    waiting: usize,
    /// Of `waiting`, the children paused on a call in doubt: they hold no slot.
    children_in_doubt: usize,
    /// Items awaiting their approval: nothing of theirs is in flight, so they hold no
    /// place in `limit` (every item's approval is asked at once; approvers see them all).
    approving: usize,
    /// Whether a later node reads this node's output: if none does, an item's output
    /// is not kept once recorded (its step holds it), so memory follows what is in
    /// flight, not the list.
    keep_outputs: bool,
    counts: Counts,
}

/// How many items are in each settled state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Succeeded.
    pub succeeded: usize,
    /// Failed for good.
    pub failed: usize,
    /// Skipped (vanished from the list before anything was sent).
    pub skipped: usize,
    /// Cancelled.
    pub cancelled: usize,
    /// In doubt.
    pub in_doubt: usize,
}

impl Fan {
    /// The items of `node` with the states recorded for them (`loaded`, by key; an item
    /// without one has not started). `limit` bounds the items in flight and `tolerated`
    /// the failures.
    pub fn new(
        node: &str,
        keys: Vec<String>,
        items: Vec<Json>,
        mut loaded: HashMap<String, NodeState>,
        limit: usize,
        tolerated: usize,
    ) -> Self {
        let mut fan = Self {
            node: node.to_string(),
            states: vec![NodeState::NotStarted; keys.len()],
            keys,
            items,
            limit: limit.max(1),
            tolerated,
            fresh: VecDeque::new(),
            again: BTreeSet::new(),
            running: 0,
            deferred: 0,
            waiting: 0,
            children_in_doubt: 0,
            approving: 0,
            keep_outputs: true,
            counts: Counts::default(),
        };
        for i in 0..fan.keys.len() {
            let state = loaded.remove(&fan.keys[i]).unwrap_or(NodeState::NotStarted);
            fan.enter(i, state);
        }
        fan
    }

    /// The number of items.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the list is empty (the node then succeeds at once, with no item).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Item `i`'s state.
    pub fn state(&self, i: usize) -> &NodeState {
        &self.states[i]
    }

    /// The settled counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Items running in this process.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Whether more items failed than the node tolerates: nothing new starts.
    pub fn over_tolerance(&self) -> bool {
        self.counts.failed > self.tolerated
    }

    /// Sets item `i`'s state, keeping the counts and sets current.
    pub fn set(&mut self, i: usize, state: NodeState) {
        self.leave(i);
        self.enter(i, state);
    }

    fn leave(&mut self, i: usize) {
        match &self.states[i] {
            NodeState::NotStarted => {
                if self.fresh.front() == Some(&i) {
                    self.fresh.pop_front();
                } else {
                    self.fresh.retain(|&f| f != i);
                }
            }
            NodeState::Pending { .. } | NodeState::Interrupted { .. } => {
                self.again.remove(&i);
            }
            NodeState::Deferred { .. } => {
                self.again.remove(&i);
                self.deferred -= 1;
            }
            NodeState::Running { .. } => self.running -= 1,
            NodeState::Waiting { on, .. } => {
                self.waiting -= 1;
                if matches!(on, Awaited::ChildInDoubt(_)) {
                    self.children_in_doubt -= 1;
                }
            }
            NodeState::AwaitingApproval { .. } => self.approving -= 1,
            NodeState::Succeeded { .. } => self.counts.succeeded -= 1,
            NodeState::Failed { .. } => self.counts.failed -= 1,
            NodeState::Skipped => self.counts.skipped -= 1,
            NodeState::Cancelled => self.counts.cancelled -= 1,
            NodeState::InDoubt { .. } => self.counts.in_doubt -= 1,
            _ => {}
        }
    }

    /// Items' outputs are not kept from now on (nothing reads the node's output); the
    /// node's output then holds its counts and no `items`.
    pub fn without_outputs(mut self) -> Self {
        self.keep_outputs = false;
        for s in &mut self.states {
            if let NodeState::Succeeded { output } = s {
                *output = Json::Null;
            }
        }
        self
    }

    fn enter(&mut self, i: usize, mut state: NodeState) {
        if !self.keep_outputs
            && let NodeState::Succeeded { output } = &mut state
        {
            *output = Json::Null;
        }
        match &state {
            NodeState::NotStarted => self.fresh.push_back(i),
            NodeState::Pending { .. } | NodeState::Interrupted { .. } => {
                self.again.insert(i);
            }
            NodeState::Deferred { .. } => {
                self.again.insert(i);
                self.deferred += 1;
            }
            NodeState::Running { .. } => self.running += 1,
            NodeState::Waiting { on, .. } => {
                self.waiting += 1;
                if matches!(on, Awaited::ChildInDoubt(_)) {
                    self.children_in_doubt += 1;
                }
            }
            NodeState::AwaitingApproval { .. } => self.approving += 1,
            NodeState::Succeeded { .. } => self.counts.succeeded += 1,
            NodeState::Failed { .. } => self.counts.failed += 1,
            NodeState::Skipped => self.counts.skipped += 1,
            NodeState::Cancelled => self.counts.cancelled += 1,
            NodeState::InDoubt { .. } => self.counts.in_doubt += 1,
            _ => {}
        }
        // A settled item never starts again in this execution: its context is not
        // needed, and a large list is not held twice (items and outputs) at the end.
        if matches!(
            state,
            NodeState::Succeeded { .. }
                | NodeState::Failed { .. }
                | NodeState::Skipped
                | NodeState::Cancelled
        ) {
            self.items[i] = Json::Null;
        }
        self.states[i] = state;
    }

    /// The items to start now, at most `capacity` (the run's free slots) and within the
    /// node's own limit: steps to start again first, then new items in list order. Also
    /// the earliest time a retry comes due, if one waits.
    ///
    /// Past the tolerated failures nothing new starts (no new item, no retry), but an
    /// item whose call may have left (interrupted, or a remote task still working) is
    /// still seen through: its outcome is recorded, or it goes in doubt.
    pub fn startable(
        &self,
        now: Timestamp,
        capacity: usize,
    ) -> (Vec<ItemStart>, Option<Timestamp>) {
        let mut out = Vec::new();
        let mut wake: Option<Timestamp> = None;
        let over = self.over_tolerance();
        // A deferred item already holds its place; it takes no new one when it starts.
        // An item waiting on its child run holds its place too: `concurrency` bounds the
        // children a node has going, paused ones included — except a child paused on a
        // call in doubt, which, like a tool item in doubt, holds only itself.
        let holding = self.running + self.deferred + self.waiting - self.children_in_doubt;
        let mut room = self.limit.saturating_sub(holding);
        for &i in &self.again {
            if out.len() >= capacity {
                break;
            }
            let resumes = matches!(self.states[i], NodeState::Deferred { .. });
            if over && matches!(self.states[i], NodeState::Pending { .. }) {
                continue;
            }
            let (step_id, retry, due, origin) = match &self.states[i] {
                NodeState::Interrupted { step_id, retry } => {
                    (step_id, *retry, None, StepOrigin::Running)
                }
                NodeState::Pending {
                    step_id,
                    retry,
                    not_before,
                } => (step_id, *retry, Some(*not_before), StepOrigin::Pending),
                NodeState::Deferred {
                    step_id,
                    retry,
                    until,
                } => (step_id, *retry, Some(*until), StepOrigin::Running),
                _ => continue,
            };
            if let Some(t) = due.filter(|t| *t > now) {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            } else if resumes || room > 0 {
                if !resumes {
                    room -= 1;
                }
                out.push(ItemStart {
                    item: i,
                    step_id: step_id.clone(),
                    retry,
                    origin,
                });
            }
        }
        if over {
            return (out, wake);
        }
        let room = room.min(capacity.saturating_sub(out.len()));
        for &i in self.fresh.iter().take(room) {
            out.push(ItemStart {
                item: i,
                step_id: item_step_id(&self.node, &self.keys[i], 0),
                retry: 0,
                origin: StepOrigin::New,
            });
        }
        (out, wake)
    }

    /// Whether the node can be closed: nothing runs, and either every item is settled
    /// or too many failed (what is waiting then is left, and the node fails).
    pub fn is_done(&self) -> bool {
        if self.running > 0 {
            return false;
        }
        if self.over_tolerance() {
            // What may have left is seen through first (an item in doubt waits for its
            // resolution: a run never ends over a call in doubt; an item waiting on its
            // child run for the child's end); pending retries are dropped, and so are
            // items awaiting approval (nothing of theirs was sent; the ledger cancels
            // their approvals when the run ends).
            return self.counts.in_doubt == 0
                && self.waiting == 0
                && self
                    .again
                    .iter()
                    .all(|&i| matches!(self.states[i], NodeState::Pending { .. }));
        }
        let c = self.counts;
        c.succeeded + c.failed + c.skipped + c.cancelled == self.len()
    }

    /// Items waiting on their sub-workflow's run.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Items awaiting their approval.
    pub fn approving(&self) -> usize {
        self.approving
    }

    /// Items the run pauses for until someone acts: a child run's end or an approver.
    pub fn awaiting(&self) -> usize {
        self.waiting + self.approving
    }

    /// Items waiting (on a child or an approval) become interrupted, to be started again
    /// (a child ended, or an approval was decided, while the run was about to pause):
    /// each step looks again.
    pub fn interrupt_awaiting(&mut self) {
        for i in 0..self.states.len() {
            if let NodeState::Waiting { step_id, retry, .. }
            | NodeState::AwaitingApproval { step_id, retry } = &self.states[i]
            {
                let again = NodeState::Interrupted {
                    step_id: step_id.clone(),
                    retry: *retry,
                };
                self.set(i, again);
            }
        }
    }

    /// The keys of items awaiting their approval (for the pause reason).
    pub fn approving_keys(&self) -> impl Iterator<Item = &str> {
        self.keys_where(|s| matches!(s, NodeState::AwaitingApproval { .. }))
    }

    /// Whether items are in doubt and nothing else of the node can move without help.
    pub fn holds_in_doubt(&self) -> bool {
        self.counts.in_doubt > 0 && self.running == 0
    }

    /// The keys of items in doubt (for the pause reason and the inbox).
    pub fn in_doubt_keys(&self) -> impl Iterator<Item = &str> {
        self.keys_where(|s| matches!(s, NodeState::InDoubt { .. }))
    }

    fn keys_where(&self, pred: fn(&NodeState) -> bool) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .zip(&self.states)
            .filter(move |(_, s)| pred(s))
            .map(|(k, _)| k.as_str())
    }

    /// The node's counts, as its step row and a run's output hold them.
    pub fn summary(&self) -> Json {
        let c = self.counts;
        json!({ "succeeded": c.succeeded, "failed": c.failed, "skipped": c.skipped })
    }

    /// Why the node fails once [`Fan::is_done`]: too many items failed (the message
    /// names them); `None` when it succeeds.
    pub fn failure(&self) -> Option<String> {
        if !self.over_tolerance() {
            return None;
        }
        let failed: Vec<&str> = self
            .keys_where(|s| matches!(s, NodeState::Failed { .. }))
            .collect();
        let shown = failed
            .iter()
            .take(10)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        let more = failed.len().saturating_sub(10);
        Some(format!(
            "{} of {} items failed, {} tolerated: {shown}{}",
            failed.len(),
            self.len(),
            self.tolerated,
            if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            }
        ))
    }

    /// What the node comes to once [`Fan::is_done`]: its output (`items` by key, and the
    /// counts), or the failure naming the failed items. Consumes the fan: each item's
    /// output moves into the node's, never copied (a large fan-out would hold two).
    pub fn into_outcome(self) -> NodeState {
        match self.failure() {
            Some(message) => NodeState::Failed {
                kind: ErrorKind::Permanent,
                message,
            },
            None => NodeState::Succeeded {
                output: self.into_output(),
            },
        }
    }

    /// `{ items: { <key>: output, … }, succeeded, failed, skipped }`: each succeeded
    /// item's output by key (a JSON object: its keys come out sorted, not in list order).
    pub fn into_output(self) -> Json {
        let mut out = self.summary();
        if !self.keep_outputs {
            return out;
        }
        let mut items = Map::new();
        for (k, s) in self.keys.into_iter().zip(self.states) {
            if let NodeState::Succeeded { output } = s {
                items.insert(k, output);
            }
        }
        if let Json::Object(map) = &mut out {
            map.insert("items".into(), Json::Object(items));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fan(n: usize, limit: usize, tolerated: usize) -> Fan {
        let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let items = (0..n).map(|i| json!({ "id": i })).collect();
        Fan::new("notify", keys, items, HashMap::new(), limit, tolerated)
    }

    fn run(f: &mut Fan, i: usize) {
        f.set(
            i,
            NodeState::Running {
                step_id: item_step_id("notify", &f.keys[i].clone(), 0),
                retry: 0,
            },
        );
    }

    #[test]
    fn starts_new_items_in_order_within_the_limit_and_the_capacity() {
        let mut f = fan(5, 2, 0);
        let (s, _) = f.startable(Timestamp(0), 8);
        assert_eq!(s.iter().map(|s| s.item).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s[0].step_id, "notify[k0]");
        run(&mut f, 0);
        let (s, _) = f.startable(Timestamp(0), 8);
        assert_eq!(s.iter().map(|s| s.item).collect::<Vec<_>>(), vec![1]);
        run(&mut f, 1);
        assert!(f.startable(Timestamp(0), 8).0.is_empty(), "limit reached");
        f.set(0, NodeState::Succeeded { output: json!(1) });
        assert_eq!(f.startable(Timestamp(0), 0).0, vec![], "no run capacity");
        assert_eq!(f.startable(Timestamp(0), 1).0[0].item, 2);
    }

    #[test]
    fn retries_start_when_due_before_new_items() {
        let mut f = fan(3, 3, 0);
        f.set(
            1,
            NodeState::Pending {
                step_id: "notify[k1]_retry1".into(),
                retry: 1,
                not_before: Timestamp(500),
            },
        );
        let (s, wake) = f.startable(Timestamp(100), 8);
        assert_eq!(s.iter().map(|s| s.item).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(wake, Some(Timestamp(500)));
        let (s, _) = f.startable(Timestamp(500), 8);
        assert_eq!(s[0].item, 1);
        assert_eq!(s[0].origin, StepOrigin::Pending);
    }

    #[test]
    fn too_many_failures_stop_new_starts_and_fail_once_nothing_runs() {
        let mut f = fan(4, 4, 1);
        run(&mut f, 0);
        let failed = || NodeState::Failed {
            kind: ErrorKind::Permanent,
            message: "no".into(),
        };
        f.set(1, failed());
        f.set(2, failed());
        assert!(f.over_tolerance());
        assert!(f.startable(Timestamp(0), 8).0.is_empty());
        assert!(!f.is_done(), "item 0 is still in flight");
        f.set(0, NodeState::Succeeded { output: json!(0) });
        assert!(f.is_done());
        match f.into_outcome() {
            NodeState::Failed { message, .. } => {
                assert_eq!(message, "2 of 4 items failed, 1 tolerated: k1, k2")
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn past_tolerance_an_interrupted_item_is_seen_through_and_a_retry_is_dropped() {
        let mut f = fan(4, 4, 0);
        f.set(
            0,
            NodeState::Failed {
                kind: ErrorKind::Permanent,
                message: "no".into(),
            },
        );
        f.set(
            1,
            NodeState::Interrupted {
                step_id: "notify[k1]".into(),
                retry: 0,
            },
        );
        f.set(
            2,
            NodeState::Pending {
                step_id: "notify[k2]_retry1".into(),
                retry: 1,
                not_before: Timestamp(0),
            },
        );
        assert!(f.over_tolerance());
        let (s, _) = f.startable(Timestamp(10), 8);
        assert_eq!(s.iter().map(|s| s.item).collect::<Vec<_>>(), vec![1]);
        assert!(!f.is_done(), "item 1's call may have left");
        run(&mut f, 1);
        f.set(1, NodeState::Succeeded { output: json!(1) });
        assert!(f.is_done(), "the pending retry of item 2 is dropped");
    }

    #[test]
    fn past_tolerance_an_item_in_doubt_still_holds_the_node() {
        let mut f = fan(3, 3, 0);
        let failed = || NodeState::Failed {
            kind: ErrorKind::Permanent,
            message: "no".into(),
        };
        f.set(0, failed());
        f.set(
            1,
            NodeState::InDoubt {
                step_id: "notify[k1]".into(),
            },
        );
        assert!(f.over_tolerance());
        assert!(!f.is_done(), "a run never ends over a call in doubt");
        assert!(f.holds_in_doubt(), "the run pauses for its resolution");
        f.set(1, failed());
        assert!(f.is_done());
    }

    #[test]
    fn a_deferred_item_holds_its_place_in_the_limit() {
        let mut f = fan(3, 1, 0);
        f.set(
            0,
            NodeState::Deferred {
                step_id: "notify[k0]".into(),
                retry: 0,
                until: Timestamp(100),
            },
        );
        let (s, wake) = f.startable(Timestamp(50), 8);
        assert!(
            s.is_empty(),
            "the remote task of k0 still holds the only place: {s:?}"
        );
        assert_eq!(wake, Some(Timestamp(100)));
        let (s, _) = f.startable(Timestamp(100), 8);
        assert_eq!(s.iter().map(|s| s.item).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn in_doubt_items_hold_the_node_and_the_output_holds_every_item_by_key() {
        let mut f = fan(3, 3, 0);
        f.set(2, NodeState::Succeeded { output: json!("c") });
        f.set(0, NodeState::Succeeded { output: json!("a") });
        f.set(
            1,
            NodeState::InDoubt {
                step_id: "notify[k1]".into(),
            },
        );
        assert!(!f.is_done());
        assert!(f.holds_in_doubt());
        assert_eq!(f.in_doubt_keys().collect::<Vec<_>>(), vec!["k1"]);
        f.set(1, NodeState::Succeeded { output: json!("b") });
        assert!(f.is_done());
        let out = f.into_output();
        let keys: Vec<&String> = out["items"].as_object().expect("map").keys().collect();
        assert_eq!(keys, vec!["k0", "k1", "k2"]);
        assert_eq!(out["succeeded"], 3);
    }

    #[test]
    fn a_fan_nobody_reads_keeps_counts_not_outputs() {
        let mut f = fan(3, 3, 0).without_outputs();
        for i in 0..3 {
            run(&mut f, i);
            f.set(
                i,
                NodeState::Succeeded {
                    output: json!({ "big": i }),
                },
            );
        }
        assert!(f.is_done());
        assert!(
            (0..3).all(|i| f.state(i) == &NodeState::Succeeded { output: Json::Null }),
            "outputs are not held"
        );
        assert_eq!(
            f.into_output(),
            json!({ "succeeded": 3, "failed": 0, "skipped": 0 })
        );
    }
}

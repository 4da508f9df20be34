//! A `for_each` node's items as readers see them: counts by state and the items that did
//! not simply succeed ([`ItemsView`]), so a run of 10,000 items reads as one node with
//! its failures and doubts, not as 10,000 steps. Every item, paged, is [`ItemView`] too.

use std::collections::BTreeMap;

use flow_ledger::{Step, StepStatus};
use schemars::JsonSchema;
use serde::Serialize;

use super::ErrorView;

/// How many items a grouped view lists (the rest are counted).
pub const LISTED: usize = 100;

/// One item of a `for_each` node: its key and its latest step.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ItemView {
    /// The item's key (its step is `<node>[<key>]`).
    pub key: String,
    /// Its latest step (`<node>[<key>]`, or `<node>[<key>]_retry<n>`).
    pub step: String,
    /// Which retry that step is.
    pub retry: u32,
    /// Its state.
    pub status: StepStatus,
    /// Why it failed.
    pub error: Option<ErrorView>,
}

/// A `for_each` node's items, grouped.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct ItemsView {
    /// Items in the node's list (`null` before the list was evaluated).
    pub total: Option<usize>,
    /// Items that succeeded.
    pub succeeded: usize,
    /// Items that failed for good.
    pub failed: usize,
    /// Items paused: their call is in doubt, or the child run they wait for is paused
    /// (each waits for a person).
    pub in_doubt: usize,
    /// Items running or waiting for a retry.
    pub running: usize,
    /// Items skipped (vanished from a re-evaluated list before they were sent).
    pub skipped: usize,
    /// Items cancelled.
    pub cancelled: usize,
    /// The items that did not simply succeed, in doubt and failed first, at most 100.
    pub listed: Vec<ItemView>,
}

/// The key of `s` if it is an item step of `node`.
pub fn item_key<'s>(node: &str, s: &'s Step) -> Option<&'s str> {
    if s.node_id != node {
        return None;
    }
    crate::item_id::item_key(node, &s.step_id, s.retry)
}

/// Every item of `node` with its latest step, by key.
pub fn items(node: &str, steps: &[Step]) -> Vec<ItemView> {
    let mut latest: BTreeMap<&str, &Step> = BTreeMap::new();
    for s in steps {
        if let Some(key) = item_key(node, s) {
            let e = latest.entry(key).or_insert(s);
            if s.retry >= e.retry {
                *e = s;
            }
        }
    }
    latest
        .into_iter()
        .map(|(key, s)| ItemView {
            key: key.to_owned(),
            step: s.step_id.clone(),
            retry: s.retry,
            status: s.status,
            error: ErrorView::of(s.error_kind, s.error_message.as_ref()),
        })
        .collect()
}

impl ItemsView {
    /// The items of `node` among `steps`, grouped; `total` is the stored list's length.
    pub fn of(node: &str, steps: &[Step], total: Option<usize>) -> ItemsView {
        let mut view = ItemsView {
            total,
            ..ItemsView::default()
        };
        let mut rest = Vec::new();
        for item in items(node, steps) {
            match item.status {
                StepStatus::Succeeded => view.succeeded += 1,
                StepStatus::Failed => view.failed += 1,
                StepStatus::Paused => view.in_doubt += 1,
                StepStatus::Running | StepStatus::Pending => view.running += 1,
                StepStatus::Skipped => view.skipped += 1,
                StepStatus::Cancelled => view.cancelled += 1,
            }
            if item.status != StepStatus::Succeeded {
                rest.push(item);
            }
        }
        // In doubt first (they wait for someone), then failed, then the rest.
        let rank = |s: StepStatus| match s {
            StepStatus::Paused => 0,
            StepStatus::Failed => 1,
            _ => 2,
        };
        rest.sort_by_key(|i| rank(i.status));
        rest.truncate(LISTED);
        view.listed = rest;
        view
    }

    /// One line of counts: `10000 items: 9995 succeeded, 3 failed, 2 in doubt`.
    pub fn counts_line(&self) -> String {
        let mut parts = vec![format!("{} succeeded", self.succeeded)];
        for (n, what) in [
            (self.failed, "failed"),
            (self.in_doubt, "in doubt"),
            (self.running, "running"),
            (self.skipped, "skipped"),
            (self.cancelled, "cancelled"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let started = self.succeeded
            + self.failed
            + self.in_doubt
            + self.running
            + self.skipped
            + self.cancelled;
        let total = self.total.unwrap_or(started);
        if total > started {
            parts.push(format!("{} not started", total - started));
        }
        format!("{total} items: {}", parts.join(", "))
    }
}

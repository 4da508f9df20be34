//! Progress on stderr: one line per node step with status, attempt and duration.
//!
//! On a terminal a spinner shows the nodes running now (indicatif) and finished steps
//! scroll above it; otherwise (CI, pipes, tests) plain lines. The run's output goes to
//! stdout, never mixed with these lines.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::gateway::StepResult;

/// Something that happened to a step.
#[derive(Debug)]
pub enum StepEvent<'a> {
    /// A step started (or resumed).
    Started {
        /// Node id.
        node: &'a str,
        /// Step id.
        step_id: &'a str,
        /// Retry number.
        retry: u32,
    },
    /// A step finished (or paused, or was deferred).
    Finished {
        /// Node id.
        node: &'a str,
        /// The node's tool (metrics label calls by it).
        tool: &'a str,
        /// Step id.
        step_id: &'a str,
        /// Retry number.
        retry: u32,
        /// How long it took here.
        took: Duration,
        /// What became of it.
        result: &'a StepResult,
    },
    /// A `for_each` node's items are done: its counts, or why it failed.
    Closed {
        /// Node id.
        node: &'a str,
        /// The node's counts (`succeeded`, `failed`, `skipped`).
        counts: &'a serde_json::Value,
        /// Why the node failed (too many items failed).
        error: Option<&'a str>,
    },
    /// A node was skipped.
    Skipped {
        /// Node id.
        node: &'a str,
        /// Why.
        why: &'a str,
    },
}

/// Receives step events.
pub trait Progress: Send + Sync {
    /// Reports one event.
    fn step(&self, event: StepEvent<'_>);
}

/// A child run's steps, reported through its parent's progress as
/// `<parent node> › <child node>`: a sub-workflow executed in-process shows where its
/// lines come from (and metrics keep one label per pair of nodes, not per child run).
pub struct Nested {
    inner: std::sync::Arc<dyn Progress>,
    prefix: String,
}

impl Nested {
    /// Reports `inner`'s events under the parent's node `prefix`.
    pub fn new(inner: std::sync::Arc<dyn Progress>, prefix: &str) -> Self {
        Self {
            inner,
            prefix: prefix.to_string(),
        }
    }
}

impl Progress for Nested {
    fn step(&self, event: StepEvent<'_>) {
        let name = |node: &str| format!("{} › {node}", self.prefix);
        match event {
            StepEvent::Started {
                node,
                step_id,
                retry,
            } => {
                let node = name(node);
                self.inner.step(StepEvent::Started {
                    node: &node,
                    step_id,
                    retry,
                });
            }
            StepEvent::Finished {
                node,
                tool,
                step_id,
                retry,
                took,
                result,
            } => {
                let node = name(node);
                self.inner.step(StepEvent::Finished {
                    node: &node,
                    tool,
                    step_id,
                    retry,
                    took,
                    result,
                });
            }
            StepEvent::Closed {
                node,
                counts,
                error,
            } => {
                let node = name(node);
                self.inner.step(StepEvent::Closed {
                    node: &node,
                    counts,
                    error,
                });
            }
            StepEvent::Skipped { node, why } => {
                let node = name(node);
                self.inner.step(StepEvent::Skipped { node: &node, why });
            }
        }
    }
}

/// Reports nothing (daemon workers log instead).
pub struct Silent;

impl Progress for Silent {
    fn step(&self, _event: StepEvent<'_>) {}
}

/// The line for a finished step, e.g. `✓ charge (attempt 2, charge_retry1) 31ms`.
///
/// An item of a `for_each` node is named by its step (`notify[c1]`), and prints only
/// when it did not simply succeed: a 10,000-item node prints its counts, not 10,000
/// lines.
pub fn line(event: &StepEvent<'_>) -> Option<String> {
    match event {
        StepEvent::Started { .. } => None,
        StepEvent::Skipped { node, why } => Some(format!("- {node} skipped ({why})")),
        StepEvent::Closed {
            node,
            counts,
            error: None,
        } => Some(format!(
            "✓ {node}: {} items succeeded, {} failed, {} skipped",
            counts["succeeded"], counts["failed"], counts["skipped"]
        )),
        StepEvent::Closed {
            node,
            error: Some(e),
            ..
        } => Some(format!("✗ {node}: {e}")),
        StepEvent::Finished {
            node,
            step_id,
            retry,
            result: StepResult::Succeeded { .. },
            ..
        } if shown(node, step_id, *retry) != *node => None,
        StepEvent::Finished {
            node,
            tool: _,
            step_id,
            retry,
            took,
            result,
        } => {
            let node = shown(node, step_id, *retry);
            let attempt = if *retry == 0 {
                "attempt 1".to_string()
            } else {
                format!("attempt {}, {step_id}", retry + 1)
            };
            let took = crate::duration_text::duration(*took);
            Some(match result {
                StepResult::Succeeded { .. } => format!("✓ {node} ({attempt}) {took}"),
                StepResult::Failed {
                    kind,
                    message,
                    retry: Some((next, _, at)),
                } => {
                    format!(
                        "✗ {node} ({attempt}) {took}: {kind} error: {message}; retry {next} at {}",
                        at.to_rfc3339()
                    )
                }
                StepResult::Failed {
                    kind,
                    message,
                    retry: None,
                } => format!("✗ {node} ({attempt}) {took}: {kind} error: {message}"),
                StepResult::InDoubt => format!(
                    "? {node} ({attempt}) {took}: in doubt: the request may have been processed"
                ),
                StepResult::Deferred { until, why } => format!(
                    "… {node} ({attempt}): {}; trying again at {}",
                    why,
                    until.to_rfc3339()
                ),
                StepResult::TaskWorking { task, .. } => format!(
                    "… {node} ({attempt}) {took}: remote task {task} still working; asking again"
                ),
                StepResult::AwaitingApproval { deadline } => format!(
                    "⏸ {node}: awaiting approval (until {}); nothing was sent",
                    deadline.to_rfc3339()
                ),
                StepResult::Waiting {
                    on: crate::gateway::Awaited::Child(run),
                    ..
                } => format!("⏸ {node}: waiting on child run {run}"),
                StepResult::Waiting {
                    on: crate::gateway::Awaited::ChildInDoubt(run),
                    ..
                } => format!(
                    "⏸ {node}: waiting on child run {run}, paused with a call in doubt (resolve it there)"
                ),
                StepResult::Waiting { deadline, on } => format!(
                    "⏸ {node}: waiting for {} (until {})",
                    match on {
                        crate::gateway::Awaited::Event(name) => format!("event `{name}`"),
                        crate::gateway::Awaited::Callback
                        | crate::gateway::Awaited::Child(_)
                        | crate::gateway::Awaited::ChildInDoubt(_) => "its callback".to_owned(),
                    },
                    deadline.to_rfc3339()
                ),
                StepResult::Skipped { why } => format!("- {node}: skipped: {why}"),
            })
        }
    }
}

/// What a step is shown as: its node, or for an item of a `for_each` node the item's
/// step (`notify[c1]`, whatever its retry).
pub fn shown<'s>(node: &'s str, step_id: &'s str, retry: u32) -> &'s str {
    if crate::item_id::item_key(node, step_id, retry).is_none() {
        return node;
    }
    if retry == 0 {
        step_id
    } else {
        let suffix = format!("_retry{retry}");
        step_id.strip_suffix(suffix.as_str()).unwrap_or(step_id)
    }
}

/// One JSON object per line on stderr (`--log-format json`), the line's text as the
/// message and the node beside it.
pub struct JsonLines;

impl Progress for JsonLines {
    fn step(&self, event: StepEvent<'_>) {
        let node = match &event {
            StepEvent::Started { node, .. }
            | StepEvent::Finished { node, .. }
            | StepEvent::Closed { node, .. }
            | StepEvent::Skipped { node, .. } => *node,
        };
        if let Some(l) = line(&event) {
            let json =
                crate::json_line::render("flow::progress", &l, serde_json::json!({ "node": node }));
            let _ = writeln!(std::io::stderr().lock(), "{json}");
        }
    }
}

/// Plain lines on stderr.
pub struct Lines;

impl Progress for Lines {
    fn step(&self, event: StepEvent<'_>) {
        if let Some(l) = line(&event) {
            let _ = writeln!(std::io::stderr().lock(), "{l}");
        }
    }
}

/// A spinner naming the running nodes, with finished steps printed above it.
pub struct Live {
    bar: ProgressBar,
    running: Mutex<BTreeSet<String>>,
    /// The spinner starts with the first step, so lines printed before it (the run id)
    /// are not drawn over.
    ticking: std::sync::Once,
}

impl Live {
    fn new() -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Self {
            bar,
            ticking: std::sync::Once::new(),
            running: Mutex::new(BTreeSet::new()),
        }
    }

    fn update(&self) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let names: Vec<&str> = running.iter().map(String::as_str).collect();
        self.bar.set_message(if names.is_empty() {
            String::new()
        } else {
            format!("running: {}", names.join(", "))
        });
    }
}

impl Progress for Live {
    fn step(&self, event: StepEvent<'_>) {
        self.ticking
            .call_once(|| self.bar.enable_steady_tick(Duration::from_millis(100)));
        match &event {
            StepEvent::Started {
                node,
                step_id,
                retry,
            } => {
                self.running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(shown(node, step_id, *retry).to_string());
            }
            StepEvent::Finished {
                node,
                step_id,
                retry,
                ..
            } => {
                self.running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(shown(node, step_id, *retry));
            }
            StepEvent::Skipped { node, .. } | StepEvent::Closed { node, .. } => {
                self.running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(*node);
            }
        }
        if let Some(l) = line(&event) {
            self.bar.println(l);
        }
        self.update();
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Progress as JSON lines (`json`), live on a terminal, plain lines otherwise.
pub fn for_stderr(json: bool) -> Box<dyn Progress> {
    if json {
        Box::new(JsonLines)
    } else if std::io::stderr().is_terminal() {
        Box::new(Live::new())
    } else {
        Box::new(Lines)
    }
}

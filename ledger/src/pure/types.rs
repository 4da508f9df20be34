//! The types of pure in-process function calls: one recorded terminal in one commit
//! ([`crate::Ledger::record_pure_call`]), or first attempts kept by the engine and
//! recorded together ([`crate::Ledger::record_pure_calls`]).

use serde_json::Value;

use crate::clock::Timestamp;
use crate::model::{CallOutcome, NewStep, Replayed, RunLease};

/// A pure in-process function's call: recorded terminal in one commit.
#[derive(Debug, Clone)]
pub struct PureCall<'a> {
    /// The run lease.
    pub run: &'a RunLease,
    /// The step (created if missing, then finished from `outcome`).
    pub step: NewStep,
    /// Node id.
    pub tool_call_id: String,
    /// Tool name.
    pub tool: String,
    /// Base idempotency key.
    pub idempotency_key: String,
    /// Redacted request.
    pub request: Value,
    /// Canonical hash of the request.
    pub request_hash: String,
    /// The function's result.
    pub outcome: CallOutcome,
    /// Overwrite a failed call with a new attempt instead of replaying it.
    pub retry_failed: bool,
    /// Create the next step (a retry) in the same transaction.
    pub next_step: Option<NewStep>,
}

/// What [`crate::Ledger::record_pure_call`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum PureRecorded {
    /// The outcome was recorded and the step finished with it.
    Recorded,
    /// A terminal call already existed: the step was finished with the stored outcome,
    /// which the engine must use instead of the fresh one.
    Replayed(Replayed),
}

/// A pure function's first attempt that succeeded, kept in memory by the engine and
/// recorded later together with others ([`crate::Ledger::record_pure_calls`]). Nothing
/// left the process, so losing it in a crash only means computing it again.
#[derive(Debug, Clone, PartialEq)]
pub struct PureResult {
    /// Step id (the node id: a first attempt).
    pub step_id: String,
    /// Node id.
    pub node_id: String,
    /// The call's id: the node id, or `node[<key>]` for an item of a `for_each` node.
    pub tool_call_id: String,
    /// Tool name.
    pub tool: String,
    /// Base idempotency key.
    pub idempotency_key: String,
    /// Redacted request.
    pub request: Value,
    /// Canonical hash of the request.
    pub request_hash: String,
    /// The function's output.
    pub output: Value,
    /// When the step started (its `started_at` and `step.started` time).
    pub started_at: Timestamp,
    /// When the function returned (its `finished_at` and `step.succeeded` time).
    pub finished_at: Timestamp,
}

/// What [`crate::Ledger::record_pure_calls`] did: all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PureBatchRecorded {
    /// Every result was recorded as a new step and call.
    All,
    /// Nothing was written: this node already had a step or a call (or its key is used
    /// by another call). The engine must record that node the one-at-a-time way
    /// ([`crate::Ledger::record_pure_call`]), which replays or conflicts as it should.
    NotNew {
        /// The node.
        node_id: String,
    },
}

//! The one fence of a holder's writes: the text every fenced statement puts in its
//! `WHERE`, the arguments it binds, and the same check in Rust for a row already read.
//!
//! A run lease is `(worker, lease_token)` on the run's row, with `status = 'running'`; a
//! call lease adds `(lease_holder, lease_token)` on the call's row. A holder whose lease
//! was taken over (the token moved on) or given up (the status moved on) must not write,
//! and where new work or a side effect begins, the lease must also be unexpired ("live").
//! These conditions used to be written out in each statement, four ways; now a statement
//! names one of the clauses below and binds [`Fence::run`] or [`Fence::call`] first.
//!
//! Parameters, the same in every fenced statement: `$1` tenant, `$2` workspace, `$3` run
//! id, `$4` worker (the run's holder, which is also the call's holder), `$5` run token;
//! a call fence adds `$6` tool call id and `$7` call token. The statement's own values
//! follow. A live fence compares expiry with the statement's first own value, `now`
//! (`$6` for a run fence, `$8` for a call fence).

use crate::clock::Timestamp;
use crate::conn::{Arg, args};
use crate::error::Error;
use crate::model::{CallLease, RunLease, Scope};
use crate::rows::RunRow;
use crate::state::RunStatus;

/// A statement on `runs` fenced by the run lease (`$1..$5`).
macro_rules! run_fence {
    () => {
        " tenant = $1 AND workspace = $2 AND id = $3 AND status = 'running' AND worker = $4
            AND lease_token = $5 "
    };
}
pub(crate) use run_fence;

/// [`run_fence!`], and the lease unexpired at `$6`.
macro_rules! live_run_fence {
    () => {
        concat!($crate::fence::run_fence!(), " AND lease_expires_at > $6 ")
    };
}
pub(crate) use live_run_fence;

/// A statement on `tool_calls` fenced by the call lease and the run lease (`$1..$7`).
macro_rules! call_fence {
    () => {
        " tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $6
            AND lease_holder = $4 AND lease_token = $7
            AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant = $1 AND r.workspace = $2
                AND r.id = $3 AND r.status = 'running' AND r.worker = $4
                AND r.lease_token = $5) "
    };
}
pub(crate) use call_fence;

/// [`call_fence!`], and both leases unexpired at `$8`: the fence of `mark_outbound`, the
/// write after which a request may leave.
macro_rules! live_call_fence {
    () => {
        " tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $6
            AND lease_holder = $4 AND lease_token = $7 AND lease_expires_at > $8
            AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant = $1 AND r.workspace = $2
                AND r.id = $3 AND r.status = 'running' AND r.worker = $4
                AND r.lease_token = $5 AND r.lease_expires_at > $8) "
    };
}
pub(crate) use live_call_fence;

/// The arguments of a fence, bound before a statement's own.
pub(crate) struct Fence;

impl Fence {
    /// `$1..$5` of a run fence.
    pub(crate) fn run(scope: &Scope, lease: &RunLease) -> Vec<Arg> {
        args![
            &scope.tenant,
            &scope.workspace,
            &lease.run_id,
            lease.worker.as_str(),
            lease.token,
        ]
    }

    /// `$1..$7` of a call fence.
    pub(crate) fn call(scope: &Scope, lease: &CallLease) -> Vec<Arg> {
        args![
            &scope.tenant,
            &scope.workspace,
            &lease.run_id,
            lease.worker.as_str(),
            lease.run_token,
            &lease.tool_call_id,
            lease.token,
        ]
    }

    /// The run fence checked on a row read under a share lock (a transaction that
    /// reads first): the same conditions as [`run_fence!`], and [`live_run_fence!`]'s
    /// when `live_at` is given.
    pub(crate) fn holds(
        row: &RunRow,
        lease: &RunLease,
        live_at: Option<Timestamp>,
    ) -> Result<bool, Error> {
        Ok(row.status()? == RunStatus::Running
            && row.lease_token == lease.token
            && row.worker.as_deref() == Some(lease.worker.as_str())
            && live_at.is_none_or(|now| row.lease_expires_at.is_some_and(|e| e > now.0)))
    }
}

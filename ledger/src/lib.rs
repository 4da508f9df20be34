//! flow-ledger: the durable lease ledger behind flow's at-most-once tool calls.
//!
//! One API ([`Ledger`]) over SQLite and PostgreSQL, chosen by URL. It stores the run
//! queue, the steps of each run, the tool-call ledger with its effect attempts and usage,
//! database-wide rate counters and the event outbox — and it owns the persisted states
//! and their legal transitions ([`state`]), so that both backends only perform
//! conditional updates that Rust has already decided are legal.
//!
//! # Table of contents
//! - [`clock`]: [`Timestamp`] (ms since the epoch, UTC), [`Clock`], [`ManualClock`].
//!   Every method takes `now`: no SQL reads the database clock.
//! - [`worker`]: [`WorkerId`] `host:pid:start`, provable death on the same host.
//! - [`state`]: [`RunStatus`], [`StepStatus`], [`CallStatus`], [`ErrorKind`], the claim
//!   decision table (pure, unit tested).
//! - [`ids`]: the one grammar of run ids, tenant, workspace (and node) names.
//! - [`model`]: requests and rows.
//! - [`events`]: outbox [`Event`]s, written in the transaction of their state change;
//!   `deliveries.rs`: per-consumer delivery queues and checkpoints for the dispatcher.
//! - [`Error`]: one enum; sqlx errors are mapped at the boundary.
//! - the operations, each one transaction: `runs.rs` (queue: claims, leases),
//!   `enqueue.rs` (runs onto it, one or a batch in a fixed number of statements), `steps.rs`, `calls.rs`
//!   (claim), `outbound.rs` (mark_outbound, complete, in doubt, release), `attempts.rs`
//!   (the attempt and usage rows an outcome leaves), `resolve.rs`
//!   (operator resolution), `pure/` (every way a pure result is written: one statement
//!   for a brand-new call in `fresh.rs`, batches of kept results in `batch.rs`, the
//!   general way in `general.rs`), `rate.rs`, `reads.rs`, `search.rs` (runs listed and
//!   counted by workflow, time, input value, id prefix); `writer.rs`: the
//!   SQLite group commit they all go through.
//! - backend specifics: `sqlite.rs`, `postgres.rs` (connecting, migrations) and the
//!   `FOR UPDATE` / `SKIP LOCKED` variants picked in place; `db.rs` runs shared SQL on
//!   either driver.
//! - [`notify`]: PostgreSQL `LISTEN/NOTIFY` wake-ups for daemons ([`Ledger::listen_queue`]);
//!   `health.rs`: the probe and counts a daemon's `/healthz` and `/metrics` read.
//! - [`Error`] (`error.rs`) and its [`ErrorClass`]; the facade `ledger.rs` (opening,
//!   shared helpers), `options.rs` (how to open), `conn.rs` (one SQL text bound for
//!   either driver), `rows.rs` (rows to public types), `fence.rs` (the one fence of a
//!   holder's writes), `canonical.rs` (request hashes), `ledger_clock.rs` (the server's
//!   clock for every PostgreSQL process).
//! - the features' tables, each beside its migration: `run_states.rs` (a claimed run's
//!   finish, pause, requeue, cancel; `finish.rs` its return), `approvals/` (the gate,
//!   votes, its sweep rule), `waits/` (event waits, callbacks, publish), `children.rs`
//!   and `lineage.rs` (sub-workflow runs), `holds/` (what those parked nodes share: one
//!   status machine, the one question a pause asks, each kind's rule when its timer fires),
//!   `timers/` (every durable deadline as one row shape; the daemons' one watcher),
//!   `fanouts.rs` (a `for_each` node's stored list),
//!   `probes.rs` (reconciliation's record), `redrive.rs`, `schedules.rs`, `retention/`
//!   (deletion and key tombstones), `connections.rs` and `connection_pending.rs` (OAuth
//!   sign-ins), `trace.rs` (OpenTelemetry context), [`inbox`] (the in-doubt worklist's
//!   reads), `operator.rs` (what the operator API adds: actors, filters) and
//!   `tool_pins.rs` (the pinned definitions of the MCP proxy's tools), `slots.rs` (a
//!   tool's concurrency limit: the calls in flight counted at the outbound mark).
//!
//! # The at-most-once protocol
//! 1. [`Ledger::claim_call`] → `Claimed(lease)`, `Replay`, `InDoubt`, or `Busy` /
//!    `Conflict` / `LeaseLost` errors;
//! 2. [`Ledger::rate_acquire`] (if limited: [`Ledger::release_call`], defer the step);
//! 3. [`Ledger::mark_outbound`]: one fenced, durable statement — only then may bytes leave;
//! 4. the adapter runs, [`Ledger::renew_call_lease`] while waiting;
//! 5. [`Ledger::complete_call`] (outcome, attempt row, usage, step, next step, events in
//!    one transaction) or [`Ledger::mark_in_doubt`].
//!
//! A worker that crashes between 3 and 5 leaves an `outbound` row; whoever claims the
//! call next (after the lease expires, the holder is provably dead on this host, or the
//! run was taken over under a newer run token) turns it `in_doubt` and pauses the step.
//!
//! # Fencing and liveness
//! Every write after a claim carries the lease token in its `WHERE` clause. Expiry is
//! checked only where new work or a side effect begins (`claim_call`, `mark_outbound`,
//! `record_pure_call`): recording a fact that already happened (complete, finish, step
//! writes) is accepted as long as the token still matches, i.e. nobody took over.
//!
//! # Performance and group commit
//! Each method is one transaction. On SQLite they are not committed one by one: every
//! write is a job for the writer task (`writer.rs`), which runs all waiting jobs in one
//! `BEGIN IMMEDIATE`, each under its own `SAVEPOINT` (a failing job rolls back alone),
//! commits once (one fsync on `FULL`) and answers each caller only after that `COMMIT`
//! — `mark_outbound` is still durable before its caller may send. A failed `COMMIT`
//! fails every job of the batch. Jobs run to completion even if their caller stops
//! waiting. PostgreSQL runs each method as its own transaction (one-statement methods
//! without `BEGIN`/`COMMIT`): the server already merges concurrent commits' WAL flushes.
//!
//! Measured (benches/ledger_cycles.rs, `perf`): on SQLite the CPU, not the fsync, is the
//! limit — most of the time is the kernel switching between tokio workers and
//! sqlx-sqlite's per-connection thread, twice per statement. So hot paths do their
//! common case in one statement (`pure/fresh.rs`: a brand-new pure call is one script of
//! chained inserts on SQLite, one statement of data-modifying CTEs on PostgreSQL), and
//! [`Ledger::record_pure_calls`] writes many pure results the engine kept in memory in
//! one transaction (see ARCHITECTURE.md, "Lazy pure results": losing them in a crash
//! only means computing them again).

pub mod clock;
pub mod events;
pub mod ids;
pub mod inbox;
pub mod model;
pub mod notify;
pub mod state;
pub mod worker;

mod approvals;
mod attempts;
mod calls;
mod canonical;
mod children;
mod conn;
mod connection_pending;
mod connections;
mod db;
mod deliveries;
mod enqueue;
mod error;
mod fanouts;
mod fence;
mod finish;
mod health;
mod holds;
mod ledger;
mod ledger_clock;
mod lineage;
mod operator;
mod options;
mod outbound;
mod postgres;
mod probes;
mod pure;
mod rate;
mod reads;
mod redrive;
mod resolve;
mod retention;
mod rows;
mod run_states;
mod runs;
mod schedules;
mod search;
mod slots;
mod sqlite;
mod steps;
mod timers;
mod tool_pins;
mod trace;
mod waits;
mod writer;

pub use approvals::{
    Approval, ApprovalFilter, ApprovalVote, AskApproval, Decide, Decided, Gate, Vote,
};
pub use canonical::{canonical_hash, canonical_json, workflow_hash};
pub use children::ChildStart;
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use connection_pending::PendingSignIn;
pub use connections::{Connection, ConnectionStatus, Endpoints, RefreshFailure, Sealed};
pub use deliveries::{
    Delivery, DeliveryFilter, DeliveryOutcome, DeliveryStatus, FinishDelivery, LeaseDeliveries,
    ScheduleDeliveries, StartAt,
};
pub use error::{Error, ErrorClass};
pub use events::{Event, EventFilter, EventType};
pub use fanouts::Fanout;
pub use finish::FinishedRun;
pub use health::InDoubtTool;
pub use holds::{Hold, HoldKind, HoldStatus, SweptHold, SweptHolds};
pub use ledger::{Ledger, OpenOptions, SqliteSynchronous, redact_url};
pub use model::{
    Actor, Attempt, AttemptOutcome, CallClaim, CallLease, CallOutcome, ClaimCall, ClaimRuns,
    Claimed, CompleteCall, Enqueued, HeartbeatAck, InDoubtReport, NewRun, NewStep, OnParentCancel,
    ParentLink, RateAcquire, RateDecision, Replayed, RequestsSent, Resolution, Resolve, Run,
    RunCursor, RunFilter, RunFinish, RunLease, Scope, Step, StepError, StepFinish, ToolCall, Usage,
    UsageKind, Window,
};
pub use operator::{InDoubtFilter, MAX_BATCH};
pub use probes::{NewProbe, Probe, ProbeDecision, ProbeObserved, ProbeSchedule, RecordedProbe};
pub use pure::{PureBatchRecorded, PureCall, PureRecorded, PureResult};
pub use redrive::{Redrive, Redriven};
pub use retention::{Candidate, Deleted, Kept, RunGc, Sweep, Tombstone, key_hash};
pub use runs::MAX_CLAIM;
pub use schedules::{
    APPLIED_FROM, Applied, Handled, HistoryEntry, HistoryKind, MAX_HISTORY_PAGE, Overlap,
    ScheduleDef, ScheduleState, TickPlan, applied_from,
};
pub use search::MAX_INPUT_VALUE_LEN;
pub use slots::{Slot, SlotMark, SlotUse, WAITER_FRESH};
pub use sqlite::{is_read_only_url, path_of as sqlite_path};
pub use state::{
    ApprovalStatus, CallStatus, ErrorKind, RunStatus, RunTransition, StepStatus, WaitKind,
    WaitStatus,
};
pub use timers::{FiredTimers, TimerKind, TimerRules};
pub use tool_pins::ToolPin;
pub use waits::{
    BeginWait, CallbackReply, MAX_CANDIDATES as MAX_WAIT_CANDIDATES, Published, PublishedEvent,
    Wait, WaitFilter,
};
pub use worker::WorkerId;

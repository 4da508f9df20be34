//! flow: a durable workflow engine whose side-effecting tool calls run at most once.
//!
//! The crate is the `flow` binary's library. Its modules, grouped by layer:
//!
//! The language — what a workflow says:
//! - [`workflow`]: workflow files: safe reading, the model, validation with positions.
//! - [`plan`]: the DAG (petgraph), topological order and the ready set.
//! - [`schema`]: the JSON Schema of workflow files, for editors.
//! - [`diagram`]: drawing a workflow as Mermaid or Graphviz (`flow graph`).
//! - [`inputs`]: run inputs from `--input` and `--inputs-file`, typed by declaration.
//! - [`item_id`]: how a `for_each` item's step and call are named (`node[<key>]`).
//!
//! The core — running a run at most once per call:
//! - [`snapshot`]: the workflow a run carries, re-validated on resume and by daemons.
//! - [`executor`]: running a run: decisions (pure) and the loop that performs them.
//! - [`gateway`]: the at-most-once boundary of one tool call.
//! - [`lease`]: how long this process's leases last and when it stops trusting them.
//! - [`retry`]: retry delays (pure, injected RNG).
//! - [`approval`]: approvals, the engine's half: who may decide, what a decision counts as.
//! - [`policy`]: `[[policy.approvals]]`: calls that need an approval whatever the workflow says.
//! - [`reconcile`]: settling an in-doubt call by asking the downstream first.
//! - [`redrive`]: which nodes a redrive runs again.
//! - [`runtime`]: the composition root: ledger, tools, secrets and egress into a gateway.
//!
//! Services — what a long-running process does beside runs:
//! - [`daemon`]: `flow daemon`, workers draining the shared run queue; metrics, health.
//! - [`events`]: delivering outbox events to consumers, at least once.
//! - [`schedule`]: `[[schedules]]`, fired once per tick however many daemons run.
//! - [`retention`]: `[retention]` and the passes that delete what it allows.
//! - [`connections`]: MCP servers signed in to once by a person, used by every worker.
//! - [`telemetry`]: OpenTelemetry traces of runs, steps and calls.
//!
//! Faces — how people and programs reach flow:
//! - [`cli`]: the command line, callable from tests as [`cli::run`].
//! - [`serve`]: `flow serve`, the operator API over HTTP (tokens, roles, problem+json).
//! - [`mcp`]: flow as an MCP server: workflows as tools an agent calls, one run per call.
//! - [`view`]: the typed views of runs every face serializes.
//!
//! Support — small rules shared by several layers:
//! - [`config`]: `flow.toml` (egress allow-list, event consumers, …).
//! - [`role`]: what an API token may do (viewer, operator, admin).
//! - [`secrets`]: secret values (environment, dotenv file), redaction and scrubbing.
//! - [`sign`]: HMAC-SHA256: event signatures and approval digests over secret values.
//! - [`host_pattern`]: the grammar of a host pattern (`[egress] allow`, approval rules).
//! - [`backoff`]: how long to wait before trying again, one shape for every retry.
//! - [`duration_text`]: the one way a duration is printed to people.
//! - [`json_line`]: one JSON object per stderr line, shaped like the tracing lines.
//! - [`read_limited`]: reading a user-named file with a size limit.
//! - [`fault`]: `FLOW_FAULT` crash points for tests.

pub mod approval;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod connections;
pub mod daemon;
pub mod diagram;
pub mod duration_text;
pub mod events;
pub mod executor;
pub mod fault;
pub mod gateway;
pub mod host_pattern;
pub mod inputs;
pub mod item_id;
pub mod json_line;
pub mod lease;
pub mod mcp;
pub mod plan;
pub mod policy;
pub mod read_limited;
pub mod reconcile;
pub mod redrive;
pub mod retention;
pub mod retry;
pub mod role;
pub mod runtime;
pub mod schedule;
pub mod schema;
pub mod secrets;
pub mod serve;
pub mod sign;
pub mod snapshot;
pub mod telemetry;
pub mod view;
pub mod workflow;

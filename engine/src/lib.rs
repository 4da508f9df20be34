//! flow: a durable workflow engine whose side-effecting tool calls run at most once.
//!
//! The crate is the `flow` binary's library. Its modules, in the order a run meets them:
//!
//! - [`workflow`]: workflow files: safe reading, the model, validation with positions.
//! - [`plan`]: the DAG (petgraph), topological order and the ready set.
//! - [`executor`]: running a run: decisions (pure) and the loop that performs them.
//! - [`diagram`]: drawing a workflow as Mermaid or Graphviz (`flow graph`).
//! - [`schema`]: the JSON Schema of workflow files, for editors.
//! - [`inputs`]: run inputs from `--input` and `--inputs-file`, typed by declaration.
//! - [`secrets`]: secret values (environment, dotenv file), redaction and scrubbing.
//! - [`snapshot`]: the workflow a run carries, re-validated on resume and by daemons.
//! - [`config`]: `flow.toml` (egress allow-list, event consumers).
//! - [`events`]: delivering outbox events to consumers, at least once.
//! - [`gateway`]: the at-most-once boundary of one tool call.
//! - [`daemon`]: `flow daemon`, workers draining the shared run queue; metrics, health.
//! - [`serve`]: `flow serve`, the operator API over HTTP (tokens, roles, problem+json).
//! - [`retry`]: retry delays (pure, injected RNG).
//! - [`fault`]: `FLOW_FAULT` crash points for tests.
//! - [`cli`]: the command line, callable from tests as [`cli::run`].

pub mod approval;
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
pub mod plan;
pub mod policy;
pub mod read_limited;
pub mod reconcile;
pub mod redrive;
pub mod retention;
pub mod retry;
pub mod runtime;
pub mod schedule;
pub mod schema;
pub mod secrets;
pub mod serve;
pub mod snapshot;
pub mod telemetry;
pub mod view;
pub mod workflow;

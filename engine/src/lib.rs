//! flow: a durable workflow engine whose side-effecting tool calls run at most once.
//!
//! The crate is the `flow` binary's library. Its modules, in the order a run meets them:
//!
//! - [`workflow`]: workflow files: safe reading, the model, validation with positions.
//! - [`plan`]: the DAG (petgraph), topological order and the ready set.
//! - [`render`]: drawing a workflow as Mermaid or Graphviz.
//! - [`schema`]: the JSON Schema of workflow files, for editors.
//! - [`cli`]: the command line, callable from tests as [`cli::run`].

pub mod cli;
pub mod plan;
pub mod render;
pub mod schema;
pub mod workflow;

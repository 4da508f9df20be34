//! flow's tool adapters: the only code in flow that talks to the outside world.
//!
//! Every node of a workflow calls one [`Tool`]. The engine renders the node's `with`
//! (templates and secrets) into a [`Call`], hands it to a tool, and gets back an
//! [`Outcome`]: the JSON output or a classified [`Error`], plus how many requests
//! actually left the process. The classification ([`FailureKind`]) is decided here,
//! where the knowledge is, so that the engine can tell "never sent" from "sent, outcome
//! unknown" without guessing:
//!
//! | kind | meaning | engine's reaction |
//! |---|---|---|
//! | [`FailureKind::Permanent`] | config, validation, 4xx, non-zero exit, MCP `isError` | fail; retrying cannot help |
//! | [`FailureKind::Transient`] | 408/425/429/5xx, MCP HTTP 429/5xx | retry by policy, honouring `retry_after` |
//! | [`FailureKind::Unknown`] | the request may have been processed (timeout or lost connection after it was written) | in doubt: never re-sent blindly |
//! | [`FailureKind::NotSent`] | provably never left (connect refused, DNS, spawn failure) | safe to send again |
//!
//! No adapter turns an error into a success value, and none retries behind the engine's
//! back except the two documented cases, both counted in [`Outcome::requests_sent`]: an
//! HTTP request whose connection was refused is tried once more at once, and an MCP call
//! answered by an OAuth scope challenge is re-sent once with a new token.
//!
//! The crate knows nothing of runs, steps, leases or the ledger (invariant: it never
//! depends on `flow-ledger`). Modules, one per tool kind:
//!
//! - [`function`]: in-process async Rust functions and the `core.*` built-ins;
//! - [`command`]: a local program, `with` as JSON on stdin, no shell;
//! - [`http`]: one HTTP request through a shared connection pool;
//! - [`mcp`]: a tool on an MCP server (stdio child or streamable HTTP), one session per
//!   server reused across calls;
//! - [`api_client`]: a client of flow's own operator API (the CLI's `--server` mode);
//! - `testkit` (feature `testkit`): real test servers for this crate's and the engine's
//!   tests, and the `flow-testkit` binary.
//!
//! Shared by the kinds: `tool.rs` (the contract: [`Tool`], [`Call`], [`Outcome`]),
//! `error.rs` (the one [`Error`], its retryability in the type), `fence.rs` (until when
//! a request may still leave: the engine's leases by this process's clock), [`egress`]
//! (host allow-lists checked on every hop), `process.rs` (process groups: a command or
//! MCP server leaves nothing behind), `lazy_client.rs` (HTTP clients built on first
//! use) and `redact.rs` (debug output that shows secret names, never values).

mod error;
mod fence;
mod lazy_client;
mod process;
mod redact;
mod tool;

pub mod api_client;
pub mod command;
pub mod egress;
pub mod function;
pub mod http;
pub mod mcp;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::{Error, FailureKind};
pub use fence::{Closed, Fence, Window};
pub use tool::{BoxFuture, Call, Outcome, Report, Reports, SideEffect, Tool, TraceContext};

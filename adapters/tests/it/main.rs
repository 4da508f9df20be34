//! flow-adapters integration tests: real servers, real processes, no mocks.

mod command;
mod function;
#[cfg(feature = "testkit")]
mod http;
#[cfg(feature = "testkit")]
mod mcp_auth;
#[cfg(feature = "testkit")]
mod mcp_cancel;
#[cfg(feature = "testkit")]
mod mcp_discovery;
#[cfg(feature = "testkit")]
mod mcp_elicit;
#[cfg(feature = "testkit")]
mod mcp_http;
#[cfg(feature = "testkit")]
mod mcp_input;
#[cfg(feature = "testkit")]
mod mcp_oversize;
mod mcp_pinned;
#[cfg(feature = "testkit")]
mod mcp_stdio;
#[cfg(feature = "testkit")]
mod mcp_tasks;
#[cfg(feature = "testkit")]
mod mcp_versions;
mod support;
#[cfg(feature = "testkit")]
mod testkit;

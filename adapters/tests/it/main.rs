//! flow-adapters integration tests: real servers, real processes, no mocks.

mod command;
mod function;
#[cfg(feature = "testkit")]
mod http;
#[cfg(feature = "testkit")]
mod mcp_auth;
#[cfg(feature = "testkit")]
mod mcp_http;
#[cfg(feature = "testkit")]
mod mcp_stdio;
mod support;
#[cfg(feature = "testkit")]
mod testkit;

//! The tools' shared state, built once per process and handed to the gateway.

use flow_adapters::{function, http, mcp};

/// The tools' shared state: one HTTP connection pool, one MCP session per server, the
/// function registry.
#[derive(Clone)]
pub struct Tools {
    /// In-process functions.
    pub functions: function::Registry,
    /// The HTTP client (one connection pool).
    pub http: http::Client,
    /// MCP sessions, one per server.
    pub mcp: mcp::Pool,
}

impl Tools {
    /// Built-in functions and fresh pools.
    pub fn new() -> Result<Self, flow_adapters::Error> {
        Ok(Self {
            functions: function::Registry::with_builtins(),
            http: http::Client::new()?,
            mcp: mcp::Pool::new()?,
        })
    }
}

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
    /// Builds the HTTP clients if they are not yet: they are made on first use (a run
    /// of pure functions never pays for loading the system's root certificates), and
    /// the gateway calls this before a call's outbound mark, so building one never
    /// widens the window between the mark and the request leaving. A client that cannot
    /// be built fails that call, not sent, when it is used.
    pub fn warm(&self) {
        for built in [self.http.warm(), self.mcp.warm()] {
            if let Err(e) = built {
                tracing::warn!("{}", e.message);
            }
        }
    }

    /// Whether `tool` is a pure in-process function: its steps need no claim and no
    /// outbound mark, and their spans are exported only on request (they can be
    /// thousands per run).
    pub fn is_pure(&self, tool: &crate::workflow::ToolDecl) -> bool {
        match &tool.kind {
            crate::workflow::ToolKind::Function { function } => {
                self.functions.get(function).is_some_and(|f| f.is_pure())
            }
            _ => false,
        }
    }

    /// Built-in functions and fresh pools.
    pub fn new() -> Result<Self, flow_adapters::Error> {
        Ok(Self {
            functions: function::Registry::with_builtins(),
            http: http::Client::new()?,
            mcp: mcp::Pool::new()?,
        })
    }
}

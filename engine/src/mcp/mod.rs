//! flow as an MCP server: the workflows `[mcp] workflows` names are tools an agent
//! lists and calls, over Streamable HTTP at `/mcp` (`flow serve`, `flow daemon
//! --serve`, the API's bearer tokens) or over stdio (`flow mcp serve`).
//!
//! A `tools/call` is a run, so everything flow promises a run holds for an agent: each
//! side effect at most once, an unknown outcome paused and never guessed, approvals
//! decided by people. What the MCP front adds is that **a call starts at most one
//! run**, whatever the client does: agent clients are seen dispatching one call twice
//! with new JSON-RPC ids, or retrying after their own time-out while the first call
//! still runs.
//!
//! - With `_meta["io.flow/idempotency-key"]` the run id is derived from the caller,
//!   the tool and the key ([`call::run_id_for_key`]): the same call a day later
//!   answers from the same run; the same key with other arguments is refused.
//! - Without one, identical calls (same caller, tool and canonical arguments) within
//!   `[mcp] window` join the first call's run ([`call::coalesce`]) and say so in
//!   `_meta["io.flow/coalesced"]`.
//!
//! Modules: [`catalog`] (which workflows are tools and how they describe themselves),
//! [`proxy`] (the tools of `[[mcp.servers]]`, each call a one-node run through the
//! gateway),
//! [`call`] (one `tools/call`: the run it starts or joins, waiting for it, the answer),
//! [`tasks`] (a call still running or waiting, as an MCP task that is a view of its run),
//! [`server`] (the rmcp handler and its HTTP and stdio fronts).

pub mod call;
pub mod catalog;
pub mod proxy;
pub mod server;
pub mod tasks;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flow_ledger::{Clock, Ledger};

pub use catalog::Catalog;

/// The `_meta` key that names a call's idempotency key, here and on the calls flow
/// makes to MCP servers. Clients hard-code it: never rename.
pub const KEY_META: &str = "io.flow/idempotency-key";
/// The `_meta` key of an answer that joined an earlier identical call's run.
pub const COALESCED_META: &str = "io.flow/coalesced";
/// The `_meta` key of an answer's run id.
pub const RUN_META: &str = "io.flow/run-id";
/// The prefix of the submitter flow records for a run an agent started over MCP. An
/// approval of such a run is never decided by that agent's principal, whatever the
/// node's `forbid_self` says (`crate::approval::authorize`).
pub const SUBMITTER_PREFIX: &str = crate::approval::MCP_SUBMITTER;

/// The built-in read-only tool that answers for a run by id (a call that answered
/// "still running" or "waiting" is followed up with it).
pub const STATUS_TOOL: &str = "flow_run_status";

/// Default `[mcp] window`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);
/// Default `[mcp] wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// What every MCP session of one process shares: the ledger, the catalog and the
/// settings.
pub struct Front {
    /// Where runs are queued and read.
    pub ledger: Ledger,
    /// The time runs are stamped with (the gateway's clock).
    pub clock: Arc<dyn Clock>,
    /// The tools.
    pub catalog: Catalog,
    /// `[mcp] window`.
    pub window: Duration,
    /// `[mcp] wait`.
    pub wait: Duration,
    /// `[api] public_url`: where an agent's human approves (`…/ui/runs/<id>`).
    pub public_url: Option<String>,
    /// Serializes [`call::coalesce`] in this process, so two identical calls arriving
    /// together pick one window, not one each.
    pub(crate) joining: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("catalog", &self.catalog)
            .field("window", &self.window)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// Why the MCP front could not be set up (the installation's fault).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad `[mcp]` value.
    #[error("[mcp] {0}")]
    Setting(String),
    /// A workflow of the catalog could not be used.
    #[error(transparent)]
    Catalog(#[from] catalog::Error),
}

/// What [`Front::open`] needs besides `[mcp]`.
pub struct Opening<'a> {
    /// The ledger runs are queued in.
    pub ledger: Ledger,
    /// The gateway's clock.
    pub clock: Arc<dyn Clock>,
    /// The gateway (its tools tell pure functions from side effects; its MCP pool
    /// lists the proxied servers' tools).
    pub gateway: &'a crate::gateway::Gateway,
    /// The directory of `flow.toml` (patterns are relative to it).
    pub base: &'a Path,
    /// `[api] public_url`.
    pub public_url: Option<String>,
}

impl Front {
    /// The front `[mcp]` describes, or `None` when it names no workflow and no server.
    /// The proxied servers are listed now.
    pub async fn open(
        mcp: &crate::config::Mcp,
        at: Opening<'_>,
    ) -> Result<Option<Arc<Front>>, Error> {
        if mcp.workflows.is_empty() && mcp.servers.is_empty() {
            return Ok(None);
        }
        let window = duration("window", mcp.window.as_deref(), DEFAULT_WINDOW)?;
        let wait = duration("wait", mcp.wait.as_deref(), DEFAULT_WAIT)?;
        let mut catalog = Catalog::load(&mcp.workflows, at.base, at.gateway.tools())?;
        catalog.add_servers(&mcp.servers, at.gateway).await?;
        Ok(Some(Arc::new(Front {
            ledger: at.ledger,
            clock: at.clock,
            catalog,
            window,
            wait,
            public_url: at.public_url,
            joining: tokio::sync::Mutex::new(()),
        })))
    }
}

/// A duration setting: `text` parsed (more than zero), or `default`.
fn duration(key: &str, text: Option<&str>, default: Duration) -> Result<Duration, Error> {
    let Some(text) = text else {
        return Ok(default);
    };
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(Error::Setting(format!("{key}: must be more than zero"))),
        Err(e) => Err(Error::Setting(format!(
            "{key}: `{text}` is not a duration ({e}); write e.g. \"5s\""
        ))),
    }
}

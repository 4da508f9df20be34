//! The composition root: the one place a process puts a ledger, the tools, the secrets
//! and the egress policy together into a [`Gateway`], and an [`Executor`] or the
//! operator API on top of it. `flow run`/`resume`, `flow daemon` and `flow serve` all
//! start here, so a new part (a telemetry exporter, a connection store) is wired once.
//!
//! It sits above `gateway`, `executor` and `serve` and below `cli`: the command line
//! parses flags into [`RuntimeOptions`] and never builds these parts itself (nor
//! imports `serve`; a tidy test checks that `cli` and `serve` never import each other).

pub mod api;

use std::sync::Arc;

use flow_ledger::{Clock, Ledger, SystemClock};

use crate::executor::{Executor, progress::Progress};
use crate::fault::Faults;
use crate::gateway::{Gateway, Guards, Tools};
use crate::secrets::Secrets;

/// What a process needs to open its runtime.
#[derive(Debug)]
pub struct RuntimeOptions {
    /// The ledger's URL (`sqlite:…`, `postgres://…`).
    pub db: String,
    /// How to open it (scope, connections).
    pub ledger: flow_ledger::OpenOptions,
    /// The secrets tools and tokens are rendered with.
    pub secrets: Secrets,
    /// Where requests may go (`[egress]`) and which calls need an approval whatever
    /// the workflow says (`[[policy.approvals]]`).
    pub guards: Guards,
    /// `[api] public_url`: the address downstreams reach `flow serve` at, from which
    /// `callback.url` is built (unset: callback nodes fail without sending).
    pub public_url: Option<String>,
}

/// Why a runtime could not be opened: the caller maps each to its exit code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ledger could not be opened (unreachable, wrong schema, bad URL).
    #[error("cannot open the ledger at {url}: {source}")]
    Ledger {
        /// The URL, password redacted.
        url: String,
        /// What the ledger said.
        source: flow_ledger::Error,
    },
    /// The HTTP or MCP clients could not be set up (TLS roots, proxies).
    #[error("cannot set up tool clients: {0}")]
    Tools(#[from] flow_adapters::Error),
}

/// An opened ledger and the gateway every call goes through; cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    /// The ledger.
    pub ledger: Ledger,
    /// The gateway: tools, secrets, egress, faults, clock (the process's one clock:
    /// the services beside the executor read it through [`Gateway::clock`]).
    pub gateway: Gateway,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ledger", &self.ledger.url_redacted())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Opens the ledger and builds the gateway (`FLOW_FAULT` faults read from the
    /// environment, the system clock).
    pub async fn open(options: RuntimeOptions) -> Result<Runtime, Error> {
        let ledger = Ledger::open(&options.db, options.ledger)
            .await
            .map_err(|source| Error::Ledger {
                url: flow_ledger::redact_url(&options.db),
                source,
            })?;
        Runtime::with_ledger(ledger, options.secrets, options.guards, options.public_url)
    }

    /// The runtime around a ledger the caller already opened.
    pub fn with_ledger(
        ledger: Ledger,
        secrets: Secrets,
        guards: Guards,
        public_url: Option<String>,
    ) -> Result<Runtime, Error> {
        let tools = Tools::new()?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let gateway = Gateway::new(
            ledger.clone(),
            clock,
            tools,
            secrets,
            guards,
            public_url,
            Faults::from_env(),
        );
        Ok(Runtime { ledger, gateway })
    }

    /// An executor on this runtime's gateway, reporting to `progress`.
    pub fn executor(&self, progress: Arc<dyn Progress>) -> Executor {
        use rand::SeedableRng;
        Executor::new(
            self.gateway.clone(),
            progress,
            rand::rngs::StdRng::from_os_rng(),
        )
    }
}

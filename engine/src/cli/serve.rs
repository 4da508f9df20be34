//! `flow serve`: the operator API (`crate::serve`, through `crate::runtime`) from the
//! command line.
//!
//! Refuses to start without `[[api.tokens]]` in `flow.toml` unless
//! `--insecure-no-auth`, and then only on a loopback address: an unauthenticated API
//! that can resolve calls must not be reachable from another machine.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;

use super::error::Error;
use super::{Cli, exit, logging, open_ledger};
use crate::config::Config;
use crate::daemon::metrics::Metrics;
use crate::daemon::shutdown;
use crate::runtime::Runtime;
use crate::runtime::api::{ApiAuth, Served};
use crate::secrets::Secrets;

/// Arguments of `flow serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one, printed on stderr).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub addr: SocketAddr,
    /// Serve without authentication (every caller is admin `anonymous`); only on a
    /// loopback address, and only when flow.toml declares no [[api.tokens]].
    #[arg(long)]
    pub insecure_no_auth: bool,
}

/// `flow serve`: serves until SIGTERM/SIGINT, then finishes the requests in flight.
pub(crate) async fn serve(
    cli: &Cli,
    args: &ServeArgs,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    // flow.toml once, for the tokens and for the egress policy: a bad flag or address
    // is exit 2, a bad installation exit 5 (see `ApiAuth::from_config`).
    let mut config = Config::load(cli.config.as_deref())?;
    logging::init(
        cli.log_format,
        &secrets,
        &config.telemetry,
        crate::telemetry::Process::Service,
    );
    let schedules = crate::schedule::manage::Schedules::new(
        std::mem::take(&mut config.schedules),
        config.path.as_deref(),
    );
    let connections = std::mem::take(&mut config.connections);
    let auth = ApiAuth::from_config(&config.api, &secrets, args.addr, args.insecure_no_auth)?;
    let ledger = open_ledger(cli).await?;
    // "Probe now" sends its probes with this process's tools, secrets and egress, as a
    // daemon's worker would.
    let public_url = config.api.public_url.clone();
    let guards = crate::gateway::Guards {
        egress: config.egress,
        policy: config.policy,
    };
    let runtime = Runtime::with_ledger(ledger, secrets, guards, public_url)?;
    let mcp = runtime
        .mcp_front(&config.mcp, config.path.as_deref())
        .await
        .map_err(|e| Error::unavailable(e.to_string()))?;
    let described = if auth.is_insecure() {
        "WITHOUT authentication".to_string()
    } else {
        format!("{} token(s)", auth.token_count())
    };
    let handle = shutdown::Handle::new();
    let (bound, task) = runtime
        .serve_api(
            auth,
            Served {
                metrics: Arc::new(Metrics::new()),
                schedules,
                connections,
                mcp,
            },
            args.addr,
            handle.graceful().clone(),
        )
        .await
        .map_err(|e| Error::unavailable(format!("cannot serve the API on {}: {e}", args.addr)))?;
    let _ = writeln!(
        stderr,
        "flow serve listening on http://{bound} ({}, {described}); API at http://{bound}/api/v1, console at http://{bound}/ui",
        runtime.ledger.url_redacted()
    );
    let signals = tokio::spawn(shutdown::on_signals(handle.clone()));
    let _ = task.await;
    signals.abort();
    Ok(exit::OK)
}

//! `flow serve`: the operator API (`crate::serve`) from the command line, and the
//! token set-up `flow daemon --serve` shares.
//!
//! Refuses to start without `[[api.tokens]]` in `flow.toml` unless
//! `--insecure-no-auth`, and then only on a loopback address: an unauthenticated API
//! that can resolve calls must not be reachable from another machine.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::error::CliError;
use super::{Cli, exit, logging, open_ledger};
use crate::config::Config;
use crate::daemon::metrics::Metrics;
use crate::daemon::shutdown;
use crate::secrets::Secrets;
use crate::serve::auth::{Token, Tokens};
use crate::serve::{App, serve as bind};

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

/// The tokens of `flow.toml`, their values read from the secrets. Refused: a bad
/// address or flag (exit 2), a bad installation — unreadable config, a token whose
/// secret is missing (exit 5).
pub(crate) fn tokens(cli: &Cli, addr: SocketAddr, insecure: bool) -> Result<Tokens, CliError> {
    let config = Config::load(cli.config.as_deref())?;
    let declared = config.api.tokens;
    if declared.is_empty() {
        if !insecure {
            return Err(CliError::unavailable(
                "no [[api.tokens]] in flow.toml: declare at least one (name, role, secret), or pass --insecure-no-auth to serve without authentication on loopback",
            ));
        }
        if !addr.ip().is_loopback() {
            return Err(CliError::invalid(format!(
                "--insecure-no-auth serves only on a loopback address (127.0.0.1, ::1), not {addr}: anyone who reaches it could resolve calls"
            )));
        }
        return Ok(Tokens::Insecure);
    }
    if insecure {
        return Err(CliError::invalid(
            "--insecure-no-auth with [[api.tokens]] declared: drop the flag (the tokens are used) or the tokens",
        ));
    }
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    let mut tokens = Vec::with_capacity(declared.len());
    for t in declared {
        let Some(value) = secrets.get(&t.secret).filter(|v| !v.is_empty()) else {
            return Err(CliError::unavailable(format!(
                "API token `{}`: secret `{}` is not set: provide FLOW_SECRET_{} in the environment or a line `{}=…` in --secrets-file",
                t.name, t.secret, t.secret, t.secret
            )));
        };
        tokens.push(Token::new(t.name, t.role, value));
    }
    Ok(Tokens::Required(tokens))
}

/// Binds the API on `addr` for a command that already holds its ledger and metrics
/// (exit 5 when the address cannot be bound).
pub(crate) async fn start(
    app: App,
    addr: SocketAddr,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), CliError> {
    bind(addr, Arc::new(app), stop)
        .await
        .map_err(|e| CliError::unavailable(format!("cannot serve the API on {addr}: {e}")))
}

/// The tools, secrets and egress policy "probe now" sends its probes with: this
/// process's, as a daemon's worker would use them.
fn probe_gateway(
    cli: &Cli,
    ledger: &flow_ledger::Ledger,
    secrets: Secrets,
) -> Result<crate::gateway::Gateway, CliError> {
    let config = Config::load(cli.config.as_deref())?;
    let tools = crate::gateway::Tools::new()
        .map_err(|e| CliError::unavailable(format!("cannot set up tool clients: {e}")))?;
    Ok(crate::gateway::Gateway::new(
        ledger.clone(),
        Arc::new(flow_ledger::SystemClock),
        tools,
        secrets,
        config.egress,
        crate::fault::Faults::from_env(),
    ))
}

/// `flow serve`: serves until SIGTERM/SIGINT, then finishes the requests in flight.
pub(crate) async fn serve(
    cli: &Cli,
    args: &ServeArgs,
    stderr: &mut dyn Write,
) -> Result<u8, CliError> {
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    logging::init(cli.log_format, &secrets);
    let tokens = tokens(cli, args.addr, args.insecure_no_auth)?;
    let ledger = open_ledger(cli).await?;
    let gateway = probe_gateway(cli, &ledger, secrets)?;
    let auth = match &tokens {
        Tokens::Insecure => "WITHOUT authentication".to_string(),
        Tokens::Required(t) => format!("{} token(s)", t.len()),
    };
    let app = App {
        ledger: ledger.clone(),
        tokens,
        metrics: Arc::new(Metrics::new()),
        gateway,
    };
    let handle = shutdown::Handle::new();
    let (bound, task) = start(app, args.addr, handle.graceful().clone()).await?;
    let _ = writeln!(
        stderr,
        "flow serve listening on http://{bound} ({}, {auth}); API at http://{bound}/api/v1, console at http://{bound}/ui",
        ledger.url_redacted()
    );
    let signals = tokio::spawn(shutdown::on_signals(handle.clone()));
    let _ = task.await;
    signals.abort();
    Ok(exit::OK)
}

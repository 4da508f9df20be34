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

/// How the API authenticates, from `flow.toml`: the tokens and the one `/metrics`
/// needs, if any.
#[derive(Debug)]
pub(crate) struct ApiAuth {
    /// The bearer tokens (or none, with `--insecure-no-auth`).
    pub tokens: Tokens,
    /// `[api] metrics_token`, checked to name a declared token.
    pub metrics_token: Option<String>,
}

/// The tokens of `flow.toml`, their values read from the secrets. Refused: a bad
/// address or flag (exit 2), a bad installation — unreadable config, a token whose
/// secret is missing, two tokens with one name or one value, a `metrics_token` naming
/// no token (exit 5).
pub(crate) fn tokens(cli: &Cli, addr: SocketAddr, insecure: bool) -> Result<ApiAuth, CliError> {
    let config = Config::load(cli.config.as_deref())?;
    let declared = config.api.tokens;
    let metrics_token = config.api.metrics_token;
    if let Some(name) = &metrics_token
        && !declared.iter().any(|t| &t.name == name)
    {
        return Err(CliError::unavailable(format!(
            "[api] metrics_token = \"{}\" names no [[api.tokens]] entry: use one of their names",
            name.escape_debug()
        )));
    }
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
        return Ok(ApiAuth {
            tokens: Tokens::Insecure,
            metrics_token: None,
        });
    }
    if insecure {
        return Err(CliError::invalid(
            "--insecure-no-auth with [[api.tokens]] declared: drop the flag (the tokens are used) or the tokens",
        ));
    }
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    let mut tokens: Vec<(Token, &str)> = Vec::with_capacity(declared.len());
    for t in &declared {
        let Some(value) = secrets.get(&t.secret).filter(|v| !v.is_empty()) else {
            return Err(CliError::unavailable(format!(
                "API token `{}`: secret `{}` is not set: provide FLOW_SECRET_{} in the environment or a line `{}=…` in --secrets-file",
                t.name, t.secret, t.secret, t.secret
            )));
        };
        let token = Token::new(t.name.clone(), t.role, value);
        check_distinct(&token, &t.secret, &tokens)?;
        tokens.push((token, &t.secret));
    }
    Ok(ApiAuth {
        tokens: Tokens::Required(tokens.into_iter().map(|(t, _)| t).collect()),
        metrics_token,
    })
}

/// Refuses a token whose name is not a plain name, or whose name or value an earlier
/// entry already has: with one value, whichever entry came last would silently decide
/// the role; with one name, the audit trail could not tell two tokens apart.
fn check_distinct(token: &Token, secret: &str, before: &[(Token, &str)]) -> Result<(), CliError> {
    let name = &token.name;
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(CliError::unavailable(format!(
            "API token name \"{}\" must be 1 to 128 characters without control characters (it is recorded as `by` in the ledger)",
            name.escape_debug()
        )));
    }
    for (other, other_secret) in before {
        if &other.name == name {
            return Err(CliError::unavailable(format!(
                "two [[api.tokens]] entries are named `{name}`: give each token its own name (it is recorded as `by` on everything it does)"
            )));
        }
        if other.same_value(token) {
            return Err(CliError::unavailable(format!(
                "[[api.tokens]] `{}` (secret `{other_secret}`) and `{name}` (secret `{secret}`) have the same value: a request could not tell them apart and the later entry would decide the role; give each token its own value",
                other.name
            )));
        }
    }
    Ok(())
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
    let ApiAuth {
        tokens,
        metrics_token,
    } = tokens(cli, args.addr, args.insecure_no_auth)?;
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
        metrics_token,
        throttle: crate::serve::throttle::Throttle::default(),
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

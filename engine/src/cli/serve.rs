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

use super::{Cli, config_exit_code, exit, logging, open_ledger, secrets_exit_code};
use crate::config::Config as FileConfig;
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

/// The tokens of `flow.toml`, their values read from the secrets; `Err` is the exit
/// code, explained on `stderr` (2 for a refused address or flag, 5 for a bad
/// installation: unreadable config, a token whose secret is missing).
pub(crate) fn tokens(
    cli: &Cli,
    addr: SocketAddr,
    insecure: bool,
    stderr: &mut dyn Write,
) -> Result<Tokens, u8> {
    let config = FileConfig::load(cli.config.as_deref()).map_err(|e| {
        let _ = writeln!(stderr, "error: {e}");
        config_exit_code(&e)
    })?;
    let declared = config.api.tokens;
    if declared.is_empty() {
        if !insecure {
            let _ = writeln!(
                stderr,
                "error: no [[api.tokens]] in flow.toml: declare at least one (name, role, secret), or pass --insecure-no-auth to serve without authentication on loopback"
            );
            return Err(exit::UNAVAILABLE);
        }
        if !addr.ip().is_loopback() {
            let _ = writeln!(
                stderr,
                "error: --insecure-no-auth serves only on a loopback address (127.0.0.1, ::1), not {addr}: anyone who reaches it could resolve calls"
            );
            return Err(exit::INVALID);
        }
        return Ok(Tokens::Insecure);
    }
    if insecure {
        let _ = writeln!(
            stderr,
            "error: --insecure-no-auth with [[api.tokens]] declared: drop the flag (the tokens are used) or the tokens"
        );
        return Err(exit::INVALID);
    }
    let secrets = Secrets::load(cli.secrets_file.as_deref()).map_err(|e| {
        let _ = writeln!(stderr, "error: {e}");
        secrets_exit_code(&e)
    })?;
    let mut tokens = Vec::with_capacity(declared.len());
    for t in declared {
        let Some(value) = secrets.get(&t.secret).filter(|v| !v.is_empty()) else {
            let _ = writeln!(
                stderr,
                "error: API token `{}`: secret `{}` is not set: provide FLOW_SECRET_{} in the environment or a line `{}=…` in --secrets-file",
                t.name, t.secret, t.secret, t.secret
            );
            return Err(exit::UNAVAILABLE);
        };
        tokens.push(Token::new(t.name, t.role, value));
    }
    Ok(Tokens::Required(tokens))
}

/// Binds the API on `addr` for a command that already holds its ledger and metrics;
/// `Err` is the exit code (5: the address cannot be bound).
pub(crate) async fn start(
    app: App,
    addr: SocketAddr,
    stop: CancellationToken,
    stderr: &mut dyn Write,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), u8> {
    bind(addr, Arc::new(app), stop).await.map_err(|e| {
        let _ = writeln!(stderr, "error: cannot serve the API on {addr}: {e}");
        exit::UNAVAILABLE
    })
}

/// `flow serve`: serves until SIGTERM/SIGINT, then finishes the requests in flight.
pub(crate) async fn serve(cli: &Cli, args: &ServeArgs, stderr: &mut dyn Write) -> u8 {
    logging::init(cli.log_format, &Secrets::default());
    let tokens = match tokens(cli, args.addr, args.insecure_no_auth, stderr) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let ledger = match open_ledger(cli, stderr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let auth = match &tokens {
        Tokens::Insecure => "WITHOUT authentication".to_string(),
        Tokens::Required(t) => format!("{} token(s)", t.len()),
    };
    let app = App {
        ledger: ledger.clone(),
        tokens,
        metrics: Arc::new(Metrics::new()),
    };
    let handle = shutdown::Handle::new();
    let (bound, task) = match start(app, args.addr, handle.graceful().clone(), stderr).await {
        Ok(served) => served,
        Err(code) => return code,
    };
    let _ = writeln!(
        stderr,
        "flow serve listening on http://{bound} ({}, {auth}); API at http://{bound}/api/v1",
        ledger.url_redacted()
    );
    let signals = tokio::spawn(shutdown::on_signals(handle.clone()));
    let _ = task.await;
    signals.abort();
    exit::OK
}

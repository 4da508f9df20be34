//! `flow mcp serve`: flow as an MCP server on stdin/stdout, for an agent that starts its
//! servers as child processes (a desktop or CLI agent's config). The process is a
//! daemon too — it runs the calls' workflows itself — and stops gracefully when the
//! agent closes stdin. Over HTTP the same server is `/mcp` on `flow serve` and `flow
//! daemon --serve`.

use std::io::Write;

use clap::{Args, Subcommand};

use super::daemon::{DaemonArgs, run_daemon};
use super::{Cli, Error};

/// Arguments of `flow mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: McpCommand,
}

/// The `flow mcp` subcommands.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve the workflows of `[mcp] workflows` and the tools of `[[mcp.servers]]` (the
    /// proxy) as MCP tools on stdin/stdout (stdout carries only MCP; messages go to
    /// stderr). `flow mcp proxy` is the same command.
    #[command(visible_alias = "proxy")]
    Serve(ServeArgs),
    /// List the pinned definitions of proxied tools, and those whose server lists
    /// another definition now (pending acceptance).
    Pins,
    /// Accept what a proxied server lists now for one of its tools as the tool's pin
    /// (recorded with who and why as an `mcp.tool_accepted` event).
    Accept(AcceptArgs),
}

/// Arguments of `flow mcp accept`.
#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// The server's name (`[[mcp.servers]] name`).
    pub server: String,
    /// The tool's name on that server.
    pub tool: String,
    /// The digest of the definition you reviewed (`flow mcp pins` shows it): refused
    /// if the server has listed another since.
    #[arg(long)]
    pub digest: String,
    /// Who accepts and why (required: it is the audit trail).
    #[command(flatten)]
    pub who: super::who::Who,
}

/// Arguments of `flow mcp serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The name calls are recorded under (`mcp:<name>` submits the runs; it never
    /// decides their approvals). Default: `$USER@host`.
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// The workers' settings, as `flow daemon` takes them.
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// `flow mcp …`.
pub(crate) async fn mcp(
    cli: &Cli,
    args: &McpArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    match &args.command {
        McpCommand::Pins => pins(cli, stdout).await,
        McpCommand::Accept(accept) => accept_pin(cli, accept, stdout).await,
        McpCommand::Serve(serve) => {
            let principal = match &serve.principal {
                Some(p) if !p.trim().is_empty() => p.trim().to_owned(),
                Some(_) => return Err(Error::invalid("--principal: must not be empty")),
                None => super::who::Who::default()
                    .name()
                    .map_err(|e| Error::invalid(format!("{e} (or pass --principal NAME)")))?,
            };
            run_daemon(cli, &serve.daemon, Some(principal), stderr).await
        }
    }
}

/// `flow mcp pins`: one line per pinned tool; a changed one shows what it would become.
async fn pins(cli: &Cli, stdout: &mut dyn Write) -> Result<u8, Error> {
    let ledger = super::open_ledger(cli).await?;
    let pins = ledger.list_tool_pins().await?;
    if pins.is_empty() {
        let _ = writeln!(stdout, "no proxied tool is pinned yet");
    }
    for p in &pins {
        let by = p.pinned_by.as_deref().unwrap_or("first seen");
        let _ = writeln!(
            stdout,
            "{}/{}  {}  pinned {} ({by})",
            p.server,
            p.tool,
            p.digest,
            p.pinned_at.to_rfc3339()
        );
        if p.changed() {
            let _ = writeln!(
                stdout,
                "  CHANGED on the server: now {}\n    pinned annotations: {}\n    listed annotations: {}\n    schema {}\n  accept with: flow mcp accept {} {} --digest {} --reason TEXT",
                p.seen_digest,
                p.definition["annotations"],
                p.seen_definition["annotations"],
                if p.definition["inputSchema"] == p.seen_definition["inputSchema"] {
                    "unchanged"
                } else {
                    "changed"
                },
                p.server,
                p.tool,
                p.seen_digest
            );
        }
    }
    Ok(super::exit::OK)
}

/// `flow mcp accept`.
async fn accept_pin(cli: &Cli, args: &AcceptArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let actor = args.who.actor()?;
    if actor.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(Error::invalid(
            "--reason TEXT is required: accepting a tool's new definition is audited",
        ));
    }
    let ledger = super::open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let pin = ledger
        .accept_tool(&args.server, &args.tool, &args.digest, &actor, now)
        .await?;
    let _ = writeln!(
        stdout,
        "{}/{}: pinned {} (by {}); proxies use it from their next start",
        pin.server, pin.tool, pin.digest, actor.by
    );
    Ok(super::exit::OK)
}

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
pub(crate) async fn mcp(cli: &Cli, args: &McpArgs, stderr: &mut dyn Write) -> Result<u8, Error> {
    match &args.command {
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

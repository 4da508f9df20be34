//! `flow-testkit`: flow's test servers as a program, for tests that run the `flow`
//! binary (and for the example workflows). See `flow_adapters::testkit` for the commands.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flow_adapters::testkit::{http::CountingServer, mcp};

#[derive(Parser)]
#[command(
    name = "flow-testkit",
    about = "Test servers for flow: a counting HTTP server and an MCP server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The counting HTTP server.
    Http {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// Append one fsynced JSON line per arrived and completed request.
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Print the base URL on stdout once listening.
        #[arg(long)]
        print_url: bool,
    },
    /// The MCP test server on stdin/stdout.
    McpStdio {
        /// Append one JSON line per initialize and tool call.
        #[arg(long)]
        count_file: Option<PathBuf>,
        /// Accept only this MCP protocol version (e.g. 2026-07-28).
        #[arg(long)]
        protocol: Option<String>,
        /// Declare `delete_thing` read-only and not destructive (a server whose hints
        /// changed since a proxy pinned them).
        #[arg(long)]
        benign: bool,
    },
    /// The MCP test server over streamable HTTP (`/mcp`, tokens at `/token`).
    McpHttp {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// Print the MCP URL on stdout once listening.
        #[arg(long)]
        print_url: bool,
        /// Append one JSON line per initialize and tool call.
        #[arg(long)]
        count_file: Option<PathBuf>,
        /// Turn the OAuth mode on: `tools/call` needs a token with this scope.
        #[arg(long)]
        auth_scope: Option<String>,
        /// Accepted client id (OAuth mode).
        #[arg(long, default_value = "flow")]
        client_id: String,
        /// Accepted client secret (OAuth mode).
        #[arg(long, default_value = "flow-secret")]
        client_secret: String,
        /// Status of the scope challenge: 401 or 403.
        #[arg(long, default_value_t = 401)]
        challenge_status: u16,
    },
}

fn print_line(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match cli.command {
        Command::Http {
            addr,
            log_file,
            print_url,
        } => {
            let server = CountingServer::start_on(addr, log_file.as_deref()).await?;
            if print_url {
                print_line(&server.url());
            }
            eprintln!("flow-testkit http listening on {}", server.url());
            std::future::pending::<()>().await;
        }
        Command::McpStdio {
            count_file,
            protocol,
            benign,
        } => {
            let protocol = protocol
                .map(|v| serde_json::from_value(serde_json::Value::String(v)))
                .transpose()?;
            mcp::serve_stdio(count_file, protocol, benign).await?
        }
        Command::McpHttp {
            addr,
            print_url,
            count_file,
            auth_scope,
            client_id,
            client_secret,
            challenge_status,
        } => {
            let auth = auth_scope.map(|required_scope| mcp::AuthOptions {
                client_id,
                client_secret,
                required_scope,
                challenge_status,
                grant_required_scope: true,
            });
            let server = mcp::HttpServer::start_on(addr, auth, count_file).await?;
            if print_url {
                print_line(&server.url());
            }
            eprintln!("flow-testkit mcp-http listening on {}", server.url());
            std::future::pending::<()>().await;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flow-testkit: {e}");
            ExitCode::FAILURE
        }
    }
}

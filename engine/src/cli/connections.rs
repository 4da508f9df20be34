//! `flow connect NAME` (a person signs in once) and `flow connections` (list, revoke,
//! keygen). No token is ever printed: the list says what is known of each connection
//! in the open (who connected it and when, scopes, expiry, refresh token present, last
//! refresh and error).

use std::io::Write;

use clap::{Args, Subcommand};
use flow_adapters::mcp::{OAuth, OAuthClient};
use flow_ledger::{Clock as _, Ledger};
use serde_json::json;

use super::table::{table, terminal_width};
use super::who::Who;
use super::{Cli, Error, exit, open_ledger};
use crate::config::Config;
use crate::connections::grant::{self, Options, SignInWith};
use crate::connections::seal::{self, Key, Keys};
use crate::secrets::Secrets;

/// Arguments of `flow connect`.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The connection (`[[connections]] name` in flow.toml).
    pub name: String,
    /// The command that opens the sign-in URL (given as its last argument), e.g.
    /// `firefox` or `open -a Safari`; default: the platform's opener when there is a
    /// display, else the URL is only printed.
    #[arg(long, value_name = "CMD")]
    pub browser: Option<String>,
    /// How long to wait for the browser to come back.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub timeout: String,
    /// Who signs in (recorded).
    #[command(flatten)]
    pub who: Who,
}

/// Arguments of `flow connections`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ConnectionsArgs {
    /// What to do (without one: list the connections).
    #[command(subcommand)]
    pub command: Option<ConnectionsCommand>,
    /// Print a JSON array of `{name, status, server, connected_by, connected_at,
    /// scopes, access_expires_at, has_refresh_token, last_refresh_at, last_error, …}`.
    #[arg(long)]
    pub json: bool,
}

/// `flow connections` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConnectionsCommand {
    /// Revoke the connection's tokens at the server (RFC 7009, when offered) and delete it.
    Revoke(RevokeArgs),
    /// Print a new random connections key (32 bytes, base64) for FLOW_SECRET_CONNECTIONS_KEY.
    Keygen,
    /// Reseal every connection sealed under FLOW_SECRET_CONNECTIONS_KEY_OLD with
    /// FLOW_SECRET_CONNECTIONS_KEY (give daemons both keys first; drop the old after).
    Rekey,
}

/// Arguments of `flow connections revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The connection.
    pub name: String,
}

fn grant_error(e: grant::Error) -> Error {
    match e {
        grant::Error::Refused(m) => Error::invalid(m),
        grant::Error::Setup(m) | grant::Error::Server(m) | grant::Error::Ledger(m) => {
            Error::unavailable(m)
        }
    }
}

/// `flow connect NAME`.
pub(crate) async fn connect(
    cli: &Cli,
    args: &ConnectArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let config = Config::load(cli.config.as_deref())?;
    let Some(entry) = config.connections.iter().find(|c| c.name == args.name) else {
        let known: Vec<&str> = config.connections.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::invalid(format!(
            "no connection `{}` in {} (declared: {})",
            args.name,
            config
                .path
                .as_ref()
                .map_or_else(|| "flow.toml".to_string(), |p| p.display().to_string()),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let timeout = humantime::parse_duration(&args.timeout)
        .map_err(|e| Error::invalid(format!("--timeout {}: {e}", args.timeout)))?;
    let by = args.who.name()?;
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    // Refuse before anything is asked of a server or a person.
    Key::from_secrets(&secrets).map_err(|e| Error::unavailable(e.to_string()))?;
    let ledger = open_ledger(cli).await?;
    let oauth =
        OAuth::new(config.egress.allow_list()).map_err(|e| Error::unavailable(e.message))?;
    let options = Options {
        browser: args.browser.clone(),
        timeout,
        by,
    };
    let with = SignInWith {
        config: entry,
        secrets: &secrets,
        oauth: &oauth,
    };
    let done = if entry.cross_app.is_some() {
        crate::connections::cross_app::connect(&ledger, with, &options.by).await
    } else {
        grant::connect(&ledger, with, &options, stdout).await
    }
    .map_err(grant_error)?;
    let _ = writeln!(
        stdout,
        "connected `{}`: scopes {}, access token {}, refresh token {}",
        done.name,
        done.scopes.as_deref().unwrap_or("(none said)"),
        done.expires_in.map_or_else(
            || "without expiry".to_string(),
            |s| format!("expires in {s}s")
        ),
        if done.has_refresh {
            "stored"
        } else {
            "not issued"
        }
    );
    Ok(exit::OK)
}

/// `flow connections …`.
pub(crate) async fn connections(
    cli: &Cli,
    args: &ConnectionsArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    match &args.command {
        Some(ConnectionsCommand::Keygen) => {
            let _ = writeln!(stdout, "{}", seal::generate());
            Ok(exit::OK)
        }
        Some(ConnectionsCommand::Revoke(r)) => revoke(cli, r, stdout).await,
        Some(ConnectionsCommand::Rekey) => rekey(cli, stdout).await,
        None => {
            let ledger = open_ledger(cli).await?;
            list(&ledger, args.json, stdout).await
        }
    }
}

async fn list(ledger: &Ledger, json: bool, stdout: &mut dyn Write) -> Result<u8, Error> {
    let all = ledger.list_connections().await?;
    if json {
        let out = crate::connections::view::views(&all, &[]);
        let _ = writeln!(stdout, "{}", json!(out));
        return Ok(exit::OK);
    }
    if all.is_empty() {
        let _ = writeln!(stdout, "no connections (sign in with `flow connect NAME`)");
        return Ok(exit::OK);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.status.as_str().to_string(),
                format!("{} {}", c.connected_by, c.connected_at.to_rfc3339()),
                c.sealed.scopes_granted.clone().unwrap_or_default(),
                c.sealed
                    .access_expires_at
                    .map_or_else(|| "-".into(), |t| t.to_rfc3339()),
                if c.sealed.has_refresh { "yes" } else { "no" }.to_string(),
                c.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let head = [
        "NAME",
        "STATUS",
        "CONNECTED",
        "SCOPES",
        "EXPIRES",
        "REFRESH",
        "LAST ERROR",
    ];
    let _ = write!(stdout, "{}", table(&head, &rows, terminal_width()));
    Ok(exit::OK)
}

/// Revokes at the server what can be revoked (the refresh token, else the access
/// token), then deletes the connection. A server without a revocation endpoint, or one
/// that cannot be reached, is reported; the connection is deleted anyway (its tokens
/// are gone from flow), and the exit code says whether the server was told.
async fn revoke(cli: &Cli, args: &RevokeArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    let config = Config::load(cli.config.as_deref())?;
    let Some(c) = ledger.connection(&args.name).await? else {
        return Err(Error::invalid(format!(
            "no connection `{}` is stored",
            args.name
        )));
    };
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    let told = match (
        &c.endpoints.revocation_endpoint,
        Key::from_secrets(&secrets),
    ) {
        (None, _) => Err("the authorization server offers no revocation endpoint".to_string()),
        (Some(_), Err(e)) => Err(e.to_string()),
        (Some(endpoint), Ok(key)) => {
            let s = ledger.scope();
            match key.open((&s.tenant, &s.workspace), &c.name, (&c.sealed).into()) {
                Err(e) => Err(e.to_string()),
                Ok(tokens) => {
                    let oauth = OAuth::new(config.egress.allow_list())
                        .map_err(|e| Error::unavailable(e.message))?;
                    let client = OAuthClient {
                        client_id: c.endpoints.client_id.clone(),
                        secret: tokens.client_secret.clone(),
                        method: c.endpoints.auth_method.clone(),
                    };
                    let (token, hint) = match &tokens.refresh_token {
                        Some(r) => (r.as_str(), "refresh_token"),
                        None => (tokens.access_token.as_str(), "access_token"),
                    };
                    oauth
                        .revoke(endpoint, &client, token, hint)
                        .await
                        .map_err(|e| e.message)
                }
            }
        }
    };
    ledger.delete_connection(&c.name).await?;
    match told {
        Ok(()) => {
            let _ = writeln!(
                stdout,
                "connection `{}` revoked at the server and deleted",
                c.name
            );
            Ok(exit::OK)
        }
        Err(why) => Err(Error::unavailable(format!(
            "connection `{}` deleted, but not revoked at the server: {why}",
            c.name
        ))),
    }
}

/// Reseals the rows under the old key with the current one, each only as read (its
/// generation unchanged, no refresh under way); a row that moved meanwhile is left for
/// another run. Exit 0 when no row is left under the old key, 5 otherwise.
async fn rekey(cli: &Cli, stdout: &mut dyn Write) -> Result<u8, Error> {
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    let keys = Keys::from_secrets(&secrets).map_err(|e| Error::unavailable(e.to_string()))?;
    let ledger = open_ledger(cli).await?;
    let all = ledger.list_connections().await?;
    let s = ledger.scope();
    let scope = (s.tenant.as_str(), s.workspace.as_str());
    let (mut resealed, mut left) = (0, Vec::new());
    for c in &all {
        if c.sealed.key_id == keys.current.id() {
            continue;
        }
        let Some(old) = keys.old.as_ref().filter(|k| k.id() == c.sealed.key_id) else {
            left.push(format!(
                "`{}` is sealed under key {}, which is not configured",
                c.name, c.sealed.key_id
            ));
            continue;
        };
        let tokens = old
            .open(scope, &c.name, (&c.sealed).into())
            .map_err(|e| Error::unavailable(e.to_string()))?;
        let sealed = keys.current.seal(scope, &c.name, &tokens);
        let now = flow_ledger::SystemClock.now();
        let done = ledger
            .reseal_connection(&c.name, c.generation, &sealed, keys.current.id(), now)
            .await?;
        if done {
            resealed += 1;
        } else {
            left.push(format!(
                "`{}` changed meanwhile (a refresh or a sign-in); run rekey again",
                c.name
            ));
        }
    }
    let _ = writeln!(
        stdout,
        "resealed {resealed} connection(s) under key {}",
        keys.current.id()
    );
    if left.is_empty() {
        return Ok(exit::OK);
    }
    Err(Error::unavailable(left.join("; ")))
}

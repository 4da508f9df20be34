//! The operator API on a [`Runtime`]: its tokens from `flow.toml` and the secrets, and
//! the server (`flow serve`, `flow daemon --serve`).
//!
//! Refuses to start without `[[api.tokens]]` unless insecure mode was asked for, and
//! then only on a loopback address: an unauthenticated API that can resolve calls must
//! not be reachable from another machine.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Runtime;
use crate::config::Api;
use crate::daemon::metrics::Metrics;
use crate::secrets::Secrets;
use crate::serve::auth::{Token, Tokens};
use crate::serve::{App, serve};

/// Why the API's authentication could not be set up: `Invalid` is the caller's input
/// (a flag, an address), `Installation` the installation's (config, secrets).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag or address.
    #[error("{0}")]
    Invalid(String),
    /// A bad `flow.toml` or a missing secret.
    #[error("{0}")]
    Installation(String),
}

/// How the API authenticates: the tokens and the one `/metrics` needs, if any.
#[derive(Debug)]
pub struct ApiAuth {
    tokens: Tokens,
    metrics_token: Option<String>,
}

impl ApiAuth {
    /// Without authentication (every caller is admin `anonymous`).
    pub fn is_insecure(&self) -> bool {
        matches!(self.tokens, Tokens::Insecure)
    }

    /// How many tokens are declared.
    pub fn token_count(&self) -> usize {
        match &self.tokens {
            Tokens::Insecure => 0,
            Tokens::Required(t) => t.len(),
        }
    }

    /// The tokens of `[api]`, their values read from `secrets`, for a server on
    /// `addr`. Refused: insecure mode off loopback or beside declared tokens (invalid);
    /// no tokens without insecure mode, a token whose secret is missing, two tokens with
    /// one name or one value, a `metrics_token` naming no token (installation).
    pub fn from_config(
        api: &Api,
        secrets: &Secrets,
        addr: SocketAddr,
        insecure: bool,
    ) -> Result<ApiAuth, Error> {
        let declared = &api.tokens;
        let metrics_token = api.metrics_token.clone();
        if let Some(name) = &metrics_token
            && !declared.iter().any(|t| &t.name == name)
        {
            return Err(Error::Installation(format!(
                "[api] metrics_token = \"{}\" names no [[api.tokens]] entry: use one of their names",
                name.escape_debug()
            )));
        }
        if declared.is_empty() {
            if !insecure {
                return Err(Error::Installation(
                    "no [[api.tokens]] in flow.toml: declare at least one (name, role, secret), or pass --insecure-no-auth to serve without authentication on loopback".into(),
                ));
            }
            if !addr.ip().is_loopback() {
                return Err(Error::Invalid(format!(
                    "--insecure-no-auth serves only on a loopback address (127.0.0.1, ::1), not {addr}: anyone who reaches it could resolve calls"
                )));
            }
            return Ok(ApiAuth {
                tokens: Tokens::Insecure,
                metrics_token: None,
            });
        }
        if insecure {
            return Err(Error::Invalid(
                "--insecure-no-auth with [[api.tokens]] declared: drop the flag (the tokens are used) or the tokens".into(),
            ));
        }
        let mut tokens: Vec<(Token, &str)> = Vec::with_capacity(declared.len());
        for t in declared {
            let Some(value) = secrets.get(&t.secret).filter(|v| !v.is_empty()) else {
                return Err(Error::Installation(format!(
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
}

/// Refuses a token whose name is not a plain name, or whose name or value an earlier
/// entry already has: with one value, whichever entry came last would silently decide
/// the role; with one name, the audit trail could not tell two tokens apart.
fn check_distinct(token: &Token, secret: &str, before: &[(Token, &str)]) -> Result<(), Error> {
    let name = &token.name;
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(Error::Installation(format!(
            "API token name \"{}\" must be 1 to 128 characters without control characters (it is recorded as `by` in the ledger)",
            name.escape_debug()
        )));
    }
    for (other, other_secret) in before {
        if &other.name == name {
            return Err(Error::Installation(format!(
                "two [[api.tokens]] entries are named `{name}`: give each token its own name (it is recorded as `by` on everything it does)"
            )));
        }
        if other.same_value(token) {
            return Err(Error::Installation(format!(
                "[[api.tokens]] `{}` (secret `{other_secret}`) and `{name}` (secret `{secret}`) have the same value: a request could not tell them apart and the later entry would decide the role; give each token its own value",
                other.name
            )));
        }
    }
    Ok(())
}

/// What a server shows beside the ledger: its metrics, the schedules and connections
/// of the `flow.toml` it read, and the MCP tools that file names.
#[derive(Debug)]
pub struct Served {
    /// What `/metrics` reports (a daemon passes its own).
    pub metrics: Arc<Metrics>,
    /// `/api/v1/schedules` and the console's Schedules page.
    pub schedules: crate::schedule::manage::Schedules,
    /// The sign-ins the console and the API can begin.
    pub connections: Vec<crate::connections::ConnectionConfig>,
    /// `/mcp`, when `[mcp]` names workflows.
    pub mcp: Option<Arc<crate::mcp::Front>>,
}

impl Runtime {
    /// The MCP front `[mcp]` describes (`None`: it names no workflow), its patterns
    /// relative to the directory of `config_path`.
    pub async fn mcp_front(
        &self,
        mcp: &crate::config::Mcp,
        config_path: Option<&std::path::Path>,
    ) -> Result<Option<Arc<crate::mcp::Front>>, crate::mcp::Error> {
        let base = config_path
            .and_then(std::path::Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| std::path::Path::new("."));
        crate::mcp::Front::open(
            mcp,
            crate::mcp::Opening {
                ledger: self.ledger.clone(),
                clock: self.gateway.clock(),
                gateway: &self.gateway,
                base,
                public_url: self.gateway.public_url().map(str::to_owned),
            },
        )
        .await
    }

    /// Serves the API and the console on `addr` until `stop` fires (then finishes the
    /// requests in flight): the bound address and the server's task.
    pub async fn serve_api(
        &self,
        auth: ApiAuth,
        served: Served,
        addr: SocketAddr,
        stop: CancellationToken,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let app = App {
            schedules: Arc::new(served.schedules),
            connections: served.connections,
            ledger: self.ledger.clone(),
            tokens: auth.tokens,
            metrics: served.metrics,
            gateway: self.gateway.clone(),
            metrics_token: auth.metrics_token,
            throttle: crate::serve::throttle::Throttle::default(),
            mcp: served
                .mcp
                .map(|front| crate::mcp::server::Handler::http(front, stop.clone())),
        };
        serve(addr, Arc::new(app), stop).await
    }
}

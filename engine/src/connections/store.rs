//! Lends connections' access tokens to the MCP pool and refreshes them, once for every
//! worker at a time.
//!
//! A token is used while it is more than [`SKEW`] from expiry. Past that (or refused
//! with a 401), one task per process asks, and across processes the ledger's lease on
//! the generation read decides who refreshes: the holder posts the refresh token,
//! writes the new tokens (rotated refresh token included) as the next generation, and
//! only then uses them; the others poll until the generation moves and read it. A
//! refresh token the server refuses (`invalid_grant`) marks the connection
//! `needs_reconnect` for all; every error here means the call was not sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flow_adapters::Error;
use flow_adapters::mcp::{ConnectionTokens, OAuth, OAuthClient, TokenFailure};
use flow_ledger::{Clock, Connection, ConnectionStatus, Ledger, RefreshFailure, Sealed, Timestamp};
use futures::future::BoxFuture;

use super::seal::{Key, Tokens};

/// Tokens are refreshed this long before they expire, so none expires in flight.
pub const SKEW: Duration = Duration::from_secs(30);

/// How long a refresh lease lasts: past the token request's own 30 s timeout, so a
/// live holder always finishes inside it.
pub const LEASE: Duration = Duration::from_secs(60);

/// How often a worker that lost the race looks for the new generation.
const POLL: Duration = Duration::from_millis(50);

/// An access token as last read or refreshed here.
struct Cached {
    access: String,
    expires_at: Option<Timestamp>,
}

/// The ledger-backed [`ConnectionTokens`] of one process.
pub struct Store {
    ledger: Ledger,
    key: Result<Arc<Key>, String>,
    oauth: OAuth,
    clock: Arc<dyn Clock>,
    holder: String,
    cache: Mutex<HashMap<String, Cached>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A call that cannot leave because of its connection.
fn not_sent(name: &str, why: impl std::fmt::Display) -> Error {
    Error::not_sent(format!("connection `{name}`: {why}"))
}

/// Whether a token expiring at `at` is still good at `now`.
fn fresh(at: Option<Timestamp>, now: Timestamp) -> bool {
    at.is_none_or(|at| now.plus(SKEW) < at)
}

impl Store {
    /// A store over `ledger` sealing with `key` (its error, when no key is configured,
    /// is what a call that needs a connection fails with).
    pub fn new(
        ledger: Ledger,
        key: Result<Key, super::seal::SealError>,
        oauth: OAuth,
        clock: Arc<dyn Clock>,
    ) -> Store {
        Store {
            ledger,
            key: key.map(Arc::new).map_err(|e| e.to_string()),
            oauth,
            clock,
            holder: format!("{}:{}", std::process::id(), ulid::Ulid::generate()),
            cache: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn lock_for(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    fn cached(&self, name: &str, refused: Option<&str>, now: Timestamp) -> Option<String> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let c = cache.get(name)?;
        (fresh(c.expires_at, now) && Some(c.access.as_str()) != refused).then(|| c.access.clone())
    }

    fn remember(&self, name: &str, access: &str, expires_at: Option<Timestamp>) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(
            name.to_owned(),
            Cached {
                access: access.to_owned(),
                expires_at,
            },
        );
    }

    fn open(&self, row: &Connection) -> Result<Tokens, Error> {
        let key = self.key.as_ref().map_err(|e| not_sent(&row.name, e))?;
        let s = self.ledger.scope();
        key.open(
            (&s.tenant, &s.workspace),
            &row.name,
            (&row.sealed.sealed, &row.sealed.key_id),
        )
        .map_err(|e| Error::not_sent(e.to_string()))
    }

    async fn read(&self, name: &str) -> Result<Connection, Error> {
        let row = self
            .ledger
            .connection(name)
            .await
            .map_err(|e| not_sent(name, format!("cannot read the ledger: {e}")))?
            .ok_or_else(|| {
                not_sent(
                    name,
                    format!("no one has signed in: run `flow connect {name}`"),
                )
            })?;
        if row.status == ConnectionStatus::NeedsReconnect {
            let why = row
                .last_error
                .as_deref()
                .unwrap_or("its refresh token was refused");
            return Err(not_sent(
                name,
                format!("needs a new sign-in ({why}): run `flow connect {name}`"),
            ));
        }
        Ok(row)
    }

    /// A usable token of `name`: the row's, or a refreshed one.
    async fn token(&self, name: &str, refused: Option<&str>) -> Result<String, Error> {
        let _one = self.lock_for(name);
        let _one = _one.lock().await;
        if let Some(token) = self.cached(name, refused, self.clock.now()) {
            return Ok(token);
        }
        let waited_since = std::time::Instant::now();
        let mut waited = false;
        loop {
            let row = self.read(name).await?;
            // The refresh we waited for failed: say so rather than post again (each
            // waiter trying in turn would send one request per waiter).
            if waited
                && row.lease.is_none()
                && let Some(error) = &row.last_error
            {
                return Err(not_sent(name, format!("refresh failed: {error}")));
            }
            let tokens = self.open(&row)?;
            let now = self.clock.now();
            if fresh(row.sealed.access_expires_at, now)
                && Some(tokens.access_token.as_str()) != refused
            {
                self.remember(name, &tokens.access_token, row.sealed.access_expires_at);
                return Ok(tokens.access_token);
            }
            if !row.sealed.has_refresh {
                return Err(not_sent(
                    name,
                    format!(
                        "its access token expired and the server issued no refresh token: run `flow connect {name}`"
                    ),
                ));
            }
            let leased = self
                .ledger
                .lease_connection_refresh(
                    name,
                    (row.generation, &self.holder),
                    now.plus(LEASE),
                    now,
                )
                .await
                .map_err(|e| not_sent(name, format!("cannot lease the refresh: {e}")))?;
            match leased {
                Some(row) => return self.refresh(row).await,
                None if waited_since.elapsed() > LEASE + SKEW => {
                    return Err(not_sent(
                        name,
                        "another worker's refresh did not finish in time; try again",
                    ));
                }
                // Someone else refreshes: wait for the generation to move.
                None => {
                    waited = true;
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    /// Refreshes `row`, whose lease this process holds.
    async fn refresh(&self, row: Connection) -> Result<String, Error> {
        let name = row.name.clone();
        let old = self.open(&row)?;
        let refresh_token = old.refresh_token.clone().unwrap_or_default();
        let e = &row.endpoints;
        let client = OAuthClient {
            client_id: e.client_id.clone(),
            secret: old.client_secret.clone(),
            method: e.auth_method.clone(),
        };
        let asked = self
            .oauth
            .refresh(
                &e.token_endpoint,
                &client,
                &refresh_token,
                (&e.resource, None),
            )
            .await;
        let now = self.clock.now();
        let granted = match asked {
            Ok(granted) => granted,
            Err(failure) => {
                let (kind, message) = match &failure {
                    TokenFailure::InvalidGrant(m) => (RefreshFailure::NeedsReconnect, m.clone()),
                    TokenFailure::Other(e) => (RefreshFailure::Transient, e.message.clone()),
                };
                let _ = self
                    .ledger
                    .fail_connection_refresh(&name, &self.holder, (kind, &message), now)
                    .await;
                return Err(match kind {
                    RefreshFailure::NeedsReconnect => not_sent(
                        &name,
                        format!(
                            "the refresh token was refused ({message}): run `flow connect {name}`"
                        ),
                    ),
                    RefreshFailure::Transient => {
                        not_sent(&name, format!("refresh failed: {message}"))
                    }
                });
            }
        };
        let tokens = Tokens {
            access_token: granted.access_token,
            // OAuth 2.1 rotation: a new refresh token replaces the old; none keeps it.
            refresh_token: granted.refresh_token.or(old.refresh_token),
            client_secret: old.client_secret,
        };
        let expires_at = granted.expires_in.map(|s| now.plus(Duration::from_secs(s)));
        let key = self.key.as_ref().map_err(|e| not_sent(&name, e))?;
        let s = self.ledger.scope();
        let sealed = Sealed {
            sealed: key.seal((&s.tenant, &s.workspace), &name, &tokens),
            key_id: key.id().to_owned(),
            scopes_granted: granted.scope.or(row.sealed.scopes_granted.clone()),
            access_expires_at: expires_at,
            has_refresh: tokens.refresh_token.is_some(),
        };
        let stored = self
            .ledger
            .finish_connection_refresh(&name, &self.holder, sealed, now)
            .await
            .map_err(|e| not_sent(&name, format!("cannot store the refreshed tokens: {e}")))?;
        if !stored {
            return Err(not_sent(
                &name,
                "the refresh lease was lost before the new tokens were stored; try again",
            ));
        }
        tracing::info!(target: "flow::connections", connection = %name, "refreshed");
        self.remember(&name, &tokens.access_token, expires_at);
        Ok(tokens.access_token)
    }
}

/// Lends the connections of `ledger` to `pool` (sealed under the key in `secrets`;
/// token endpoints reached within `egress`).
pub fn install(
    pool: &flow_adapters::mcp::Pool,
    (ledger, clock, secrets): (&Ledger, &Arc<dyn Clock>, &crate::secrets::Secrets),
    egress: &crate::config::Egress,
) {
    match OAuth::new(egress.allow_list()) {
        Ok(oauth) => {
            let key = Key::from_secrets(secrets);
            let store = Store::new(ledger.clone(), key, oauth, clock.clone());
            pool.use_connections(Arc::new(store));
        }
        Err(e) => {
            tracing::warn!(target: "flow::connections", "connections are unavailable: {}", e.message)
        }
    }
}

impl ConnectionTokens for Store {
    fn access_token<'a>(
        &'a self,
        name: &'a str,
        refused: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, Error>> {
        Box::pin(self.token(name, refused))
    }

    fn wants_scope<'a>(&'a self, name: &'a str, scope: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.ledger.want_connection_scope(name, scope).await {
                tracing::warn!(target: "flow::connections", connection = %name, "cannot record the wanted scope: {e}");
            }
        })
    }
}

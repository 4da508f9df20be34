//! Lends connections' access tokens to the MCP pool and refreshes them, once for every
//! worker at a time.
//!
//! A token is used while it is more than [`SKEW`] from expiry. Past that (or refused
//! with a 401), one task per process asks, and across processes the ledger's lease on
//! the generation read decides who refreshes: the holder posts the refresh token,
//! writes the new tokens (rotated refresh token included) as the next generation, and
//! only then uses them; the others poll until the generation moves and read it. A
//! refresh the server refuses (`invalid_grant`, any 4xx) marks the connection
//! `needs_reconnect` for all; one that fails otherwise is not tried again for
//! [`RETRY_AFTER`]. Every error here means the call was not sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flow_adapters::mcp::{ConnectionTokens, OAuth, OAuthClient, TokenFailure};
use flow_adapters::{Error, FailureKind};
use flow_ledger::{Clock, Connection, ConnectionStatus, Ledger, RefreshFailure, Sealed, Timestamp};
use futures::future::BoxFuture;

use super::seal::{Keys, Tokens};

/// Tokens are refreshed this long before they expire (at most half their lifetime), so
/// none expires in flight.
pub const SKEW: Duration = Duration::from_secs(30);

/// How long a refresh lease lasts: past the token request's own 30 s timeout, so a
/// live holder always finishes inside it.
pub const LEASE: Duration = Duration::from_secs(60);

/// After a failed refresh no worker asks again for this long: the failure is the
/// answer (the budget of the refresh loop, counted in the ledger by `failed_at`).
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often a worker that lost the race looks for the new generation.
const POLL: Duration = Duration::from_millis(100);

/// What a refresh needs, shared with the task that does it (a caller that gives up
/// does not cancel a refresh under way).
struct Shared {
    ledger: Ledger,
    key: Result<Arc<Keys>, String>,
    oauth: OAuth,
    clock: Arc<dyn Clock>,
    holder: String,
}

/// The ledger-backed [`ConnectionTokens`] of one process. Every call reads its
/// connection's row (one indexed read; a new sign-in is seen at once).
pub struct Store {
    shared: Arc<Shared>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A call that cannot leave because of its connection.
fn not_sent(name: &str, why: impl std::fmt::Display) -> Error {
    Error::not_sent(format!("connection `{name}`: {why}"))
}

/// Whether `row`'s access token is still good at `now`: more than [`SKEW`] (at most
/// half its lifetime) from expiry.
fn fresh(row: &Connection, now: Timestamp) -> bool {
    let Some(at) = row.sealed.access_expires_at else {
        return true;
    };
    let issued = row.last_refresh_at.unwrap_or(row.connected_at);
    let lifetime = Duration::from_millis(u64::try_from(at.0 - issued.0).unwrap_or(0));
    now.plus(SKEW.min(lifetime / 2)) < at
}

/// `text` without any of `secrets` (a server may echo what it was sent).
fn scrubbed(text: &str, secrets: &[Option<&str>]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().flatten().filter(|s| s.len() >= 4) {
        out = out.replace(secret, "…");
    }
    out
}

impl Store {
    /// A store over `ledger` sealing with `key` (its error, when no key is configured,
    /// is what a call that needs a connection fails with).
    pub fn new(
        ledger: Ledger,
        key: Result<Keys, super::seal::Error>,
        oauth: OAuth,
        clock: Arc<dyn Clock>,
    ) -> Store {
        Store {
            shared: Arc::new(Shared {
                ledger,
                key: key.map(Arc::new).map_err(|e| e.to_string()),
                oauth,
                clock,
                holder: format!("{}:{}", std::process::id(), ulid::Ulid::generate()),
            }),
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

    /// A usable token of `name` by `deadline`: the row's, or a refreshed one.
    async fn token(
        &self,
        name: &str,
        refused: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Result<String, Error> {
        match tokio::time::timeout_at(deadline, self.token_in_time(name, refused)).await {
            Ok(answer) => answer,
            Err(_) => Err(not_sent(
                name,
                "the call's time ran out waiting for its token (a refresh under way still completes)",
            )),
        }
    }

    async fn token_in_time(&self, name: &str, refused: Option<&str>) -> Result<String, Error> {
        let one = self.lock_for(name);
        let _one = one.lock().await;
        let shared = &self.shared;
        loop {
            let row = shared.read(name).await?;
            let tokens = shared.open(&row)?;
            let now = shared.clock.now();
            if fresh(&row, now) && Some(tokens.access_token.as_str()) != refused {
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
            let busy = row.lease.as_ref().is_some_and(|(_, until)| *until > now);
            if let (false, Some(error), Some(at)) = (busy, &row.last_error, row.failed_at)
                && now < at.plus(RETRY_AFTER)
            {
                return Err(not_sent(
                    name,
                    format!(
                        "its refresh failed at {} ({error}); the next try is after {}s",
                        at.to_rfc3339(),
                        RETRY_AFTER.as_secs()
                    ),
                ));
            }
            if busy {
                // Someone else refreshes: wait for the generation to move (the call's
                // deadline bounds the wait).
                tokio::time::sleep(POLL).await;
                continue;
            }
            let leased = shared
                .ledger
                .lease_connection_refresh(
                    name,
                    row.generation,
                    &shared.holder,
                    now.plus(LEASE),
                    now,
                )
                .await
                .map_err(|e| not_sent(name, format!("cannot lease the refresh: {e}")))?;
            let Some(row) = leased else {
                tokio::time::sleep(POLL).await;
                continue;
            };
            // The refresh runs on its own: a caller that gives up (its deadline, a
            // cancelled run) does not lose a rotated refresh token half-way, and the
            // process waits for it before it exits ([`drain`]).
            let (done, answer) = tokio::sync::oneshot::channel();
            let task = tokio::spawn({
                let shared = shared.clone();
                async move {
                    let _ = done.send(shared.refresh(row).await);
                }
            });
            in_flight().push(task);
            return answer
                .await
                .map_err(|e| not_sent(name, format!("the refresh task failed: {e}")))?;
        }
    }
}

/// Refreshes started by this process and maybe not finished.
fn in_flight() -> std::sync::MutexGuard<'static, Vec<tokio::task::JoinHandle<()>>> {
    static TASKS: Mutex<Vec<tokio::task::JoinHandle<()>>> = Mutex::new(Vec::new());
    let mut tasks = TASKS.lock().unwrap_or_else(|e| e.into_inner());
    tasks.retain(|t| !t.is_finished());
    tasks
}

/// Waits (at most [`LEASE`]) for the refreshes this process started: a command that
/// ends while one is under way would otherwise lose the rotated refresh token the
/// server already issued. Every command calls it before it exits.
pub async fn drain() {
    let tasks: Vec<_> = std::mem::take(&mut *in_flight());
    if tasks.is_empty() {
        return;
    }
    let all = futures::future::join_all(tasks);
    if tokio::time::timeout(LEASE, all).await.is_err() {
        tracing::warn!(target: "flow::connections", "a connection refresh did not finish before exit");
    }
}

impl Shared {
    fn open(&self, row: &Connection) -> Result<Tokens, Error> {
        let key = self.key.as_ref().map_err(|e| not_sent(&row.name, e))?;
        let s = self.ledger.scope();
        key.open((&s.tenant, &s.workspace), &row.name, (&row.sealed).into())
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
                &e.resource,
                None,
            )
            .await;
        let now = self.clock.now();
        let granted = match asked {
            Ok(granted) => granted,
            Err(failure) => {
                let secrets = [Some(refresh_token.as_str()), old.client_secret.as_deref()];
                return Err(self.failed(&name, &failure, &secrets, now).await);
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
            sealed: key.current.seal((&s.tenant, &s.workspace), &name, &tokens),
            key_id: key.current.id().to_owned(),
            scopes_granted: granted.scope.or(row.sealed.scopes_granted.clone()),
            access_expires_at: expires_at,
            has_refresh: tokens.refresh_token.is_some(),
        };
        // The new refresh token exists only here until this write lands: a ledger
        // hiccup is tried again (within the lease) rather than losing it.
        let mut tries = 0;
        let stored = loop {
            match self
                .ledger
                .finish_connection_refresh(&name, &self.holder, sealed.clone(), now)
                .await
            {
                Ok(stored) => break stored,
                Err(e) if tries < 5 => {
                    tries += 1;
                    tracing::warn!(target: "flow::connections", connection = %name, "storing the refreshed tokens failed, trying again: {e}");
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
                Err(e) => {
                    return Err(not_sent(
                        &name,
                        format!("cannot store the refreshed tokens: {e}"),
                    ));
                }
            }
        };
        if !stored {
            return Err(not_sent(
                &name,
                "the refresh lease was lost before the new tokens were stored; try again",
            ));
        }
        tracing::info!(target: "flow::connections", connection = %name, "refreshed");
        Ok(tokens.access_token)
    }

    /// Records a failed refresh and says why the call is not sent. A refusal (4xx) or
    /// an answer that is not a token response needs a person; the rest waits
    /// [`RETRY_AFTER`]. The message is scrubbed of what was sent.
    async fn failed(
        &self,
        name: &str,
        failure: &TokenFailure,
        secrets: &[Option<&str>],
        now: Timestamp,
    ) -> Error {
        let (kind, message) = match failure {
            TokenFailure::Refused(m) => (RefreshFailure::NeedsReconnect, m.clone()),
            TokenFailure::Other(e) if e.kind == FailureKind::Permanent => {
                (RefreshFailure::NeedsReconnect, e.message.clone())
            }
            TokenFailure::Other(e) => (RefreshFailure::Transient, e.message.clone()),
        };
        let message = scrubbed(&message, secrets);
        let _ = self
            .ledger
            .fail_connection_refresh(name, &self.holder, kind, &message, now)
            .await;
        match kind {
            RefreshFailure::NeedsReconnect => not_sent(
                name,
                format!("the refresh was refused ({message}): run `flow connect {name}`"),
            ),
            RefreshFailure::Transient => not_sent(name, format!("refresh failed: {message}")),
        }
    }
}

/// Lends the connections of `ledger` to `pool` (sealed under the key in `secrets`;
/// token endpoints reached within `egress`).
pub fn install(
    pool: &flow_adapters::mcp::Pool,
    ledger: &Ledger,
    clock: &Arc<dyn Clock>,
    secrets: &crate::secrets::Secrets,
    egress: &crate::gateway::egress::Egress,
) {
    match OAuth::new(egress.allow_list()) {
        Ok(oauth) => {
            let key = Keys::from_secrets(secrets);
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
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Result<String, Error>> {
        Box::pin(self.token(name, refused, deadline))
    }

    fn wants_scope<'a>(&'a self, name: &'a str, scope: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.shared.ledger.want_connection_scope(name, scope).await {
                tracing::warn!(target: "flow::connections", connection = %name, "cannot record the wanted scope: {e}");
            }
        })
    }

    fn warm(&self) {
        if let Err(e) = self.shared.oauth.warm() {
            tracing::warn!(target: "flow::connections", "{}", e.message);
        }
    }
}

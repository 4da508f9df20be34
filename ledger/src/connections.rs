//! Connections (migration 0017): OAuth sign-ins made once by a person (`flow connect`)
//! whose tokens every worker uses and refreshes.
//!
//! The ledger never sees a token: `sealed` is ciphertext the engine made under a key the
//! ledger does not have. What the ledger promises is the order of writes: a refresh is
//! leased on the generation it read ([`Ledger::lease_connection_refresh`]), only the
//! holder may write the next generation ([`Ledger::finish_connection_refresh`]), so one
//! refresh happens at a time across processes and hosts, and a rotated refresh token is
//! durable before anyone uses the access token it came with.

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, emit_unscoped};
use crate::ledger::Ledger;
use crate::model::Scope;

/// Whether a connection's tokens can be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionStatus {
    /// Signed in; tokens usable (or refreshable).
    Connected,
    /// The authorization server refused the refresh token (`invalid_grant`): a person
    /// must run `flow connect NAME` again. Calls that need it fail as not sent.
    NeedsReconnect,
}

impl ConnectionStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::NeedsReconnect => "needs_reconnect",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "connected" => Ok(Self::Connected),
            "needs_reconnect" => Ok(Self::NeedsReconnect),
            other => Err(Error::Corrupt {
                what: format!("connection status `{other}`"),
            }),
        }
    }
}

/// Where a connection's tokens come from and how the client authenticates there: what a
/// worker needs to refresh without `flow.toml`'s entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// The MCP server signed in to.
    pub server: String,
    /// The RFC 8707 resource the tokens are for.
    pub resource: String,
    /// The authorization server's issuer, when known.
    pub issuer: Option<String>,
    /// Its token endpoint.
    pub token_endpoint: String,
    /// Its RFC 7009 revocation endpoint, when it offers one.
    pub revocation_endpoint: Option<String>,
    /// The client id (pre-registered, a metadata document URL, or registered).
    pub client_id: String,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub auth_method: String,
}

/// A connection's sealed tokens and what may be said of them in the open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The ciphertext (base64 of nonce ‖ AES-256-GCM output).
    pub sealed: String,
    /// The id of the key it is sealed under.
    pub key_id: String,
    /// Scopes the server granted (space-separated).
    pub scopes_granted: Option<String>,
    /// When the access token expires, if the server said.
    pub access_expires_at: Option<Timestamp>,
    /// Whether a refresh token is held.
    pub has_refresh: bool,
}

/// A connection as stored. Holds no token in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// Its name (`[[connections]] name`).
    pub name: String,
    /// Endpoints and client.
    pub endpoints: Endpoints,
    /// The tokens, sealed.
    pub sealed: Sealed,
    /// Moves on every write of the tokens (a refresh, a new sign-in).
    pub generation: i64,
    /// Scopes a run was refused for (`insufficient_scope`): the next sign-in asks for them.
    pub scopes_wanted: Option<String>,
    /// Usable or not.
    pub status: ConnectionStatus,
    /// Who signed in.
    pub connected_by: String,
    /// When.
    pub connected_at: Timestamp,
    /// Refreshes since the sign-in.
    pub refreshes: i64,
    /// The last refresh.
    pub last_refresh_at: Option<Timestamp>,
    /// The last refresh's error, if it failed.
    pub last_error: Option<String>,
    /// When the last refresh failed (cleared by a success or a new sign-in).
    pub failed_at: Option<Timestamp>,
    /// Who holds the refresh lease, and until when.
    pub lease: Option<(String, Timestamp)>,
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    server: String,
    resource: String,
    issuer: Option<String>,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
    client_id: String,
    auth_method: String,
    sealed: String,
    key_id: String,
    generation: i64,
    scopes_granted: Option<String>,
    scopes_wanted: Option<String>,
    access_expires_at: Option<i64>,
    has_refresh: bool,
    status: String,
    connected_by: String,
    connected_at: i64,
    refreshes: i64,
    last_refresh_at: Option<i64>,
    last_error: Option<String>,
    failed_at: Option<i64>,
    refresh_holder: Option<String>,
    refresh_until: Option<i64>,
}

/// `SELECT <every column of Row> FROM connections <tail>`, as one static text.
macro_rules! select {
    ($tail:literal) => {
        concat!(
            "SELECT name, server, resource, issuer, token_endpoint, revocation_endpoint,
                client_id, auth_method, sealed, key_id, generation, scopes_granted,
                scopes_wanted, access_expires_at, has_refresh, status, connected_by,
                connected_at, refreshes, last_refresh_at, last_error, failed_at,
                refresh_holder, refresh_until FROM connections ",
            $tail
        )
    };
}

impl Row {
    fn into_connection(self) -> Result<Connection, Error> {
        Ok(Connection {
            status: ConnectionStatus::parse(&self.status)?,
            name: self.name,
            endpoints: Endpoints {
                server: self.server,
                resource: self.resource,
                issuer: self.issuer,
                token_endpoint: self.token_endpoint,
                revocation_endpoint: self.revocation_endpoint,
                client_id: self.client_id,
                auth_method: self.auth_method,
            },
            sealed: Sealed {
                sealed: self.sealed,
                key_id: self.key_id,
                scopes_granted: self.scopes_granted,
                access_expires_at: self.access_expires_at.map(Timestamp),
                has_refresh: self.has_refresh,
            },
            generation: self.generation,
            scopes_wanted: self.scopes_wanted,
            connected_by: self.connected_by,
            connected_at: Timestamp(self.connected_at),
            refreshes: self.refreshes,
            last_refresh_at: self.last_refresh_at.map(Timestamp),
            last_error: self.last_error,
            failed_at: self.failed_at.map(Timestamp),
            lease: self.refresh_holder.zip(self.refresh_until.map(Timestamp)),
        })
    }
}

async fn read(c: &mut Conn<'_>, s: &Scope, name: &str) -> Result<Option<Connection>, Error> {
    let sql = select!("WHERE tenant = $1 AND workspace = $2 AND name = $3");
    c.optional::<Row>(sql, args![&s.tenant, &s.workspace, name])
        .await?
        .map(Row::into_connection)
        .transpose()
}

/// How a refresh ended, for [`Ledger::fail_connection_refresh`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshFailure {
    /// Worth trying again later (the server was down, timed out, answered 5xx).
    Transient,
    /// The refresh token is dead (`invalid_grant`): a person must sign in again.
    NeedsReconnect,
}

impl Ledger {
    /// Connection `name`, or `None`.
    pub async fn connection(&self, name: &str) -> Result<Option<Connection>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        read(&mut pc.conn(), s, name).await
    }

    /// Every connection, by name.
    pub async fn list_connections(&self) -> Result<Vec<Connection>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let sql = select!("WHERE tenant = $1 AND workspace = $2 ORDER BY name");
        pc.conn()
            .all::<Row>(sql, args![&s.tenant, &s.workspace])
            .await?
            .into_iter()
            .map(Row::into_connection)
            .collect()
    }

    /// Stores a sign-in: the connection `name` with new tokens, `connected` by `by` at
    /// `now`, its generation moved past any earlier one (so a refresh leased on the old
    /// tokens cannot overwrite these), its wanted scopes, error and lease cleared. The
    /// new generation.
    pub async fn store_connection(
        &self,
        name: &str,
        endpoints: Endpoints,
        sealed: Sealed,
        by: &str,
        now: Timestamp,
    ) -> Result<i64, Error> {
        let ledger = self.clone();
        let (name, by) = (name.to_owned(), by.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let e = endpoints;
                // One statement: two sign-ins at once, or one racing a refresh, each
                // get their own generation (a read-then-write would not on PostgreSQL).
                let sql = "INSERT INTO connections (tenant, workspace, name, server, resource,
                        issuer, token_endpoint, revocation_endpoint, client_id, auth_method,
                        sealed, key_id, generation, scopes_granted, access_expires_at,
                        has_refresh, status, connected_by, connected_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, $14,
                        $15, $18, $16, $17)
                     ON CONFLICT (tenant, workspace, name) DO UPDATE SET
                        server = excluded.server, resource = excluded.resource,
                        issuer = excluded.issuer, token_endpoint = excluded.token_endpoint,
                        revocation_endpoint = excluded.revocation_endpoint,
                        client_id = excluded.client_id, auth_method = excluded.auth_method,
                        sealed = excluded.sealed, key_id = excluded.key_id,
                        generation = connections.generation + 1,
                        scopes_granted = excluded.scopes_granted, scopes_wanted = NULL,
                        access_expires_at = excluded.access_expires_at,
                        has_refresh = excluded.has_refresh, status = excluded.status,
                        connected_by = excluded.connected_by,
                        connected_at = excluded.connected_at, refreshes = 0,
                        last_refresh_at = NULL, last_error = NULL, failed_at = NULL,
                        refresh_holder = NULL, refresh_until = NULL
                     RETURNING generation";
                let (generation,) = c
                    .optional::<(i64,)>(
                        sql,
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            e.server,
                            e.resource,
                            e.issuer,
                            e.token_endpoint,
                            e.revocation_endpoint,
                            e.client_id,
                            e.auth_method,
                            sealed.sealed,
                            sealed.key_id,
                            sealed.scopes_granted,
                            sealed.access_expires_at,
                            sealed.has_refresh,
                            &by,
                            now,
                            ConnectionStatus::Connected.as_str()
                        ],
                    )
                    .await?
                    .ok_or_else(|| Error::Corrupt {
                        what: format!("connection {name}: the upsert returned no row"),
                    })?;
                Ok(generation)
            })
        })
        .await
    }

    /// Takes the refresh lease of connection `name` for `holder` until `until`, if its
    /// tokens are still of `generation` and no one else holds an unexpired lease. The
    /// connection as leased, or `None` when someone else refreshes (or has refreshed):
    /// the caller waits for the generation to move and reads the new tokens.
    pub async fn lease_connection_refresh(
        &self,
        name: &str,
        generation: i64,
        holder: &str,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<Option<Connection>, Error> {
        let ledger = self.clone();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let taken = c
                    .execute(
                        "UPDATE connections SET refresh_holder = $4, refresh_until = $5
                         WHERE tenant = $1 AND workspace = $2 AND name = $3
                           AND generation = $6 AND status = $8
                           AND (refresh_holder IS NULL OR refresh_until <= $7)",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            &holder,
                            until,
                            generation,
                            now,
                            ConnectionStatus::Connected.as_str()
                        ],
                    )
                    .await?;
                if taken == 0 {
                    return Ok(None);
                }
                read(c, s, &name).await
            })
        })
        .await
    }

    /// The refresh's new tokens, written only if `holder` still holds the lease: the
    /// next generation, the lease released. `false` when the lease was lost (expired and
    /// taken, or the connection signed in again or removed): the caller must not use
    /// what it got.
    pub async fn finish_connection_refresh(
        &self,
        name: &str,
        holder: &str,
        sealed: Sealed,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let n = c
                    .execute(
                        "UPDATE connections SET sealed = $5, key_id = $6, scopes_granted = $7,
                            access_expires_at = $8, has_refresh = $9, generation = generation + 1,
                            refreshes = refreshes + 1, last_refresh_at = $10, last_error = NULL,
                            failed_at = NULL,
                            refresh_holder = NULL, refresh_until = NULL
                         WHERE tenant = $1 AND workspace = $2 AND name = $3 AND refresh_holder = $4",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            &holder,
                            sealed.sealed,
                            sealed.key_id,
                            sealed.scopes_granted,
                            sealed.access_expires_at,
                            sealed.has_refresh,
                            now
                        ],
                    )
                    .await?;
                Ok(n == 1)
            })
        })
        .await
    }

    /// A failed refresh, recorded if `holder` still holds the lease (released): its
    /// error, and with [`RefreshFailure::NeedsReconnect`] the status that stops every
    /// worker from trying again, with a `connection.needs_reconnect` event in the same
    /// transaction. Whether it was recorded.
    pub async fn fail_connection_refresh(
        &self,
        name: &str,
        holder: &str,
        failure: RefreshFailure,
        error: &str,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let (name, holder, error) = (name.to_owned(), holder.to_owned(), error.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let status = match failure {
                    RefreshFailure::Transient => ConnectionStatus::Connected,
                    RefreshFailure::NeedsReconnect => ConnectionStatus::NeedsReconnect,
                };
                let n = c
                    .execute(
                        "UPDATE connections SET status = $5, last_error = $6, failed_at = $7,
                            refresh_holder = NULL, refresh_until = NULL
                         WHERE tenant = $1 AND workspace = $2 AND name = $3 AND refresh_holder = $4",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            &holder,
                            status.as_str(),
                            &error,
                            now
                        ],
                    )
                    .await?;
                if n == 1 && failure == RefreshFailure::NeedsReconnect {
                    let payload = serde_json::json!({ "connection": name, "error": error });
                    emit_unscoped(c, s, now, EventType::ConnectionNeedsReconnect, payload).await?;
                }
                Ok(n == 1)
            })
        })
        .await
    }

    /// Replaces connection `name`'s sealed text and key id (a key rotation), if its
    /// tokens are still of `generation` and no refresh is under way; the generation
    /// moves. Whether it was replaced.
    pub async fn reseal_connection(
        &self,
        name: &str,
        generation: i64,
        sealed: &str,
        key_id: &str,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let (name, sealed, key_id) = (name.to_owned(), sealed.to_owned(), key_id.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let n = c
                    .execute(
                        "UPDATE connections SET sealed = $5, key_id = $6,
                            generation = generation + 1
                         WHERE tenant = $1 AND workspace = $2 AND name = $3 AND generation = $4
                           AND (refresh_holder IS NULL OR refresh_until <= $7)",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &name,
                            generation,
                            &sealed,
                            &key_id,
                            now
                        ],
                    )
                    .await?;
                Ok(n == 1)
            })
        })
        .await
    }

    /// Records that a run was refused for lack of `scope` (`insufficient_scope`): the
    /// next `flow connect NAME` asks for it too. Whether the connection exists.
    pub async fn want_connection_scope(&self, name: &str, scope: &str) -> Result<bool, Error> {
        let ledger = self.clone();
        let (name, scope) = (name.to_owned(), scope.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let Some(old) = read(c, s, &name).await? else {
                    return Ok(false);
                };
                let mut wanted: Vec<String> = old
                    .scopes_wanted
                    .iter()
                    .flat_map(|w| w.split_whitespace())
                    .map(str::to_owned)
                    .collect();
                for one in scope.split_whitespace() {
                    if !wanted.iter().any(|w| w == one) {
                        wanted.push(one.to_owned());
                    }
                }
                c.execute(
                    "UPDATE connections SET scopes_wanted = $4
                     WHERE tenant = $1 AND workspace = $2 AND name = $3",
                    args![&s.tenant, &s.workspace, &name, wanted.join(" ")],
                )
                .await?;
                Ok(true)
            })
        })
        .await
    }

    /// Deletes connection `name` (after its revocation). The connection as it was, or
    /// `None` when there was none.
    pub async fn delete_connection(&self, name: &str) -> Result<Option<Connection>, Error> {
        let ledger = self.clone();
        let name = name.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let old = read(c, s, &name).await?;
                c.execute(
                    "DELETE FROM connections WHERE tenant = $1 AND workspace = $2 AND name = $3",
                    args![&s.tenant, &s.workspace, &name],
                )
                .await?;
                Ok(old)
            })
        })
        .await
    }
}

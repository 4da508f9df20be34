//! What may be said of a connection in the open — `flow connections --json`,
//! `GET /api/v1/connections` and the console's Connections page show the same record.
//! It holds no token: who signed in and when, scopes, expiry, whether a refresh token
//! is held, the last refresh and its error.

use flow_ledger::{Connection, ConnectionStatus, Timestamp};
use schemars::JsonSchema;
use serde::Serialize;

use super::ConnectionConfig;

/// Whether a connection can be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ViewStatus {
    /// Signed in; its tokens are used and refreshed.
    Connected,
    /// Its refresh token was refused: someone must sign in again.
    NeedsReconnect,
    /// Declared in `flow.toml`, never signed in to.
    NotConnected,
}

/// One connection as the CLI, the API and the console show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ConnectionView {
    /// The name tools use (`auth: { connection: NAME }`).
    pub name: String,
    /// Whether it can be used.
    pub status: ViewStatus,
    /// The MCP server.
    pub server: String,
    /// The authorization server's issuer, once signed in.
    pub issuer: Option<String>,
    /// The client id signed in with.
    pub client_id: Option<String>,
    /// Who signed in.
    pub connected_by: Option<String>,
    /// When (RFC 3339).
    pub connected_at: Option<String>,
    /// Scopes granted (space-separated).
    pub scopes: Option<String>,
    /// Scopes a run was refused for: the next sign-in asks for them too.
    pub scopes_wanted: Option<String>,
    /// When the access token expires (RFC 3339), if the server said.
    pub access_expires_at: Option<String>,
    /// Whether a refresh token is held.
    pub has_refresh_token: bool,
    /// Refreshes since the sign-in.
    pub refreshes: i64,
    /// The last refresh (RFC 3339).
    pub last_refresh_at: Option<String>,
    /// The last refresh's error.
    pub last_error: Option<String>,
    /// The id of the key its tokens are sealed under.
    pub key_id: Option<String>,
}

fn when(t: Option<Timestamp>) -> Option<String> {
    t.map(|t| t.to_rfc3339())
}

impl From<&Connection> for ConnectionView {
    fn from(c: &Connection) -> Self {
        ConnectionView {
            name: c.name.clone(),
            status: match c.status {
                ConnectionStatus::Connected => ViewStatus::Connected,
                ConnectionStatus::NeedsReconnect => ViewStatus::NeedsReconnect,
            },
            server: c.endpoints.server.clone(),
            issuer: c.endpoints.issuer.clone(),
            client_id: Some(c.endpoints.client_id.clone()),
            connected_by: Some(c.connected_by.clone()),
            connected_at: Some(c.connected_at.to_rfc3339()),
            scopes: c.sealed.scopes_granted.clone(),
            scopes_wanted: c.scopes_wanted.clone(),
            access_expires_at: when(c.sealed.access_expires_at),
            has_refresh_token: c.sealed.has_refresh,
            refreshes: c.refreshes,
            last_refresh_at: when(c.last_refresh_at),
            last_error: c.last_error.clone(),
            key_id: Some(c.sealed.key_id.clone()),
        }
    }
}

impl From<&ConnectionConfig> for ConnectionView {
    fn from(c: &ConnectionConfig) -> Self {
        ConnectionView {
            name: c.name.clone(),
            status: ViewStatus::NotConnected,
            server: c.server.clone(),
            issuer: None,
            client_id: c.client_id.clone(),
            connected_by: None,
            connected_at: None,
            scopes: None,
            scopes_wanted: None,
            access_expires_at: None,
            has_refresh_token: false,
            refreshes: 0,
            last_refresh_at: None,
            last_error: None,
            key_id: None,
        }
    }
}

/// The stored connections and, after them by name, those `declared` in `flow.toml`
/// but never signed in to.
pub fn views(stored: &[Connection], declared: &[ConnectionConfig]) -> Vec<ConnectionView> {
    let mut all: Vec<ConnectionView> = stored.iter().map(ConnectionView::from).collect();
    for d in declared {
        if !stored.iter().any(|c| c.name == d.name) {
            all.push(ConnectionView::from(d));
        }
    }
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all
}

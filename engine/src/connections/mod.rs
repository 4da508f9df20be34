//! Connections: MCP servers that grant only the OAuth authorization-code flow, signed
//! in to once by a person (`flow connect NAME`) and used by every worker on every host.
//!
//! - `flow.toml` declares them (`[[connections]]`: name, server, optional client id or
//!   client metadata document URL, client secret name, scopes); a tool uses one with
//!   `auth: { connection: NAME }`.
//! - [`grant`] runs the sign-in: discovery, a client (pre-registered → metadata
//!   document → dynamic registration), PKCE S256, `state`, `resource`, a loopback
//!   redirect; the tokens are sealed ([`seal`]) and stored in the ledger with what a
//!   worker needs to refresh them, so `flow.toml`'s entry is not needed to use one.
//! - [`store::Store`] lends tokens to the MCP pool: a token within 30 s of expiry (or
//!   refused with a 401) is refreshed under a ledger lease by exactly one worker; the
//!   others read the new generation. A refused refresh token marks the connection
//!   `needs_reconnect` and calls fail as not sent, naming `flow connect NAME`.
//! - [`cross_app`] signs in without a browser where the enterprise's identity provider
//!   vouches for the person (SEP-990): their ID token → an ID-JAG → an access token.
//! - [`remote`] begins the same sign-in from the console or the API and finishes it on
//!   whichever server the browser comes back to (the pending sign-in waits, sealed, in
//!   the ledger).

pub mod cross_app;
pub mod grant;
pub mod remote;
pub mod seal;
pub mod store;
pub mod view;

use serde::Deserialize;

/// `[[connections]]` in `flow.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    /// The name tools refer to (`auth: { connection: NAME }`).
    pub name: String,
    /// The MCP server's URL (streamable HTTP); its authorization server is discovered.
    pub server: String,
    /// A pre-registered client id, or an `https://` Client ID Metadata Document URL;
    /// without one, flow registers itself (RFC 7591) when the server offers it.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The secret holding a pre-registered confidential client's secret (its name:
    /// `FLOW_SECRET_<NAME>` or a `--secrets-file` line).
    #[serde(default)]
    pub client_secret_name: Option<String>,
    /// `client_secret_basic` (default with a secret) or `client_secret_post`.
    #[serde(default)]
    pub token_endpoint_auth: Option<String>,
    /// Scopes to ask for; else the server's challenge, else its `scopes_supported`.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Cross-app access: sign in with the person's ID token from the enterprise identity
    /// provider instead of a browser (`[connections.cross_app]`).
    #[serde(default)]
    pub cross_app: Option<CrossAppConfig>,
}

/// `[connections.cross_app]`: the identity provider that trades a person's ID token for
/// an ID-JAG the MCP server's authorization server takes as a JWT bearer grant
/// (SEP-990; RFC 8693 then RFC 7523).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrossAppConfig {
    /// The identity provider's token endpoint (where the token exchange is posted).
    pub idp_token_endpoint: String,
    /// flow's client id at the identity provider.
    pub idp_client_id: String,
    /// The secret holding flow's client secret there, if it is a confidential client.
    #[serde(default)]
    pub idp_client_secret_name: Option<String>,
    /// The secret holding the person's ID token (`FLOW_SECRET_<NAME>` or a
    /// `--secrets-file` line), read by `flow connect` only.
    pub id_token_secret: String,
}

impl ConnectionConfig {
    /// Checks what parsing cannot: the name, the URL, the client settings.
    pub fn check(&self) -> Result<(), String> {
        if !crate::workflow::is_connection_name(&self.name) {
            return Err(crate::workflow::CONNECTION_NAME_HELP.to_string());
        }
        let ok = url::Url::parse(&self.server)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        if !ok {
            return Err(format!(
                "`server` `{}` is not an http(s) URL of an MCP server",
                self.server
            ));
        }
        if self.client_secret_name.is_some() && self.client_id.is_none() {
            return Err("`client_secret_name` needs the `client_id` it belongs to".into());
        }
        if let Some(method) = &self.token_endpoint_auth
            && !["client_secret_basic", "client_secret_post"].contains(&method.as_str())
        {
            return Err(
                "`token_endpoint_auth` is `client_secret_basic` or `client_secret_post`".into(),
            );
        }
        if self.scopes.iter().any(|s| s.is_empty() || s.contains(' ')) {
            return Err("each of `scopes` is one scope, without spaces".into());
        }
        if let Some(x) = &self.cross_app {
            if self.client_id.is_none() {
                return Err("`cross_app` needs `client_id` (and usually `client_secret_name`): the JWT bearer grant comes from a client the authorization server knows".into());
            }
            let ok = url::Url::parse(&x.idp_token_endpoint)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                return Err(format!(
                    "`cross_app.idp_token_endpoint` `{}` is not an http(s) URL",
                    x.idp_token_endpoint
                ));
            }
            if x.idp_client_id.is_empty() || x.id_token_secret.is_empty() {
                return Err(
                    "`cross_app.idp_client_id` and `cross_app.id_token_secret` must not be empty"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

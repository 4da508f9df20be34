//! How a session keeps its bearer token current: OAuth client credentials fetched by
//! the session itself, or a connection's token lent by the engine ([`ConnectionTokens`]),
//! which refreshes it for every worker at once under a lease in the ledger.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::auth::{self, Credentials, Token, TokenSlot};
use super::{Auth, discovery};
use crate::Error;
use crate::egress::AllowList;

/// What starting a session needs besides the server: the HTTP client, the egress
/// allow-list for discovered URLs, where connections' tokens come from, the deadline.
pub(super) struct StartCx<'a> {
    pub(super) http: &'a crate::lazy_client::LazyClient,
    pub(super) allow: Option<AllowList>,
    pub(super) connections: Option<Arc<dyn ConnectionTokens>>,
    pub(super) deadline: Instant,
}

/// Where a connection's access token comes from (the engine's ledger-backed store).
///
/// Implementations return errors classified for a call that has not left: a connection
/// that needs a new sign-in, a missing key or an unreachable token endpoint all mean
/// nothing was sent.
pub trait ConnectionTokens: Send + Sync {
    /// A usable access token of connection `name`, refreshed first when it is near
    /// expiry, or when it is `refused` (the token a server just answered 401 to), by
    /// `deadline` (past it: not sent). A refresh under way is not abandoned when the
    /// caller gives up: its rotated refresh token is stored all the same.
    fn access_token<'a>(
        &'a self,
        name: &'a str,
        refused: Option<&'a str>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, Error>>;

    /// A server refused a call of connection `name` for lack of `scope`
    /// (`insufficient_scope`): the next sign-in asks for it.
    fn wants_scope<'a>(&'a self, name: &'a str, scope: &'a str) -> BoxFuture<'a, ()>;

    /// Builds whatever a refresh will need (its HTTP client) now, so a refresh during a
    /// call does not pay for it between the call's outbound mark and its send.
    fn warm(&self) {}
}

/// The OAuth state of a session.
pub(super) enum SessionAuth {
    /// Client credentials: the session fetches its own tokens.
    Credentials(Box<TokenState>),
    /// A connection: tokens come from the engine.
    Connection {
        name: String,
        slot: TokenSlot,
        source: Arc<dyn ConnectionTokens>,
    },
}

/// The OAuth state of a session that uses client credentials.
pub(super) struct TokenState {
    slot: TokenSlot,
    credentials: Credentials,
    current: tokio::sync::Mutex<Token>,
}

impl TokenState {
    /// The state holding `token`, which is now what the transport sends.
    pub(super) fn new(slot: &TokenSlot, credentials: Credentials, token: Token) -> Self {
        slot.set(token.access_token.clone());
        TokenState {
            slot: slot.clone(),
            credentials,
            current: tokio::sync::Mutex::new(token),
        }
    }

    /// Fetches a token for the current and the challenged scopes and installs it.
    pub(super) async fn answer(
        &self,
        http: &crate::lazy_client::LazyClient,
        challenge: &str,
        deadline: Instant,
    ) -> Result<(), Error> {
        let mut current = self.current.lock().await;
        let challenged = auth::challenge_scope(challenge);
        let scope = auth::scope_union(current.scope.as_deref(), challenged.as_deref());
        let token =
            auth::fetch_token(http.get()?, &self.credentials, scope.as_deref(), deadline).await?;
        self.slot.set(token.access_token.clone());
        *current = token;
        Ok(())
    }
}

/// Answers a challenge to connection `name`'s token in `slot`: a 403
/// `insufficient_scope` is recorded and fails as not sent (a daemon cannot ask a person
/// to sign in again); a 401 gets a refreshed token.
pub(super) async fn answer_connection(
    name: &str,
    slot: &TokenSlot,
    source: &dyn ConnectionTokens,
    challenge: &str,
    refused: Option<&str>,
    deadline: Instant,
) -> Result<(), Error> {
    if auth::challenge_param(challenge, "error").as_deref() == Some("insufficient_scope") {
        let scope = auth::challenge_scope(challenge).unwrap_or_default();
        source.wants_scope(name, &scope).await;
        return Err(Error::not_sent(format!(
            "connection `{name}` lacks scope `{scope}` (the server answered 403 insufficient_scope); it is recorded: run `flow connect {name}` to sign in with it"
        )));
    }
    // A 401 naming a scope: recorded too, in case the refreshed token lacks it.
    if let Some(scope) = auth::challenge_scope(challenge).filter(|s| !s.is_empty()) {
        source.wants_scope(name, &scope).await;
    }
    let token = source.access_token(name, refused, deadline).await?;
    slot.set(token);
    Ok(())
}

impl SessionAuth {
    /// The connection's name, for a connection's token.
    pub(super) fn connection(&self) -> Option<&str> {
        match self {
            SessionAuth::Connection { name, .. } => Some(name),
            SessionAuth::Credentials(_) => None,
        }
    }

    /// Renews the token before a call when it is about to expire (a connection's store
    /// decides for its own).
    pub(super) async fn renew_if_stale(
        &self,
        http: &crate::lazy_client::LazyClient,
        deadline: Instant,
    ) -> Result<(), Error> {
        match self {
            SessionAuth::Connection { name, slot, source } => {
                slot.set(source.access_token(name, None, deadline).await?);
                Ok(())
            }
            SessionAuth::Credentials(state) => {
                let mut current = state.current.lock().await;
                if !current.is_stale(Instant::now()) {
                    return Ok(());
                }
                let scope = current.scope.clone();
                let token =
                    auth::fetch_token(http.get()?, &state.credentials, scope.as_deref(), deadline)
                        .await?;
                state.slot.set(token.access_token.clone());
                *current = token;
                Ok(())
            }
        }
    }

    /// The bearer token requests carry now (a connection's), to tell a later 401 which
    /// token it refused: the slot may hold a newer one by then.
    pub(super) fn bearer(&self) -> Option<String> {
        match self {
            SessionAuth::Connection { slot, .. } => slot.get(),
            SessionAuth::Credentials(_) => None,
        }
    }

    /// Answers a challenge to a request that carried `refused`.
    pub(super) async fn reauthenticate(
        &self,
        http: &crate::lazy_client::LazyClient,
        challenge: &str,
        refused: Option<&str>,
        deadline: Instant,
    ) -> Result<(), Error> {
        match self {
            SessionAuth::Credentials(state) => state.answer(http, challenge, deadline).await,
            SessionAuth::Connection { name, slot, source } => {
                answer_connection(name, slot, source.as_ref(), challenge, refused, deadline).await
            }
        }
    }

    /// Records what a refusal after the one re-authentication wanted (a connection's
    /// missing scope), so the next sign-in asks for it.
    pub(super) async fn record_refusal(&self, challenge: &str) {
        if let SessionAuth::Connection { name, source, .. } = self
            && let Some(scope) = auth::challenge_scope(challenge).filter(|s| !s.is_empty())
        {
            source.wants_scope(name, &scope).await;
        }
    }
}

/// The state a session starts with for `auth`, its first token put in `slot`: a fixed
/// bearer, a connection's token, a client-credentials token from an explicit
/// `token_url`; `None` when the first 401 will tell (discovery) or nothing is needed.
pub(super) async fn initial(
    auth: &Auth,
    slot: &TokenSlot,
    url: &str,
    cx: &StartCx<'_>,
) -> Result<Option<SessionAuth>, Error> {
    match auth {
        Auth::None
        | Auth::ClientCredentials {
            token_url: None, ..
        } => Ok(None),
        Auth::Bearer(token) => {
            slot.set(token.clone());
            Ok(None)
        }
        Auth::Connection(name) => {
            let Some(source) = cx.connections.clone() else {
                return Err(Error::not_sent(format!(
                    "connection `{name}`: this process has no connections store"
                )));
            };
            slot.set(source.access_token(name, None, cx.deadline).await?);
            Ok(Some(SessionAuth::Connection {
                name: name.clone(),
                slot: slot.clone(),
                source,
            }))
        }
        Auth::ClientCredentials {
            token_url: Some(token_url),
            client_id,
            client_auth,
            scope,
        } => {
            let credentials = Credentials {
                token_url: token_url.clone(),
                client_id: client_id.clone(),
                client_auth: client_auth.clone(),
                resource: auth::without_query(url),
                audience: token_url.clone(),
                methods: Vec::new(),
            };
            let token =
                auth::fetch_token(cx.http.get()?, &credentials, scope.as_deref(), cx.deadline)
                    .await?;
            Ok(Some(SessionAuth::Credentials(Box::new(TokenState::new(
                slot,
                credentials,
                token,
            )))))
        }
    }
}

/// Answers a challenge to `initialize` (not the tool call: no counted request): with
/// the session's state, or by discovery when it has none. `false` when there is
/// nothing to answer with (no client credentials configured).
pub(super) async fn answer_initialize(
    state: &mut Option<SessionAuth>,
    url: &str,
    auth: &Auth,
    slot: &TokenSlot,
    challenge: &str,
    cx: &StartCx<'_>,
) -> Result<bool, Error> {
    if let Some(state) = state {
        let refused = state.bearer();
        state
            .reauthenticate(cx.http, challenge, refused.as_deref(), cx.deadline)
            .await?;
        return Ok(true);
    }
    let found = discovery::credentials(
        url,
        auth,
        challenge,
        cx.http.get()?,
        cx.allow.as_ref(),
        cx.deadline,
    )
    .await?;
    let Some((credentials, scope)) = found else {
        return Ok(false);
    };
    let token =
        auth::fetch_token(cx.http.get()?, &credentials, scope.as_deref(), cx.deadline).await?;
    *state = Some(SessionAuth::Credentials(Box::new(TokenState::new(
        slot,
        credentials,
        token,
    ))));
    Ok(true)
}

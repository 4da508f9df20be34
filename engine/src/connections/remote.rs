//! Sign-ins begun from the console or the API and finished by whichever server the
//! browser comes back to.
//!
//! `POST /api/v1/connections/{name}/connect` (or the console's *Connect*) begins the
//! same grant as `flow connect` with `[api] public_url` + [`CALLBACK_PATH`] as the
//! redirect; what finishing needs (the PKCE verifier, the client, the endpoints, who
//! began it) is sealed under the connections key and stored in the ledger keyed by the
//! SHA-256 of `state` ([`flow_ledger::PendingSignIn`]; the state itself is only inside
//! the sealed record). The redirect may land on any server behind that URL sharing the
//! ledger: the first to take the row finishes the sign-in; a replayed, forged or late
//! redirect finds no row and stores nothing.
//!
//! A sign-in begun in the console is also bound to the browser that began it: a random
//! cookie (`flow_connect_<name>`, `SameSite=Lax` so the authorization server's redirect
//! carries it, `Path` the callback's) whose hash is sealed with the record, so a sign-in
//! URL seen by someone else (a shared screen, a proxy log) cannot be finished in their
//! browser with their account. An API caller gets no cookie: its `authorize_url` is a
//! secret for its 10 minutes.

use std::time::Duration;

use flow_adapters::mcp::OAuth;
use flow_ledger::{Clock as _, Ledger, PendingSignIn, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::ConnectionConfig;
use super::grant::{self, Connected, Pending, SignInWith};
use super::seal::{Key, Keys};
use crate::secrets::Secrets;

/// Where a console or API sign-in's browser comes back (under `[api] public_url`).
pub const CALLBACK_PATH: &str = "/ui/connections/callback";

/// How long a begun sign-in waits for its browser.
pub const PENDING_FOR: Duration = Duration::from_secs(10 * 60);

/// A sign-in begun: where to send the person.
#[derive(Debug)]
pub struct Started {
    /// The authorization server's sign-in page.
    pub authorize_url: String,
    /// Where the browser will come back.
    pub redirect_uri: String,
    /// After this the redirect is refused.
    pub expires_at: Timestamp,
}

/// What waits in the ledger, sealed: the sign-in and, when a browser began it, the
/// hash of that browser's cookie.
#[derive(Serialize, Deserialize)]
struct Waiting {
    pending: Pending,
    #[serde(default)]
    browser: Option<String>,
}

/// The name of the cookie that binds a console sign-in to its browser.
pub fn cookie_name(connection: &str) -> String {
    format!("flow_connect_{connection}")
}

/// A new random value for the cookie of [`cookie_name`].
pub fn new_browser_nonce() -> String {
    let mut bytes = [0u8; 24];
    rand::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_sha256(text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The label a pending sign-in is sealed under (a name cannot hold `:`).
fn label(name: &str) -> String {
    format!("pending:{name}")
}

/// Begins a sign-in to `config` for `by`, its browser to come back to `public_url`;
/// with `browser` (a console sign-in's cookie value) only that browser can finish it.
pub async fn start(
    ledger: &Ledger,
    with: SignInWith<'_>,
    public_url: &str,
    by: &str,
    browser: Option<&str>,
) -> Result<Started, grant::Error> {
    let key = Key::from_secrets(with.secrets).map_err(|e| grant::Error::Setup(e.to_string()))?;
    let redirect_uri = format!("{}{CALLBACK_PATH}", public_url.trim_end_matches('/'));
    let begun = grant::begin(ledger, with, &redirect_uri).await?;
    let now = flow_ledger::SystemClock.now();
    let expires_at = now.plus(PENDING_FOR);
    let s = ledger.scope();
    // The row's key is the state's hash; the state itself is only in the sealed record.
    let state_key = hex_sha256(begun.pending.state());
    let waiting = Waiting {
        pending: begun.pending,
        browser: browser.map(hex_sha256),
    };
    let sealed = key.seal_value(
        (&s.tenant, &s.workspace),
        &label(&with.config.name),
        &waiting,
    );
    let pending = PendingSignIn {
        name: with.config.name.clone(),
        sealed,
        key_id: key.id().to_owned(),
        begun_by: by.to_owned(),
        expires_at,
    };
    ledger
        .put_pending_sign_in(&state_key, pending, now)
        .await
        .map_err(|e| grant::Error::Ledger(format!("cannot record the sign-in: {e}")))?;
    Ok(Started {
        authorize_url: begun.url.to_string(),
        redirect_uri,
        expires_at,
    })
}

/// Finishes the sign-in the redirect's query `params` belong to, for the browser whose
/// cookies `cookie` reads, if the connection is still `declared` with the same server.
/// A redirect without a `state`, or whose sign-in is unknown, already finished or
/// expired, is refused and nothing is stored; so is one from another browser (the
/// sign-in is then spent: begin again).
pub async fn complete(
    ledger: &Ledger,
    secrets: &Secrets,
    oauth: &OAuth,
    declared: &[ConnectionConfig],
    params: &[(String, String)],
    cookie: impl Fn(&str) -> Option<String>,
) -> Result<Connected, grant::Error> {
    let state = params
        .iter()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| {
            grant::Error::Refused("the redirect carries no state; nothing was stored".into())
        })?;
    // The keys first: a server that cannot open the record must not spend it.
    let keys = Keys::from_secrets(secrets).map_err(|e| grant::Error::Setup(e.to_string()))?;
    let now = flow_ledger::SystemClock.now();
    let taken = ledger
        .take_pending_sign_in(&hex_sha256(state), now)
        .await
        .map_err(|e| grant::Error::Ledger(format!("cannot read the sign-in: {e}")))?
        .ok_or_else(|| {
            grant::Error::Refused(
                "no sign-in is waiting for this redirect (it was finished already, expired after 10 minutes, or never begun here); nothing was stored — begin again with Connect"
                    .into(),
            )
        })?;
    let key = keys.by_id(&taken.key_id).ok_or_else(|| {
        grant::Error::Setup(format!(
            "the sign-in to `{}` was begun under connections key {}, which this server does not have; give every server the same FLOW_SECRET_CONNECTIONS_KEY",
            taken.name, taken.key_id
        ))
    })?;
    let s = ledger.scope();
    let waiting: Waiting = key
        .open_value(
            (&s.tenant, &s.workspace),
            &label(&taken.name),
            super::seal::Sealed::new(&taken.sealed, &taken.key_id),
        )
        .map_err(|_| {
            grant::Error::Refused(format!(
                "the sign-in to `{}` does not open (its stored record was altered); nothing was stored",
                taken.name
            ))
        })?;
    if let Some(expected) = &waiting.browser {
        let presented = cookie(&cookie_name(&taken.name)).map(|c| hex_sha256(&c));
        if presented.as_deref() != Some(expected.as_str()) {
            return Err(grant::Error::Refused(format!(
                "the sign-in to `{}` was begun in another browser (or this one lost its cookie); nothing was stored — begin again with Connect in this browser",
                taken.name
            )));
        }
    }
    let pending = waiting.pending;
    let declared_here = declared
        .iter()
        .any(|c| c.name == taken.name && c.server == pending.server());
    if !declared_here {
        return Err(grant::Error::Setup(format!(
            "connection `{}` is no longer declared with server {} in this server's flow.toml; nothing was stored",
            taken.name,
            pending.server()
        )));
    }
    grant::finish(
        ledger,
        oauth,
        &keys.current,
        pending,
        params,
        &taken.begun_by,
    )
    .await
}

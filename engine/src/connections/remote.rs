//! Sign-ins begun from the console or the API and finished by whichever server the
//! browser comes back to.
//!
//! `POST /api/v1/connections/{name}/connect` (or the console's *Connect*) begins the
//! same grant as `flow connect` with `[api] public_url` + [`CALLBACK_PATH`] as the
//! redirect; what finishing needs (the PKCE verifier, the client, the endpoints, who
//! began it) is sealed under the connections key and stored in the ledger keyed by the
//! SHA-256 of `state` ([`flow_ledger::PendingSignIn`]). The redirect may land on any
//! server behind that URL sharing the ledger: the first to take the row finishes the
//! sign-in; a replayed, forged or late redirect finds no row and stores nothing.

use std::time::Duration;

use flow_adapters::mcp::OAuth;
use flow_ledger::{Clock as _, Ledger, PendingSignIn, Timestamp};
use sha2::Digest as _;

use super::ConnectionConfig;
use super::grant::{self, Connected, GrantError, Pending};
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

/// The ledger's key of a pending sign-in: the hash of its `state` (the state itself,
/// the capability to finish it, is never stored).
fn state_key(state: &str) -> String {
    let digest = sha2::Sha256::digest(state.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn label(name: &str) -> String {
    format!("pending:{name}")
}

/// Begins a sign-in to `config` for `by`, its browser to come back to `public_url`.
pub async fn start(
    ledger: &Ledger,
    (config, secrets, oauth): (&ConnectionConfig, &Secrets, &OAuth),
    public_url: &str,
    by: &str,
) -> Result<Started, GrantError> {
    let key = Key::from_secrets(secrets).map_err(|e| GrantError::Setup(e.to_string()))?;
    let redirect_uri = format!("{}{CALLBACK_PATH}", public_url.trim_end_matches('/'));
    let begun = grant::begin(ledger, (config, secrets, oauth), &redirect_uri).await?;
    let now = flow_ledger::SystemClock.now();
    let expires_at = now.plus(PENDING_FOR);
    let s = ledger.scope();
    let sealed = key.seal_value(
        (&s.tenant, &s.workspace),
        &label(&config.name),
        &begun.pending,
    );
    let pending = PendingSignIn {
        name: config.name.clone(),
        sealed,
        key_id: key.id().to_owned(),
        begun_by: by.to_owned(),
        expires_at,
    };
    ledger
        .put_pending_sign_in(&state_key(begun.pending.state()), pending, now)
        .await
        .map_err(|e| GrantError::Setup(format!("cannot record the sign-in: {e}")))?;
    Ok(Started {
        authorize_url: begun.url.to_string(),
        redirect_uri,
        expires_at,
    })
}

/// Finishes the sign-in the redirect's query `params` belong to. A redirect without a
/// `state`, or whose sign-in is unknown, already finished or expired, is refused and
/// nothing is stored.
pub async fn complete(
    ledger: &Ledger,
    (secrets, oauth): (&Secrets, &OAuth),
    params: &[(String, String)],
) -> Result<Connected, GrantError> {
    let state = params
        .iter()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| {
            GrantError::Refused("the redirect carries no state; nothing was stored".into())
        })?;
    let now = flow_ledger::SystemClock.now();
    let taken = ledger
        .take_pending_sign_in(&state_key(state), now)
        .await
        .map_err(|e| GrantError::Setup(format!("cannot read the sign-in: {e}")))?
        .ok_or_else(|| {
            GrantError::Refused(
                "no sign-in is waiting for this redirect (it was finished already, expired after 10 minutes, or never begun here); nothing was stored — begin again with Connect"
                    .into(),
            )
        })?;
    let keys = Keys::from_secrets(secrets).map_err(|e| GrantError::Setup(e.to_string()))?;
    let key = keys.by_id(&taken.key_id).ok_or_else(|| {
        GrantError::Setup(format!(
            "the sign-in to `{}` was begun under connections key {}, which this server does not have; give every server the same FLOW_SECRET_CONNECTIONS_KEY",
            taken.name, taken.key_id
        ))
    })?;
    let s = ledger.scope();
    let pending: Pending = key
        .open_value(
            (&s.tenant, &s.workspace),
            &label(&taken.name),
            (&taken.sealed, &taken.key_id),
        )
        .map_err(|_| {
            GrantError::Refused(format!(
                "the sign-in to `{}` does not open (its stored record was altered); nothing was stored",
                taken.name
            ))
        })?;
    grant::finish(
        ledger,
        (oauth, &keys.current),
        pending,
        params,
        &taken.begun_by,
    )
    .await
}

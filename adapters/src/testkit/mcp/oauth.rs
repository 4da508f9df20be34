//! The test server's authorization-code side, for connections (`flow connect`):
//! `GET /authorize` approves at once and redirects with a code (or with the error the
//! test set), `POST /register` registers a public client (RFC 7591), `POST /revoke`
//! revokes a refresh token (RFC 7009), and `/token` takes `authorization_code` (PKCE
//! S256 checked, the redirect URI and client compared) and `refresh_token` with
//! rotation: a refresh token works once; using it again is counted as
//! [`AuthCodeStats::spent_refresh_uses`] and answered `invalid_grant`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::json;

/// A code waiting to be exchanged.
struct Code {
    client_id: String,
    challenge: String,
    redirect_uri: String,
    scope: String,
}

/// What the authorization-code side counts and holds.
#[derive(Default)]
pub struct AuthCodeStats {
    /// Every live access token (client credentials' too) → its scope: what `/mcp` accepts.
    pub(super) access: Mutex<HashMap<String, String>>,
    codes: Mutex<HashMap<String, Code>>,
    /// Live refresh tokens → (client, scope).
    refresh: Mutex<HashMap<String, (String, String)>>,
    /// Spent (rotated or revoked) refresh tokens.
    spent: Mutex<Vec<String>>,
    issued: AtomicU32,
    refresh_requests: AtomicU32,
    spent_refresh_uses: AtomicU32,
    code_requests: AtomicU32,
    registrations: AtomicU32,
    revocations: AtomicU32,
    /// How long a refresh grant takes to answer, milliseconds (widens races in tests).
    pub(super) refresh_delay_ms: AtomicU64,
    /// Lifetime of access tokens issued here, seconds.
    pub(super) access_ttl: AtomicU64,
    /// The error `/authorize` redirects with instead of a code, if set.
    pub(super) authorize_error: Mutex<Option<String>>,
    /// `/authorize` leaves `iss` out of its redirects (though the metadata promises it).
    pub(super) omit_iss: std::sync::atomic::AtomicBool,
    /// Every access and refresh token issued, for tests that look for them on disk.
    pub(super) all_tokens: Mutex<Vec<String>>,
}

impl AuthCodeStats {
    /// `refresh_token` grants asked for, refused ones included.
    pub fn refresh_requests(&self) -> u32 {
        self.refresh_requests.load(Ordering::SeqCst)
    }

    /// Refresh requests that used a refresh token already rotated or revoked.
    pub fn spent_refresh_uses(&self) -> u32 {
        self.spent_refresh_uses.load(Ordering::SeqCst)
    }

    /// `authorization_code` grants asked for.
    pub fn code_requests(&self) -> u32 {
        self.code_requests.load(Ordering::SeqCst)
    }

    /// Clients registered.
    pub fn registrations(&self) -> u32 {
        self.registrations.load(Ordering::SeqCst)
    }

    /// Refresh tokens revoked through `/revoke`.
    pub fn revocations(&self) -> u32 {
        self.revocations.load(Ordering::SeqCst)
    }

    /// Every token issued (access and refresh).
    pub fn all_tokens(&self) -> Vec<String> {
        self.all_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Kills every live refresh token (as a user revoking the app at the server would).
    pub fn revoke_all_refresh_tokens(&self) {
        let mut live = self.refresh.lock().unwrap_or_else(|e| e.into_inner());
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.extend(live.drain().map(|(k, _)| k));
    }

    pub(super) fn mint(&self, prefix: &str) -> String {
        let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
        let mut random = [0u8; 12];
        let _ = aws_lc_rs::rand::fill(&mut random);
        let token = format!(
            "{prefix}-{n}-{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
        );
        self.all_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token.clone());
        token
    }
}

fn error(status: StatusCode, code: &str) -> Response {
    (status, axum::Json(json!({ "error": code }))).into_response()
}

/// `GET /authorize`: approves at once, redirecting to `redirect_uri` with a code.
pub(super) async fn authorize(
    State(stats): State<Arc<AuthCodeStats>>,
    headers: axum::http::HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    let redirect = get("redirect_uri");
    // A loopback redirect (`flow connect`, RFC 8252) or an https one (a console's
    // `public_url`), as an authorization server would allow.
    if !redirect.starts_with("http://127.0.0.1:") && !redirect.starts_with("https://") {
        return (
            StatusCode::BAD_REQUEST,
            "redirect_uri must be loopback or https",
        )
            .into_response();
    }
    let state = get("state");
    let target = match stats
        .authorize_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        Some(e) => format!("{redirect}?error={e}&state={state}"),
        None if get("code_challenge_method") != "S256" || get("code_challenge").is_empty() => {
            format!("{redirect}?error=invalid_request&state={state}")
        }
        None => {
            let code = stats.mint("code");
            stats
                .codes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    code.clone(),
                    Code {
                        client_id: get("client_id"),
                        challenge: get("code_challenge"),
                        redirect_uri: redirect.clone(),
                        scope: get("scope"),
                    },
                );
            format!("{redirect}?code={code}&state={state}")
        }
    };
    // RFC 9207: the redirect names its issuer (this server's origin), as the metadata
    // promises, unless the test asked for a redirect without it.
    let target = match reqwest::Url::parse(&target) {
        Ok(mut url) if !stats.omit_iss.load(Ordering::SeqCst) => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("127.0.0.1");
            url.query_pairs_mut()
                .append_pair("iss", &format!("http://{host}"));
            url.to_string()
        }
        _ => target,
    };
    (StatusCode::FOUND, [(header::LOCATION, target)]).into_response()
}

/// `POST /register`: a public client for the given redirect URIs.
pub(super) async fn register(State(stats): State<Arc<AuthCodeStats>>) -> Response {
    let n = stats.registrations.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "client_id": format!("registered-{n}"),
            "token_endpoint_auth_method": "none",
        })),
    )
        .into_response()
}

/// `POST /revoke`: a refresh token is spent from now on.
pub(super) async fn revoke(State(stats): State<Arc<AuthCodeStats>>, body: String) -> Response {
    let form = form(&body);
    let token = form.get("token").cloned().unwrap_or_default();
    if stats
        .refresh
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&token)
        .is_some()
    {
        stats.revocations.fetch_add(1, Ordering::SeqCst);
        stats
            .spent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token);
    }
    StatusCode::OK.into_response()
}

/// The `authorization_code` and `refresh_token` grants of `/token`.
pub(super) async fn grant(stats: &AuthCodeStats, form: &HashMap<String, String>) -> Response {
    let get = |k: &str| form.get(k).cloned().unwrap_or_default();
    let (client_id, scope) = match get("grant_type").as_str() {
        "authorization_code" => {
            stats.code_requests.fetch_add(1, Ordering::SeqCst);
            let Some(code) = stats
                .codes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&get("code"))
            else {
                return error(StatusCode::BAD_REQUEST, "invalid_grant");
            };
            let challenge =
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(aws_lc_rs::digest::digest(
                    &aws_lc_rs::digest::SHA256,
                    get("code_verifier").as_bytes(),
                ));
            if challenge != code.challenge
                || code.redirect_uri != get("redirect_uri")
                || code.client_id != get("client_id")
            {
                return error(StatusCode::BAD_REQUEST, "invalid_grant");
            }
            (code.client_id, code.scope)
        }
        "refresh_token" => {
            stats.refresh_requests.fetch_add(1, Ordering::SeqCst);
            let token = get("refresh_token");
            let live = stats
                .refresh
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&token);
            let Some((client_id, scope)) = live else {
                let spent = stats.spent.lock().unwrap_or_else(|e| e.into_inner());
                if spent.contains(&token) {
                    stats.spent_refresh_uses.fetch_add(1, Ordering::SeqCst);
                }
                return error(StatusCode::BAD_REQUEST, "invalid_grant");
            };
            stats
                .spent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(token);
            // Rotated at once, answered late: a client that gives up while waiting
            // has lost the new refresh token (as with a real server).
            let delay = stats.refresh_delay_ms.load(Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            (client_id, scope)
        }
        _ => return error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
    };
    let access_token = stats.mint("access");
    stats
        .access
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(access_token.clone(), scope.clone());
    let refresh_token = stats.mint("refresh");
    stats
        .refresh
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(refresh_token.clone(), (client_id, scope.clone()));
    axum::Json(json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": stats.access_ttl.load(Ordering::SeqCst),
        "refresh_token": refresh_token,
        "scope": scope,
    }))
    .into_response()
}

/// An `application/x-www-form-urlencoded` body's pairs.
pub(super) fn form(body: &str) -> HashMap<String, String> {
    reqwest::Url::parse(&format!("http://form/?{body}"))
        .map(|url| url.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

//! Bearer tokens and roles of the operator API.
//!
//! Tokens are declared in `flow.toml` (`[[api.tokens]] name/role/secret`); a token's
//! value is the secret it names, so the file can be committed. A request's token is
//! compared with every declared one in constant time (`subtle`, over SHA-256 digests,
//! so lengths leak nothing either), and values are never logged or printed: this
//! module's types print names only.
//!
//! Roles are ordered: a viewer reads; an operator also submits, cancels, resumes and
//! resolves; an admin also runs bulk operations.

use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, StatusCode, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::App;
use super::problem::Problem;
use crate::role::Role;

/// A token with its value, ready for comparison. `Debug` shows the name and role only.
pub struct Token {
    /// Recorded as `by` on everything the token does.
    pub name: String,
    /// What it may do.
    pub role: Role,
    digest: [u8; 32],
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// A token named `name` whose value is `value`.
    pub fn new(name: String, role: Role, value: &str) -> Self {
        Self {
            name,
            role,
            digest: Sha256::digest(value.as_bytes()).into(),
        }
    }
}

impl Token {
    /// Whether `other` has the same value (two entries one request could not tell
    /// apart: the later would silently decide the role).
    pub fn same_value(&self, other: &Token) -> bool {
        bool::from(self.digest.ct_eq(&other.digest))
    }
}

/// How the server authenticates.
#[derive(Debug)]
pub enum Tokens {
    /// Bearer tokens (at least one).
    Required(Vec<Token>),
    /// `--insecure-no-auth`: every request acts as admin `anonymous` (loopback only).
    Insecure,
}

/// Who made a request: the token's name (what the ledger records) and role.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Token name (`anonymous` without authentication).
    pub name: String,
    /// Its role.
    pub role: Role,
}

impl Tokens {
    /// The caller a request's `Authorization` header names, or 401.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Problem> {
        let tokens = match self {
            Tokens::Insecure => {
                return Ok(Caller {
                    name: "anonymous".into(),
                    role: Role::Admin,
                });
            }
            Tokens::Required(tokens) => tokens,
        };
        let unauthorized = |detail: &str| Problem::new(StatusCode::UNAUTHORIZED, detail);
        let Some(value) = authorization else {
            return Err(unauthorized(
                "no token: send `Authorization: Bearer <token>`",
            ));
        };
        let Some(presented) = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
        else {
            return Err(unauthorized(
                "the Authorization header must be `Bearer <token>`",
            ));
        };
        let digest: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        // Every token is compared, whichever matches: the time taken says nothing.
        let mut found = None;
        for t in tokens {
            if bool::from(t.digest.ct_eq(&digest)) {
                found = Some(t);
            }
        }
        found
            .map(|t| Caller {
                name: t.name.clone(),
                role: t.role,
            })
            .ok_or_else(|| unauthorized("unknown token"))
    }
}

/// A role an extractor demands (see [`Authed`]).
pub trait Need {
    /// The least role allowed.
    const ROLE: Role;
}

/// Marker: viewers and above.
#[derive(Debug)]
pub struct Viewer;
/// Marker: operators and admins.
#[derive(Debug)]
pub struct Operator;
/// Marker: admins only.
#[derive(Debug)]
pub struct Admin;

impl Need for Viewer {
    const ROLE: Role = Role::Viewer;
}
impl Need for Operator {
    const ROLE: Role = Role::Operator;
}
impl Need for Admin {
    const ROLE: Role = Role::Admin;
}

/// The authenticated caller of a handler that needs role `R`: 401 without a valid
/// token, 403 with one whose role is below `R`. Extracted before the body, so an
/// unauthenticated request is refused before its body is read.
#[derive(Debug)]
pub struct Authed<R: Need>(pub Caller, pub PhantomData<R>);

/// The peer address of a request, when the server was started with connect info
/// (`serve::serve` always is; a router driven in-process is not).
pub fn client_ip(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

/// The caller a request's `Authorization` header names, throttled per client address
/// (`super::throttle`): 429 while the address is refused, 401 for a missing or wrong
/// token. A presented token that matches none is a failure: counted in
/// `flow_api_auth_failures_total{via}` and in the address's window.
pub fn authenticate(
    app: &App,
    headers: &HeaderMap,
    extensions: &Extensions,
    via: &'static str,
) -> Result<Caller, Problem> {
    if matches!(app.tokens, Tokens::Insecure) {
        return app.tokens.authenticate(None);
    }
    let ip = client_ip(extensions);
    app.throttle.check(ip).map_err(Problem::too_many)?;
    let header = headers.get(header::AUTHORIZATION);
    let text = header.and_then(|v| v.to_str().ok());
    match app.tokens.authenticate(text) {
        Ok(caller) => Ok(caller),
        Err(p) => {
            if header.is_some() {
                app.throttle.failed(ip);
                app.metrics.auth_failed(via);
                tracing::warn!(client = ?ip, via, "failed API authentication");
            }
            Err(p)
        }
    }
}

impl<R: Need> FromRequestParts<Arc<App>> for Authed<R> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Problem> {
        let caller = authenticate(app, &parts.headers, &parts.extensions, "api")?;
        if caller.role < R::ROLE {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                format!(
                    "token `{}` has role {}; this needs {}",
                    caller.name,
                    caller.role.as_str(),
                    R::ROLE.as_str()
                ),
            ));
        }
        Ok(Self(caller, PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_authenticate_by_value_and_refuse_others() {
        let tokens = Tokens::Required(vec![
            Token::new("alice".into(), Role::Operator, "s3cret-a"),
            Token::new("bob".into(), Role::Viewer, "s3cret-b"),
        ]);
        let alice = tokens.authenticate(Some("Bearer s3cret-a")).ok();
        assert_eq!(
            alice.map(|c| (c.name, c.role)),
            Some(("alice".into(), Role::Operator))
        );
        for bad in [
            None,
            Some("s3cret-a"),
            Some("Bearer nope"),
            Some("Basic s3cret-a"),
        ] {
            let e = tokens.authenticate(bad).err().map(|p| p.status);
            assert_eq!(e, Some(StatusCode::UNAUTHORIZED), "{bad:?}");
        }
        let shown = format!("{tokens:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

//! Who is signed in to the console, and the CSRF token of each session.
//!
//! Signing in exchanges a bearer token (checked by [`Tokens::authenticate`], in constant
//! time) for a session: a random 256-bit id kept in a server-side map with the caller's
//! name and role. The cookie carries only that id (`HttpOnly; SameSite=Strict; Path=/`),
//! never the token, and signing out removes it from the map, so a copied cookie stops
//! working at once. Sessions live in this process only: a restart signs everyone out.
//!
//! Every form carries a CSRF token, HMAC-SHA256 of the session id under a per-process
//! random key; a POST whose token does not match (compared in constant time) is refused
//! before anything is read or written. With `--insecure-no-auth` there is no sign-in and
//! the one session is `anonymous`; its forms carry a token all the same, so a page on
//! another site cannot post to a console on loopback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::{Page, Ui};
use crate::role::Role;
use crate::serve::auth::{Caller, Tokens};

/// The cookie holding the session id.
pub const COOKIE: &str = "flow_session";

/// How long a session lasts after sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// Most sessions kept at once; signing in beyond it drops the oldest (a bound on the
/// memory a token holder can make the server spend).
const MAX_SESSIONS: usize = 10_000;

/// The session id of the console without authentication.
const ANONYMOUS: &str = "anonymous";

#[derive(Debug, Clone)]
struct Session {
    caller: Caller,
    expires: Instant,
}

/// The sessions of this process and the key their CSRF tokens are made with.
pub struct Sessions {
    key: [u8; 32],
    live: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            key: rand::random(),
            live: Mutex::new(HashMap::new()),
        }
    }
}

impl Sessions {
    /// A new session for `caller`; returns its id (the cookie's value).
    pub fn open(&self, caller: Caller) -> String {
        let id = hex(&rand::random::<[u8; 32]>());
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, s| s.expires > now);
        if live.len() >= MAX_SESSIONS
            && let Some(oldest) = live
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            live.remove(&oldest);
        }
        let expires = now + LIFETIME;
        live.insert(id.clone(), Session { caller, expires });
        id
    }

    /// The caller of session `id`, while it lasts.
    fn caller(&self, id: &str) -> Option<Caller> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.caller.clone())
    }

    /// Ends session `id` (nothing happens for an unknown one).
    pub fn close(&self, id: &str) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.remove(id);
    }

    /// The CSRF token of session `id` (`purpose` separates the sign-in form's token from
    /// the sessions').
    pub fn csrf(&self, purpose: &str, id: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(id.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    /// Whether `presented` is the CSRF token of session `id`, compared in constant time.
    pub fn csrf_ok(&self, purpose: &str, id: &str, presented: &str) -> bool {
        let expected = self.csrf(purpose, id);
        bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The `Set-Cookie` value that stores session `id` (or, empty, clears it).
pub fn set_cookie(id: &str) -> String {
    let age = if id.is_empty() { 0 } else { LIFETIME.as_secs() };
    format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={age}")
}

/// A signed-in console user: the caller (whose name the ledger records) and the session
/// id its forms' CSRF tokens are bound to. Without a session, a page redirects to the
/// sign-in form.
#[derive(Debug, Clone)]
pub struct Signed {
    /// Who.
    pub caller: Caller,
    /// The session id.
    pub session: String,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
}

impl Signed {
    /// Refuses (403) a POST whose CSRF token is not this session's: nothing is read
    /// further and nothing is written.
    pub fn check_csrf(&self, ui: &Ui, presented: &str) -> Result<(), Page> {
        if ui.sessions.csrf_ok("session", &self.session, presented) {
            return Ok(());
        }
        Err(Page::error(
            StatusCode::FORBIDDEN,
            "this form's CSRF token is missing or not this session's: nothing was written (reload the page and try again)",
        ))
    }

    /// Refuses (403) a caller whose role is below `need`.
    pub fn need(&self, need: Role) -> Result<(), Page> {
        if self.caller.role >= need {
            return Ok(());
        }
        Err(Page::error(
            StatusCode::FORBIDDEN,
            format!(
                "`{}` has role {}; this needs {}: nothing was written",
                self.caller.name,
                self.caller.role.as_str(),
                need.as_str()
            ),
        ))
    }
}

impl FromRequestParts<Arc<Ui>> for Signed {
    type Rejection = Page;

    async fn from_request_parts(parts: &mut Parts, ui: &Arc<Ui>) -> Result<Self, Page> {
        if matches!(ui.app.tokens, Tokens::Insecure) {
            let caller = ui.app.tokens.authenticate(None).map_err(Page::from)?;
            let csrf = ui.sessions.csrf("session", ANONYMOUS);
            return Ok(Self {
                caller,
                session: ANONYMOUS.into(),
                csrf,
            });
        }
        let id = parts
            .headers
            .get(header::COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| cookie(h, COOKIE))
            .unwrap_or_default();
        match ui.sessions.caller(id) {
            Some(caller) => Ok(Self {
                caller,
                session: id.to_string(),
                csrf: ui.sessions.csrf("session", id),
            }),
            None => Err(Page::redirect(sign_in_for(parts))),
        }
    }
}

/// The sign-in page that returns to the page `parts` asked for (a GET of a console
/// page), so a link shared to someone signed out still lands where it points.
fn sign_in_for(parts: &Parts) -> String {
    let wanted = parts.uri.path_and_query().map_or("", |p| p.as_str());
    match local_next(wanted) {
        Some(next) if parts.method == axum::http::Method::GET => format!(
            "/ui/sign-in?next={}",
            url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
        ),
        _ => "/ui/sign-in".into(),
    }
}

/// `next` if it is a page of this console to return to after signing in — a local
/// path under `/ui` in plain ASCII, without `..`, backslashes or a second leading
/// slash — else `None`. Anything else would make the sign-in form an open redirect
/// (`?next=https://evil.example`, `//evil.example`, `/\evil.example`), sending a user
/// who just typed their token to another site; it is ignored, not followed.
pub fn local_next(next: &str) -> Option<&str> {
    let path = next.split(['?', '#']).next().unwrap_or_default();
    let under_ui = path == "/ui" || path.starts_with("/ui/");
    let plain = next.len() <= 2_048 && next.bytes().all(|b| b.is_ascii_graphic());
    let dots = path.split('/').any(|seg| {
        let seg = seg.to_ascii_lowercase().replace("%2e", ".");
        seg == "." || seg == ".."
    });
    let loops = path.starts_with("/ui/sign-in") || path.starts_with("/ui/sign-out");
    (under_ui && plain && !dots && !loops && !next.contains('\\')).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_are_per_session_and_per_key() {
        let a = Sessions::default();
        let b = Sessions::default();
        let t = a.csrf("session", "s1");
        assert!(a.csrf_ok("session", "s1", &t));
        assert!(!a.csrf_ok("session", "s2", &t), "bound to the session");
        assert!(!a.csrf_ok("sign-in", "s1", &t), "bound to the purpose");
        assert!(!b.csrf_ok("session", "s1", &t), "bound to the process key");
        assert!(!a.csrf_ok("session", "s1", ""));
        assert!(!a.csrf_ok("session", "s1", &t[..10]));
    }

    #[test]
    fn a_closed_session_is_gone() {
        let s = Sessions::default();
        let id = s.open(Caller {
            name: "otto".into(),
            role: Role::Operator,
        });
        assert_eq!(id.len(), 64);
        assert_eq!(s.caller(&id).map(|c| c.name), Some("otto".into()));
        s.close(&id);
        assert!(s.caller(&id).is_none());
        assert!(s.caller("").is_none());
    }

    #[test]
    fn only_local_console_pages_are_returned_to() {
        for ok in [
            "/ui",
            "/ui/runs",
            "/ui/runs/run_01J?resolved=charge",
            "/ui/in-doubt?prefix=batch-7&age=5#rows",
        ] {
            assert_eq!(local_next(ok), Some(ok), "{ok}");
        }
        for bad in [
            "",
            "https://evil.example/ui/runs",
            "//evil.example/ui/runs",
            "/\\evil.example",
            "/ui\\..\\api",
            "\\\\evil.example",
            "/uievil",
            "/api/v1/runs",
            "ui/runs",
            "/ui/../api/v1/runs",
            "/ui/%2E%2e/api",
            "/ui/runs/ x",
            "/ui/runs/\u{e9}",
            "/ui/sign-in?next=/ui/runs",
            "/ui/sign-out",
            "javascript:alert(1)",
        ] {
            assert_eq!(local_next(bad), None, "{bad:?}");
        }
        assert_eq!(local_next(&format!("/ui/{}", "a".repeat(3_000))), None);
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = "a=1; flow_session=abc; b=2";
        assert_eq!(cookie(h, COOKIE), Some("abc"));
        assert_eq!(cookie("x=flow_session", COOKIE), None);
        assert!(set_cookie("abc").contains("HttpOnly; SameSite=Strict; Path=/"));
        assert!(set_cookie("").contains("Max-Age=0"));
    }
}

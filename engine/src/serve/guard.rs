//! What every request is checked for before any handler runs.
//!
//! - **Text**: the path and the query, percent-decoded, must be UTF-8 without control
//!   characters (NUL, newline, DEL, C1). Ids and filters reach SQL, logs and pages; a
//!   NUL makes PostgreSQL refuse the statement, which used to come back as a 503 with
//!   the database's message (and made `--server` clients report the server
//!   unreachable). 400 problem+json instead, naming where.
//! - **Host and Origin without authentication** (`--insecure-no-auth`, loopback only): a
//!   page on another site can resolve its own name to 127.0.0.1 (DNS rebinding) and
//!   then talk to the server as if it were on the same origin. So the `Host` must be a
//!   loopback name or address (`localhost`, `127.0.0.0/8`, `[::1]`, any port; else 421),
//!   and a request that is not a GET/HEAD/OPTIONS and carries an `Origin` must come
//!   from `http://` + that same host (else 403). Clients that send no `Origin` (curl,
//!   `flow --server`) are not browsers a page can drive.
//! - **`/metrics` with `[api] metrics_token`**: only that token may scrape
//!   ([`metrics`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::auth::{Tokens, authenticate};
use super::problem::Problem;

/// The middleware of every route: text, then (without authentication) Host and Origin.
pub async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if matches!(app.tokens, Tokens::Insecure)
        && let Err(p) = same_loopback_origin(&req)
    {
        return p.into_response();
    }
    if let Err(p) = clean_text(&req) {
        return p.into_response();
    }
    next.run(req).await
}

/// 400 when the path or the query holds a control character or is not UTF-8 once
/// percent-decoded.
fn clean_text(req: &Request) -> Result<(), Problem> {
    let uri = req.uri();
    check_text("path", uri.path())?;
    if let Some(q) = uri.query() {
        check_text("query", q)?;
    }
    Ok(())
}

/// `raw` percent-decoded must be UTF-8 without control characters; `what` names it.
pub fn check_text(what: &str, raw: &str) -> Result<(), Problem> {
    let decoded = percent_decode(raw.as_bytes());
    let Ok(text) = std::str::from_utf8(&decoded) else {
        return Err(Problem::bad_request(format!(
            "the {what} is not UTF-8 once percent-decoded: nothing was read or written"
        )));
    };
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(Problem::bad_request(format!(
            "the {what} holds the control character {:?} (percent-decoded): ids, names and filters never contain one; nothing was read or written",
            c
        )));
    }
    Ok(())
}

/// `%XX` escapes decoded to their bytes; a `%` not followed by two hex digits stays.
fn percent_decode(raw: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && let (Some(h), Some(l)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    out
}

/// Host must be loopback (421); an unsafe method's `Origin`, if any, must be
/// `http://<that host>` (403).
fn same_loopback_origin(req: &Request) -> Result<(), Problem> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))
        .unwrap_or_default();
    if !is_loopback_host(&host) {
        return Err(Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this server runs without authentication and answers only requests for a loopback host (localhost, 127.0.0.1, [::1]), not Host `{}`",
                host.escape_debug()
            ),
        ));
    }
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if let Some(origin) = req.headers().get(header::ORIGIN)
        && !safe
    {
        let origin = origin.to_str().unwrap_or("(not text)");
        let same = origin
            .strip_prefix("http://")
            .is_some_and(|o| o.eq_ignore_ascii_case(&host));
        if !same {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                format!(
                    "a {} from Origin `{}` is refused: this server runs without authentication and accepts changes only from its own pages (http://{host}) or clients that send no Origin",
                    req.method(),
                    origin.escape_debug()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `host` (a `Host` header: name or address, optional port) is loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let port_ok = |p: &str| p.is_empty() || p.strip_prefix(':').is_some_and(is_port);
    if let Some(rest) = host.strip_prefix('[') {
        let Some((addr, port)) = rest.split_once(']') else {
            return false;
        };
        return addr.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback()) && port_ok(port);
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<Ipv4Addr>()
            .is_ok_and(|a| IpAddr::V4(a).is_loopback())
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// The middleware of the metrics router: when `[api] metrics_token` names a token,
/// `/metrics` needs that token only (401 without a known token, 403 for another one;
/// failures throttled and counted like the API's). `/healthz` stays open: load
/// balancers probe it without credentials, and it tells only up or down.
pub async fn metrics(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(want) = app.metrics_token.as_deref() else {
        return next.run(req).await;
    };
    if req.uri().path() != "/metrics" {
        return next.run(req).await;
    }
    match authenticate(&app, req.headers(), req.extensions(), "metrics") {
        Ok(caller) if caller.name == want => next.run(req).await,
        Ok(caller) => Problem::new(
            StatusCode::FORBIDDEN,
            format!(
                "/metrics is for token `{want}` ([api] metrics_token), not `{}`",
                caller.name
            ),
        )
        .into_response(),
        Err(p) => p.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "LocalHost:8080",
            "127.0.0.1",
            "127.0.0.1:1",
            "127.9.8.7:65535",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "",
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "[::2]:80",
            "[::1",
            "127.0.0.1:",
            "127.0.0.1:80x",
            "localhost:123456",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn text_is_percent_decoded_before_the_check() {
        assert!(check_text("path", "/api/v1/runs/r-1").is_ok());
        assert!(check_text("query", "workflow=a%20b&x=%E2%9C%93").is_ok());
        assert!(check_text("path", "/api/v1/runs/100%").is_ok(), "a stray %");
        for bad in ["/runs/%00", "a=%0a", "a=%7F", "a=%C2%85", "a=%FF", "x\u{1}"] {
            let p = check_text("query", bad).err().map(|p| p.status);
            assert_eq!(p, Some(StatusCode::BAD_REQUEST), "{bad}");
        }
    }
}

//! One HTTP request per call, through a shared connection pool.
//!
//! # What is sent
//! - `method` to `url` with `query` pairs appended and `headers` set;
//! - a JSON body: [`Spec::body`] when set, else `Call::args` for methods other than
//!   GET, HEAD and OPTIONS (unless the args are `null`);
//! - `Idempotency-Key: <Call::idempotency_key>` (header name configurable through
//!   [`Spec::idempotency_header`]) on every request except GET, HEAD and OPTIONS, so a
//!   downstream that deduplicates can recognise a re-sent effect attempt;
//! - always under `Call::timeout`, which bounds connecting, sending and reading the
//!   whole response. Connecting alone is also bounded by 10 s.
//!
//! # How the answer is classified
//! | what happened | result | `requests_sent` |
//! |---|---|---|
//! | 2xx | the body: JSON when it parses, else the text as is; empty → `null` | 1 |
//! | 408, 425, 429, 5xx | `Transient`, `retry_after` from `Retry-After` (seconds or HTTP date) | 1 |
//! | other 4xx | `Permanent` with the status and the start of the body | 1 |
//! | 3xx, redirects off (the default) | `Permanent` naming the `Location` | 1 |
//! | 3xx, `follow_redirects: true` | followed (at most 10 hops; 301/302/303 turn into GET without body; credentials dropped across origins) | one per hop |
//! | 3xx to a host outside [`Spec::allow_hosts`], or to a non-HTTP(S) URL | `Permanent` naming the host; the hop is not sent | the hops sent before |
//! | connect refused, DNS failure, TLS handshake failure | tried once more at once; then `NotSent` | requests that left (0 when both failed) |
//! | timeout, or connection lost, after the request was written | `Unknown` | 1 |
//! | 2xx body larger than [`Spec::max_response_bytes`] | `Permanent` naming the cap: the downstream did answer, and the same request would produce the same body again | 1 |
//!
//! # Side effect class
//! [`Spec::read_only`] when set; otherwise GET, HEAD and OPTIONS are `ReadOnly`; a spec
//! with [`Spec::idempotent_header`] (workflow `idempotency: header`) is
//! `IdempotentHeader`; anything else is `None`.

pub(crate) mod classify;
mod exchange;

pub use exchange::Exchange;

use std::time::Duration;

use reqwest::header::{
    AUTHORIZATION, COOKIE, HeaderMap, HeaderName, HeaderValue, LOCATION, PROXY_AUTHORIZATION,
};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;
use tokio::time::Instant;

use crate::egress::AllowList;
use crate::error::head;
use crate::{BoxFuture, Call, Error, Outcome, SideEffect, Tool};
use classify::{Failure, status_kind, transport};

/// The header that carries `Call::idempotency_key` unless a spec names another.
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Default cap on a response body.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Bound on establishing a connection, so a black-holed host fails as `NotSent`
/// (connect error) rather than `Unknown` (overall timeout) when the call's timeout is longer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Redirect hops followed at most when a spec opts in.
const MAX_REDIRECTS: usize = 10;

/// How much of an error body goes into the message.
const ERROR_BODY_SNIPPET: usize = 512;

/// A shared HTTP client: one connection pool (rustls) for every HTTP tool of a process.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    inner: crate::lazy_client::LazyClient,
}

impl Client {
    /// The pool, built at the first request (see `lazy_client`). Redirects are never
    /// followed by reqwest itself: the tool follows them when asked, so that every hop
    /// is counted in `requests_sent`.
    pub fn new() -> Result<Self, Error> {
        let inner = crate::lazy_client::LazyClient::new("HTTP", || {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(CONNECT_TIMEOUT)
                .user_agent(concat!("flow/", env!("CARGO_PKG_VERSION")))
        });
        Ok(Client { inner })
    }

    /// Builds the pool now if no request has (so its cost falls before a call's outbound
    /// mark, not between the mark and the send).
    pub fn warm(&self) -> Result<(), Error> {
        self.inner.get().map(|_| ())
    }

    /// A tool performing `spec` through this pool.
    pub fn tool(&self, spec: Spec) -> HttpTool {
        HttpTool {
            client: self.clone(),
            spec,
        }
    }
}

/// An HTTP tool as declared by a workflow, with values already rendered.
#[derive(Clone, PartialEq)]
pub struct Spec {
    /// HTTP method, case-insensitive (`GET`, `post`…).
    pub method: String,
    /// Absolute `http` or `https` URL.
    pub url: String,
    /// Request headers, in order (values may carry secrets; never logged).
    pub headers: Vec<(String, String)>,
    /// Query pairs appended to the URL.
    pub query: Vec<(String, String)>,
    /// JSON body; when `None`, `Call::args` is the body of non-GET/HEAD/OPTIONS requests.
    pub body: Option<Value>,
    /// Header carrying the idempotency key; [`DEFAULT_IDEMPOTENCY_HEADER`] when `None`.
    pub idempotency_header: Option<String>,
    /// Follow 3xx answers (off by default: a redirect is usually a misconfigured URL).
    pub follow_redirects: bool,
    /// Cap on the response body.
    pub max_response_bytes: usize,
    /// Overrides the method-based read-only class.
    pub read_only: Option<bool>,
    /// The downstream deduplicates on the idempotency key (`idempotency: header`).
    pub idempotent_header: bool,
    /// Hosts a redirect may lead to (the operator's egress allow-list); `None` allows
    /// any. The first URL is checked by the caller before the call is claimed; every
    /// later hop is checked here before it is sent.
    pub allow_hosts: Option<AllowList>,
}

impl Spec {
    /// A spec for `method url` with defaults for everything else.
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        Spec {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            query: Vec::new(),
            body: None,
            idempotency_header: None,
            follow_redirects: false,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            read_only: None,
            idempotent_header: false,
            allow_hosts: None,
        }
    }
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &crate::redact::Pairs(&self.headers))
            .field("query", &crate::redact::Pairs(&self.query))
            .field("body", &self.body.as_ref().map(|_| crate::redact::Hidden))
            .field("idempotency_header", &self.idempotency_header)
            .field("follow_redirects", &self.follow_redirects)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("read_only", &self.read_only)
            .field("idempotent_header", &self.idempotent_header)
            .field("allow_hosts", &self.allow_hosts)
            .finish()
    }
}

/// Performs one [`Spec`] per call.
#[derive(Debug, Clone)]
pub struct HttpTool {
    client: Client,
    spec: Spec,
}

/// Methods that read only, by RFC 9110's definition of safe methods that flow sends.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The first answer that is not a redirect, with what is needed to read it.
struct Answer {
    hop: Hop,
    response: reqwest::Response,
    deadline: Instant,
    sent: u32,
}

/// One hop of a request, rebuilt for every send.
struct Hop {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
}

impl Hop {
    /// `METHOD scheme://host[:port]/path` — no user info, no query (both may carry
    /// credentials), for error messages.
    fn describe(&self) -> String {
        let mut shown = self.url.clone();
        shown.set_query(None);
        shown.set_fragment(None);
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        format!("{} {}", self.method, shown)
    }
}

impl HttpTool {
    /// A tool performing `spec` through `client`'s pool.
    pub fn new(client: &Client, spec: Spec) -> Self {
        client.tool(spec)
    }

    /// The first hop, or a `Permanent` error when the spec cannot be sent at all.
    fn first_hop(&self, call: &Call) -> Result<Hop, Error> {
        let spec = &self.spec;
        let method = Method::from_bytes(spec.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| Error::permanent(format!("http: invalid method {:?}", spec.method)))?;
        let mut url = Url::parse(&spec.url)
            .map_err(|e| Error::permanent(format!("http: invalid url: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::permanent(format!(
                "http: unsupported url scheme `{}` (use http or https)",
                url.scheme()
            )));
        }
        if !spec.query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(spec.query.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &spec.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::permanent(format!("http: invalid header name {name:?}")))?;
            // The value may be a secret: name the header, never show the value.
            let value = HeaderValue::from_str(value).map_err(|_| {
                Error::permanent(format!("http: invalid value for header `{name}`"))
            })?;
            headers.append(header, value);
        }
        if !is_safe(&method) {
            let name = spec
                .idempotency_header
                .as_deref()
                .unwrap_or(DEFAULT_IDEMPOTENCY_HEADER);
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::permanent(format!("http: invalid idempotency header name {name:?}"))
            })?;
            let value = HeaderValue::from_str(&call.idempotency_key).map_err(|_| {
                Error::permanent("http: the idempotency key is not a valid header value")
            })?;
            headers.insert(header, value);
        }
        trace_headers(&mut headers, call.trace.as_ref());
        let body = match (&spec.body, &call.args) {
            (Some(body), _) => Some(body),
            (None, Value::Null) => None,
            (None, args) if !is_safe(&method) => Some(args),
            (None, _) => None,
        };
        let body = match body {
            Some(value) => {
                if !headers.contains_key(reqwest::header::CONTENT_TYPE) {
                    headers.insert(
                        reqwest::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                }
                Some(
                    serde_json::to_vec(value)
                        .map_err(|e| Error::permanent(format!("http: {e}")))?,
                )
            }
            None => None,
        };
        Ok(Hop {
            method,
            url,
            headers,
            body,
        })
    }

    async fn run(&self, call: Call) -> Outcome {
        match self.final_response(&call).await {
            Ok(Answer {
                hop,
                response,
                deadline,
                sent,
            }) => {
                let status = response.status().as_u16();
                let mut outcome = self.finish(&hop, response, deadline, sent).await;
                outcome.http_status = Some(status);
                outcome
            }
            Err(outcome) => outcome,
        }
    }

    /// Sends the call and follows redirects as the spec allows, up to the first answer
    /// that is not a redirect; an error is the call's outcome already.
    async fn final_response(&self, call: &Call) -> Result<Answer, Outcome> {
        if call.timeout.is_zero() {
            return Err(Outcome::err(
                Error::permanent("http: the timeout must be positive"),
                0,
            ));
        }
        let deadline = Instant::now() + call.timeout;
        let mut hop = self
            .first_hop(call)
            .map_err(|error| Outcome::err(error, 0))?;
        let mut sent = 0_u32;
        for hops in 0..=MAX_REDIRECTS {
            let response = match self.send(&hop, deadline, &call.fence, &mut sent).await {
                Ok(response) => response,
                Err(error) => return Err(Outcome::err(error, sent)),
            };
            let status = response.status();
            if !status.is_redirection() {
                return Ok(Answer {
                    hop,
                    response,
                    deadline,
                    sent,
                });
            }
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if !self.spec.follow_redirects {
                let to = location.as_deref().unwrap_or("<no Location>");
                let message = format!(
                    "{}: answered HTTP {status} redirecting to {to}; redirects are not followed unless the tool sets follow_redirects",
                    hop.describe()
                );
                return Err(Outcome::err(Error::permanent(message), sent));
            }
            let Some(next) = location.and_then(|l| hop.url.join(&l).ok()) else {
                let message = format!(
                    "{}: HTTP {status} without a usable Location",
                    hop.describe()
                );
                return Err(Outcome::err(Error::permanent(message), sent));
            };
            if hops == MAX_REDIRECTS {
                break;
            }
            if let Err(why) = self.may_follow(&next) {
                let message = format!(
                    "{}: answered HTTP {status} redirecting to {next}; not followed: {why}",
                    hop.describe()
                );
                return Err(Outcome::err(Error::permanent(message), sent));
            }
            hop = redirect(hop, status, next);
        }
        let message = format!("{}: more than {MAX_REDIRECTS} redirects", hop.describe());
        Err(Outcome::err(Error::permanent(message), sent))
    }

    /// Whether a redirect to `next` may be followed: HTTP(S) only, and to a host the
    /// allow-list admits (the same rule as the first URL's).
    fn may_follow(&self, next: &Url) -> Result<(), String> {
        if !matches!(next.scheme(), "http" | "https") {
            return Err(format!("scheme `{}` is not http or https", next.scheme()));
        }
        let host = next.host_str().unwrap_or_default();
        match &self.spec.allow_hosts {
            Some(list) if !list.allows(host) => Err(format!(
                "egress to `{host}` is not allowed by `egress.allow` in flow.toml"
            )),
            _ => Ok(()),
        }
    }

    /// Sends one hop; a connect failure is retried once at once (it provably never
    /// left). `sent` counts the requests that did leave.
    ///
    /// `fence` is checked immediately before each try (the connect retry and every
    /// redirect hop included), and a try still connecting or waiting when it closes is
    /// dropped: a worker paused past its lease, or cut off from the ledger, does not send
    /// when it wakes.
    async fn send(
        &self,
        hop: &Hop,
        deadline: Instant,
        fence: &crate::Fence,
        sent: &mut u32,
    ) -> Result<reqwest::Response, Error> {
        let what = hop.describe();
        let mut last_connect_error = None;
        for _ in 0..2 {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            if let Err(why) = fence.check() {
                return Err(Error::fenced(why, &what, *sent));
            }
            let mut request = self
                .client
                .inner
                .get()?
                .request(hop.method.clone(), hop.url.clone())
                .headers(hop.headers.clone())
                .timeout(remaining);
            if let Some(body) = &hop.body {
                request = request.body(body.clone());
            }
            // The fence first: a process woken after a pause gives the request up before
            // it polls the connection that may have completed meanwhile.
            let answer = match fence.race(request.send()).await {
                Ok(answer) => answer,
                Err(why) => {
                    *sent += 1;
                    return Err(Error::fenced_in_flight(why, &what));
                }
            };
            match answer {
                Ok(response) => {
                    *sent += 1;
                    return Ok(response);
                }
                Err(error) => match transport(&error, &what) {
                    Failure::Connect(error) => last_connect_error = Some(error),
                    Failure::Invalid(error) => return Err(error),
                    Failure::Sent(error) => {
                        *sent += 1;
                        return Err(error);
                    }
                },
            }
        }
        Err(last_connect_error.unwrap_or_else(|| {
            Error::not_sent(format!(
                "{what}: the timeout expired before the request could be sent"
            ))
        }))
    }

    /// Reads and classifies a final (non-3xx) answer.
    async fn finish(
        &self,
        hop: &Hop,
        mut response: reqwest::Response,
        deadline: Instant,
        sent: u32,
    ) -> Outcome {
        let status = response.status();
        let what = hop.describe();
        if status.is_success() {
            let cap = self.spec.max_response_bytes;
            let read = tokio::time::timeout_at(deadline, read_capped(&mut response, cap)).await;
            return match read {
                Ok(Ok(body)) => Outcome::ok(parse_body(&body), sent),
                Ok(Err(ReadError::TooLarge)) => {
                    let message = format!(
                        "{what}: HTTP {status} with a body over the {cap}-byte cap (max_response_bytes); the downstream did process the request"
                    );
                    Outcome::err(Error::permanent(message), sent)
                }
                Ok(Err(ReadError::Transport(error))) => {
                    let error = match transport(&error, &what) {
                        Failure::Connect(error)
                        | Failure::Invalid(error)
                        | Failure::Sent(error) => error,
                    };
                    let message =
                        format!("{} (while reading the HTTP {status} body)", error.message);
                    Outcome::err(Error::unknown(message), sent)
                }
                Err(_) => {
                    let message = format!(
                        "{what}: timed out reading the HTTP {status} body; the downstream may have processed the request"
                    );
                    Outcome::err(Error::unknown(message), sent)
                }
            };
        }
        let kind = status_kind(status, response.headers());
        let snippet =
            tokio::time::timeout_at(deadline, read_prefix(&mut response, ERROR_BODY_SNIPPET))
                .await
                .map(|body| head(&body, ERROR_BODY_SNIPPET))
                .unwrap_or_default();
        let mut message = format!("{what}: HTTP {status}");
        if !snippet.is_empty() {
            message.push_str(": ");
            message.push_str(&snippet);
        }
        Outcome::err(Error::new(kind, message), sent)
    }
}

impl Tool for HttpTool {
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.run(call))
    }

    fn side_effect(&self) -> SideEffect {
        let safe = Method::from_bytes(self.spec.method.to_ascii_uppercase().as_bytes())
            .map(|m| is_safe(&m))
            .unwrap_or(false);
        match self.spec.read_only {
            Some(true) => SideEffect::ReadOnly,
            None if safe => SideEffect::ReadOnly,
            _ if self.spec.idempotent_header => SideEffect::IdempotentHeader,
            _ => SideEffect::NotIdempotent,
        }
    }
}

/// The next hop after a 3xx: 301/302/303 turn a non-GET/HEAD into a bodyless GET (as
/// browsers and curl do); 307/308 keep method and body. Credentials are dropped when
/// the origin changes, so a redirect cannot leak them to another host.
fn redirect(mut hop: Hop, status: StatusCode, next: Url) -> Hop {
    let rewrite =
        matches!(status.as_u16(), 301..=303) && !matches!(hop.method, Method::GET | Method::HEAD);
    if rewrite {
        hop.method = Method::GET;
        hop.body = None;
        hop.headers.remove(reqwest::header::CONTENT_TYPE);
    }
    if next.origin() != hop.url.origin() {
        for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
            hop.headers.remove(name);
        }
    }
    hop.url = next;
    hop
}

enum ReadError {
    TooLarge,
    Transport(reqwest::Error),
}

/// Reads the body up to `cap` bytes (refusing early on a larger `Content-Length`).
async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Transport)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The first `max` bytes of the body (a little more is fine: [`head`] cuts), ignoring
/// read errors — this only decorates an error message.
async fn read_prefix(response: &mut reqwest::Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() <= max {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body
}

/// A 2xx body as output: JSON when it parses, else text; empty is `null`.
fn parse_body(body: &[u8]) -> Value {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Value::Null;
    }
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// W3C `traceparent` / `tracestate` for the call's trace, unless the tool's spec sets
/// its own (the workflow's headers win). A context that is not a valid header value is
/// left out: a trace never stops a call.
fn trace_headers(headers: &mut HeaderMap, trace: Option<&crate::TraceContext>) {
    let Some(trace) = trace else { return };
    let pairs = [
        ("traceparent", Some(&trace.parent)),
        ("tracestate", trace.state.as_ref()),
    ];
    for (name, value) in pairs {
        let Some(value) = value else { continue };
        if headers.contains_key(name) {
            continue;
        }
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

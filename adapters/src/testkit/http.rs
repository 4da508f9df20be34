//! An HTTP server that counts what arrives, per `Idempotency-Key`, and misbehaves on
//! request.
//!
//! Every request to a path other than `/_control/…` is recorded when its head and body
//! have **arrived** — before any hold or failure — and again as **completed** once its
//! response was fully produced. A crash test can therefore resolve an in-doubt call
//! from the downstream's own record ("arrived and completed → it succeeded").
//!
//! Behaviour is set per path (exact match; `*` for every other path) with
//! [`CountingServer::set`], or from another process with
//! `POST /_control/set {"path": "/x", "behavior": {"type": "status", "status": 503}}`.
//! Other control endpoints: `POST /_control/release` (release held requests),
//! `POST /_control/reset` (forget counts and behaviours), `GET /_control/state`
//! (`{"total", "counts": {key: n}, "completed": {key: n}, "log": [...]}`), and
//! `GET /_control/effects/{key}` (200 when requests with that key arrived, else 404: what
//! a reconciliation probe asks).
//!
//! [`Behavior::EchoBody`] sends the request body back in a chosen [`EchoEncoding`].
//!
//! The default behaviour, [`Behavior::Echo`], answers 200 with
//! `{"key", "count", "method", "path", "query", "body", "headers"}` where `count` is
//! the number of requests seen with that key (or on that path, for requests without a
//! key).

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

/// What the server does with requests to one path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Behavior {
    /// 200 with the echo document (the default).
    Echo,
    /// A fixed JSON answer.
    Json {
        /// HTTP status (default 200).
        #[serde(default = "ok_status")]
        status: u16,
        /// The body.
        body: Value,
    },
    /// A fixed text answer (`text/plain`).
    Text {
        /// HTTP status (default 200).
        #[serde(default = "ok_status")]
        status: u16,
        /// The body.
        body: String,
    },
    /// An error status, optionally with `Retry-After`.
    Status {
        /// HTTP status.
        status: u16,
        /// `Retry-After` value, sent as is (seconds or an HTTP date).
        #[serde(default)]
        retry_after: Option<String>,
        /// Body text.
        #[serde(default)]
        body: Option<String>,
    },
    /// The first `times` requests to the path get `status`, later ones the echo.
    FailTimes {
        /// How many requests fail.
        times: u32,
        /// Their status.
        status: u16,
    },
    /// Answers the echo after `ms` milliseconds.
    Hold {
        /// Delay.
        ms: u64,
    },
    /// Answers the echo once [`CountingServer::release`] (or `/_control/release`) is called.
    HoldUntilReleased,
    /// Sends 200 headers and part of a body, then closes the connection.
    DropMidResponse,
    /// Sends the echo document in `chunks` pieces, `interval_ms` apart.
    Slow {
        /// Number of pieces.
        chunks: u32,
        /// Delay before each piece.
        interval_ms: u64,
    },
    /// A redirect to `to`.
    Redirect {
        /// The `Location`.
        to: String,
        /// 301, 302, 303, 307 or 308 (default 302).
        #[serde(default = "found_status")]
        status: u16,
    },
    /// 200 with a body of `bytes` bytes (`x` repeated, `text/plain`).
    Big {
        /// Body size.
        bytes: usize,
    },
    /// Answers `status` with the request body sent back in `encoding`, the way a
    /// downstream quotes what it got in an error or a result: the secrets tests check
    /// that no form of an echoed value reaches flow's ledger or logs.
    EchoBody {
        /// HTTP status (default 200).
        #[serde(default = "ok_status")]
        status: u16,
        /// How the body is sent back.
        encoding: EchoEncoding,
    },
}

/// How [`Behavior::EchoBody`] encodes the request body it sends back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EchoEncoding {
    /// The bytes as they came (`text/plain`).
    Raw,
    /// `{"echo": "<body as one JSON string>"}`: the body's own escapes are escaped again.
    Json,
    /// `application/x-www-form-urlencoded` style: `+` for space, upper-case `%XX`.
    Url,
    /// RFC 3986 style: `%20` for space, lower-case `%xx`.
    UrlLower,
    /// HTML text: `&amp;`, `&lt;`, `&gt;`, `&quot;`, `&#39;`.
    Html,
    /// Standard base64 with padding.
    Base64,
}

impl EchoEncoding {
    /// Every encoding, for test matrices.
    pub const ALL: [EchoEncoding; 6] = [
        EchoEncoding::Raw,
        EchoEncoding::Json,
        EchoEncoding::Url,
        EchoEncoding::UrlLower,
        EchoEncoding::Html,
        EchoEncoding::Base64,
    ];

    /// The name used in paths and JSON (`url_lower`).
    pub fn name(self) -> &'static str {
        match self {
            EchoEncoding::Raw => "raw",
            EchoEncoding::Json => "json",
            EchoEncoding::Url => "url",
            EchoEncoding::UrlLower => "url_lower",
            EchoEncoding::Html => "html",
            EchoEncoding::Base64 => "base64",
        }
    }

    /// `body` encoded, and the content type to send it with.
    pub fn encode(self, body: &[u8]) -> (String, &'static str) {
        use base64::Engine as _;
        let text = String::from_utf8_lossy(body);
        match self {
            EchoEncoding::Raw => (text.into_owned(), "text/plain"),
            EchoEncoding::Json => (json!({ "echo": text }).to_string(), "application/json"),
            EchoEncoding::Url => (percent_encode(body, true), "text/plain"),
            EchoEncoding::UrlLower => (percent_encode(body, false), "text/plain"),
            EchoEncoding::Html => {
                let mut out = String::with_capacity(text.len());
                for c in text.chars() {
                    match c {
                        '&' => out.push_str("&amp;"),
                        '<' => out.push_str("&lt;"),
                        '>' => out.push_str("&gt;"),
                        '"' => out.push_str("&quot;"),
                        '\'' => out.push_str("&#39;"),
                        c => out.push(c),
                    }
                }
                (out, "text/html")
            }
            EchoEncoding::Base64 => (
                base64::engine::general_purpose::STANDARD.encode(body),
                "text/plain",
            ),
        }
    }
}

/// Percent-encodes every byte but RFC 3986's unreserved ones; `form` selects `+` for
/// space and upper-case hex, else `%20` and lower-case hex.
fn percent_encode(bytes: &[u8], form: bool) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b));
            }
            b' ' if form => out.push('+'),
            _ if form => out.push_str(&format!("%{b:02X}")),
            _ => out.push_str(&format!("%{b:02x}")),
        }
    }
    out
}

fn ok_status() -> u16 {
    200
}

fn found_status() -> u16 {
    302
}

impl Behavior {
    /// `Status` without `Retry-After`.
    pub fn status(status: u16) -> Self {
        Behavior::Status {
            status,
            retry_after: None,
            body: None,
        }
    }

    /// `Status` with a `Retry-After` value.
    pub fn status_retry_after(status: u16, retry_after: impl Into<String>) -> Self {
        Behavior::Status {
            status,
            retry_after: Some(retry_after.into()),
            body: None,
        }
    }

    /// `Hold` for `delay`.
    pub fn hold(delay: Duration) -> Self {
        Behavior::Hold {
            ms: delay.as_millis() as u64,
        }
    }
}

/// One request as it arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Arrival order, from 1.
    pub seq: u64,
    /// HTTP method.
    pub method: String,
    /// Path, without query.
    pub path: String,
    /// Query string, if any.
    pub query: Option<String>,
    /// The `Idempotency-Key` header, if any.
    pub key: Option<String>,
    /// The body: JSON when it parses, else text, `null` when empty.
    pub body: Value,
    /// All headers, names lower-case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// When it arrived, ms since the Unix epoch (the rate tests bucket by it).
    #[serde(default)]
    pub at_ms: u64,
}

impl RequestRecord {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Record {
    behaviors: HashMap<String, Behavior>,
    failures: HashMap<String, u32>,
    counts: HashMap<String, u32>,
    path_counts: HashMap<String, u32>,
    completed: HashMap<String, u32>,
    completed_total: u32,
    log: Vec<RequestRecord>,
}

struct Shared {
    record: Mutex<Record>,
    released: watch::Sender<u64>,
    log_file: Option<Mutex<std::fs::File>>,
    /// Requests being handled now, and the most there ever were at once.
    in_flight: std::sync::atomic::AtomicU32,
    max_in_flight: std::sync::atomic::AtomicU32,
}

/// Counts one request in flight until dropped (a client that hangs up is dropped too).
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.in_flight.fetch_add(1, SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, SeqCst);
        Self(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one line to the log file and fsyncs it, so the record survives a crash.
    fn append(&self, line: Value) {
        if let Some(file) = &self.log_file {
            let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(file, "{line}");
            let _ = file.sync_data();
        }
    }

    fn complete(&self, seq: u64, key: Option<&str>) {
        {
            let mut record = self.lock();
            record.completed_total += 1;
            if let Some(key) = key {
                *record.completed.entry(key.to_string()).or_default() += 1;
            }
        }
        self.append(json!({"event": "completed", "seq": seq, "key": key}));
    }
}

/// The counting server, listening on loopback until dropped.
pub struct CountingServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    running: super::Running,
}

impl CountingServer {
    /// Starts on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<CountingServer> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), None).await
    }

    /// Starts on `addr`, appending arrivals and completions to `log_file` if given.
    pub async fn start_on(
        addr: SocketAddr,
        log_file: Option<&Path>,
    ) -> std::io::Result<CountingServer> {
        let log_file = match log_file {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        let (released, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            record: Mutex::new(Record::default()),
            released,
            log_file,
            in_flight: Default::default(),
            max_in_flight: Default::default(),
        });
        let router = Router::new()
            .route("/_control/set", post(control_set))
            .route("/_control/release", post(control_release))
            .route("/_control/reset", post(control_reset))
            .route("/_control/state", get(control_state))
            .route("/_control/effects/{key}", get(control_effect))
            .fallback(handle)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let running = super::Running::serve(listener, router, None);
        Ok(CountingServer {
            addr,
            shared,
            running,
        })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets what requests to `path` get (`*` matches paths without their own behaviour).
    pub fn set(&self, path: &str, behavior: Behavior) {
        let mut record = self.shared.lock();
        record.failures.remove(path);
        record.behaviors.insert(path.to_string(), behavior);
    }

    /// Releases every request held by [`Behavior::HoldUntilReleased`] so far.
    pub fn release(&self) {
        self.shared.released.send_modify(|n| *n += 1);
    }

    /// Requests that arrived with this `Idempotency-Key`.
    pub fn count(&self, key: &str) -> u32 {
        self.shared.lock().counts.get(key).copied().unwrap_or(0)
    }

    /// Requests with this key whose response was fully produced.
    pub fn completed(&self, key: &str) -> u32 {
        self.shared.lock().completed.get(key).copied().unwrap_or(0)
    }

    /// The most requests that were ever being handled at once (control requests
    /// excluded): what a concurrency limit is checked against.
    pub fn max_in_flight(&self) -> u32 {
        self.shared.max_in_flight.load(SeqCst)
    }

    /// Requests that arrived, control requests excluded.
    pub fn total(&self) -> u32 {
        self.shared.lock().log.len() as u32
    }

    /// Requests whose response was fully produced.
    pub fn completed_total(&self) -> u32 {
        self.shared.lock().completed_total
    }

    /// Every arrived request, in order.
    pub fn log(&self) -> Vec<RequestRecord> {
        self.shared.lock().log.clone()
    }
}

impl CountingServer {
    /// Stops listening and closes idle connections, as a stopped server process would,
    /// and waits for requests in progress (held ones are released first). Dropping the
    /// server does the same without waiting.
    pub async fn shutdown(self) {
        self.release();
        self.running.shutdown().await;
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let path = uri.path().to_string();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body_value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    let header_pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    // Subscribe before recording, so a release racing this arrival is not missed.
    let mut released = shared.released.subscribe();
    let released_before = *released.borrow_and_update();
    let record = RequestRecord {
        seq: 0,
        method: method.to_string(),
        path,
        query: uri.query().map(str::to_string),
        key,
        body: body_value,
        headers: header_pairs,
        at_ms: std::time::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_millis() as u64),
    };
    let (record, count, behavior, fail) = arrive(&shared, record);
    shared.append(json!({
        "event": "arrived", "seq": record.seq, "method": record.method, "path": record.path,
        "key": record.key, "body": record.body,
    }));
    let echo = json!({
        "key": record.key, "count": count, "method": record.method, "path": record.path,
        "query": record.query, "body": record.body,
        "headers": record.headers.iter().map(|(n, v)| (n.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
    });
    let seq = record.seq;
    let response = match behavior {
        Behavior::Echo => axum::Json(echo).into_response(),
        Behavior::Json { status, body } => (code(status), axum::Json(body)).into_response(),
        Behavior::Text { status, body } => (code(status), body).into_response(),
        Behavior::Status {
            status,
            retry_after,
            body,
        } => {
            let mut response = (code(status), body.unwrap_or_default()).into_response();
            if let Some(value) = retry_after.and_then(|v| v.parse().ok()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        Behavior::FailTimes { status, .. } if fail => {
            (code(status), format!("failing on purpose ({status})")).into_response()
        }
        Behavior::FailTimes { .. } => axum::Json(echo).into_response(),
        Behavior::Hold { ms } => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            axum::Json(echo).into_response()
        }
        Behavior::HoldUntilReleased => {
            while *released.borrow_and_update() == released_before {
                if released.changed().await.is_err() {
                    break;
                }
            }
            axum::Json(echo).into_response()
        }
        Behavior::DropMidResponse => return drop_mid_response(),
        Behavior::Slow {
            chunks,
            interval_ms,
        } => return slow_echo(&shared, &echo, chunks, interval_ms, seq, record.key.clone()),
        Behavior::Redirect { to, status } => {
            let mut response = code(status).into_response();
            if let Ok(value) = to.parse() {
                response.headers_mut().insert(header::LOCATION, value);
            }
            response
        }
        Behavior::Big { bytes } => {
            ([(header::CONTENT_TYPE, "text/plain")], vec![b'x'; bytes]).into_response()
        }
        Behavior::EchoBody { status, encoding } => {
            let (text, content_type) = encoding.encode(&body);
            (code(status), [(header::CONTENT_TYPE, content_type)], text).into_response()
        }
    };
    shared.complete(seq, record.key.as_deref());
    response
}

/// Counts and logs one arrival under the lock and picks its behaviour: the record (its
/// `seq` given here), the count echoed back (per key, or per path without one), the
/// behaviour, and whether a `FailTimes` fails this time.
fn arrive(shared: &Shared, mut record: RequestRecord) -> (RequestRecord, u32, Behavior, bool) {
    let mut state = shared.lock();
    let count = match &record.key {
        Some(key) => {
            let n = state.counts.entry(key.clone()).or_default();
            *n += 1;
            *n
        }
        None => 0,
    };
    let path_count = {
        let n = state.path_counts.entry(record.path.clone()).or_default();
        *n += 1;
        *n
    };
    record.seq = state.log.len() as u64 + 1;
    state.log.push(record.clone());
    let behavior = state
        .behaviors
        .get(&record.path)
        .or_else(|| state.behaviors.get("*"))
        .cloned()
        .unwrap_or(Behavior::Echo);
    let fail = match &behavior {
        Behavior::FailTimes { times, .. } => {
            let failed = state.failures.entry(record.path.clone()).or_default();
            *failed += 1;
            *failed <= *times
        }
        _ => false,
    };
    let count = if record.key.is_some() {
        count
    } else {
        path_count
    };
    (record, count, behavior, fail)
}

/// A response whose body breaks off after a few bytes: the connection errors mid-body.
fn drop_mid_response() -> Response {
    let stream = futures::stream::unfold(0_u8, |step| async move {
        match step {
            0 => Some((Ok(Bytes::from_static(b"{\"partial\": ")), 1)),
            1 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Err(std::io::Error::other("dropped on purpose")), 2))
            }
            _ => None,
        }
    });
    (StatusCode::OK, Body::from_stream(stream)).into_response()
}

/// The echo sent in `chunks` pieces, `interval_ms` apart; the request counts as
/// completed only once the last piece is out.
fn slow_echo(
    shared: &Arc<Shared>,
    echo: &Value,
    chunks: u32,
    interval_ms: u64,
    seq: u64,
    key: Option<String>,
) -> Response {
    let text = echo.to_string().into_bytes();
    let chunks = chunks.max(1) as usize;
    let size = text.len().div_ceil(chunks).max(1);
    let pieces: Vec<Bytes> = text.chunks(size).map(Bytes::copy_from_slice).collect();
    let done = shared.clone();
    let stream = futures::stream::unfold(
        (pieces.into_iter(), Some((done, key))),
        move |(mut rest, mut done)| async move {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
            match rest.next() {
                Some(piece) => Some((Ok::<_, std::io::Error>(piece), (rest, done))),
                None => {
                    if let Some((shared, key)) = done.take() {
                        shared.complete(seq, key.as_deref());
                    }
                    None
                }
            }
        },
    );
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[derive(Deserialize)]
struct SetRequest {
    path: String,
    behavior: Behavior,
}

async fn control_set(
    State(shared): State<Arc<Shared>>,
    axum::Json(request): axum::Json<SetRequest>,
) -> StatusCode {
    let mut record = shared.lock();
    record.failures.remove(&request.path);
    record.behaviors.insert(request.path, request.behavior);
    StatusCode::NO_CONTENT
}

async fn control_release(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.released.send_modify(|n| *n += 1);
    StatusCode::NO_CONTENT
}

async fn control_reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    *shared.lock() = Record::default();
    StatusCode::NO_CONTENT
}

/// A reconciliation probe's answer: 200 `{"key", "count", "completed"}` when requests
/// with this `Idempotency-Key` arrived (the effect took place), 404 when none did.
async fn control_effect(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> Response {
    let record = shared.lock();
    match record.counts.get(&key) {
        Some(&count) if count > 0 => {
            let completed = record.completed.get(&key).copied().unwrap_or(0);
            axum::Json(json!({ "key": key, "count": count, "completed": completed }))
                .into_response()
        }
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({ "key": key }))).into_response(),
    }
}

async fn control_state(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    let record = shared.lock();
    axum::Json(json!({
        "total": record.log.len(),
        "counts": record.counts,
        "completed": record.completed,
        "completed_total": record.completed_total,
        "log": record.log,
    }))
}

pub use super::http_remote::{Remote, RemoteState};

/// Reads a `--log-file` written by `flow-testkit http`: one JSON value per line.
pub fn read_log_file(path: &Path) -> std::io::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

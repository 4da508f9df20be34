//! Errors of the operator API as RFC 9457 `application/problem+json`, and the body and
//! query extractors that turn axum's rejections into such problems (naming the field
//! at fault), so that no error leaves the server in any other shape.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value as Json, json};

/// One API error: an HTTP status, a one-line `detail` for humans, and extension
/// members (`errors`, `differs`, …) for programs.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, in one sentence.
    pub detail: String,
    /// Extension members, merged into the top-level object.
    pub extra: Map<String, Json>,
    /// Seconds for a `Retry-After` header (a 429 says when to come back).
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            extra: Map::new(),
            retry_after: None,
        }
    }

    /// 429: too many failed authentications from this address; come back in
    /// `retry_after` (rounded up to whole seconds, at least 1).
    pub fn too_many(retry_after: std::time::Duration) -> Self {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        let mut p = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many failed authentications from this address: try again in {} s",
                secs.max(1)
            ),
        );
        p.retry_after = Some(secs.max(1));
        p
    }

    /// Adds the extension member `key`.
    pub fn with(mut self, key: &str, value: Json) -> Self {
        self.extra.insert(key.to_string(), value);
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 404: no such thing.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    /// 409: the request conflicts with the current state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, detail)
    }

    /// The problem for a ledger error that the handler did not map itself, by its
    /// [`flow_ledger::ErrorClass`]: 400 bad input (an over-large value, a text the
    /// database cannot store), 404, 409 for state conflicts, 403 a read-only ledger, 503
    /// when the database cannot be used or its data cannot be trusted.
    pub fn ledger(e: &flow_ledger::Error) -> Self {
        use flow_ledger::ErrorClass as C;
        let status = match e.class() {
            C::BadInput => StatusCode::BAD_REQUEST,
            C::NotFound => StatusCode::NOT_FOUND,
            C::Conflict => StatusCode::CONFLICT,
            C::Forbidden => StatusCode::FORBIDDEN,
            C::Unavailable | C::Corrupt => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, e.to_string())
    }
}

/// The shape of every error body (RFC 9457), for the OpenAPI document: what
/// [`Problem`]'s response writes.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
#[schemars(title = "Problem", rename = "Problem")]
pub struct ProblemBody {
    /// Always `about:blank`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, in one sentence (names the field at fault).
    pub detail: String,
    /// 422: every diagnostic of the workflow, `FILE:LINE:COL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<Diagnostic>>,
    /// 409 of a submit: what differs from the existing run (`workflow` or `inputs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub differs: Option<String>,
    /// 409 of a submit: the run id that is taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// One diagnostic of a workflow that does not validate.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Diagnostic {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when known.
    pub help: Option<String>,
    /// The whole diagnostic as `flow validate` prints it.
    pub text: String,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("type".into(), json!("about:blank"));
        body.insert(
            "title".into(),
            json!(self.status.canonical_reason().unwrap_or("Error")),
        );
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra);
        let retry_after = self.retry_after;
        let mut resp = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            Json::Object(body).to_string(),
        )
            .into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 6750: a 401 names the scheme it wants.
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

/// A JSON body whose rejections (malformed JSON, unknown fields, wrong types, too
/// large, wrong content type) are problems; axum's message names the field's path.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(e) => Err(json_problem(&e)),
        }
    }
}

/// The problem for a rejected JSON body.
/// Data that does not fit the type (unknown field, wrong type) is a 400 like malformed
/// JSON, not axum's 422: 422 is kept for workflows that do not validate.
fn json_problem(e: &JsonRejection) -> Problem {
    let status = match e {
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
            StatusCode::BAD_REQUEST
        }
        other => other.status(),
    };
    Problem::new(status, e.body_text())
}

/// An optional JSON body (`cancel`, `resume`): empty is `T::default()`, anything else
/// must parse as [`ApiJson`] would.
#[derive(Debug)]
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| Problem::new(e.status(), e.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(e) => Err(json_problem(&e)),
        }
    }
}

/// A query string whose rejections are 400 problems naming the parameter.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Self(v)),
            Err(e) => Err(query_problem(&e)),
        }
    }
}

fn query_problem(e: &QueryRejection) -> Problem {
    Problem::bad_request(e.body_text())
}

//! A client of flow's own operator API (`flow serve`), for the CLI's client mode
//! (`flow submit/runs/show --server`). It lives here because this crate is where flow's
//! HTTP is: the engine names no HTTP library.
//!
//! Answers are JSON; an error answer (RFC 9457 `application/problem+json`) becomes
//! [`Error::Problem`] with the server's `title` and `detail`, so the CLI can print
//! what the server said and pick the exit code from the status.

use serde_json::Value as Json;

/// Why a request to the operator API did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server URL is not http(s).
    #[error("`{0}` is not an http:// or https:// URL")]
    BadUrl(String),
    /// A path segment (a run id) that a URL cannot carry as itself: empty, `.` or `..`
    /// would be normalized away and the request would reach another resource. Nothing
    /// was sent.
    #[error("`{0}` cannot be a URL path segment (it would be normalized away); nothing was sent")]
    BadSegment(String),
    /// No answer: connection refused, DNS, TLS, a timeout, a broken body.
    #[error("cannot reach the server at {base}: {reason}")]
    Unreachable {
        /// The server's base URL.
        base: String,
        /// What failed.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{title}: {detail}")]
    Problem {
        /// The HTTP status.
        status: u16,
        /// The problem's `title` (the status's reason when absent).
        title: String,
        /// The problem's `detail`.
        detail: String,
    },
}

/// A client of one server, with an optional bearer token.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: reqwest::Url,
    token: Option<String>,
}

impl ApiClient {
    /// A client of the server at `base` (`http://host:port`), sending `token` if any.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, Error> {
        let url = reqwest::Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| Error::BadUrl(base.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Unreachable {
                base: base.to_string(),
                reason: format!("cannot set up an HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            base: url,
            token,
        })
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        self.base.as_str()
    }

    /// Whether a token is sent.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The URL of `/api/v1/` + `segments` (each escaped) with `query`; refused for a
    /// segment that is empty, `.` or `..` (escaping does not protect those).
    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Result<reqwest::Url, Error> {
        if let Some(bad) = segments.iter().find(|s| matches!(**s, "" | "." | "..")) {
            return Err(Error::BadSegment((*bad).to_string()));
        }
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// `GET /api/v1/<segments>?<query>`.
    pub async fn get(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Json, Error> {
        self.send(self.http.get(self.url(segments, query)?)).await
    }

    /// `POST /api/v1/<segments>` with a JSON body.
    pub async fn post(&self, segments: &[&str], body: &Json) -> Result<Json, Error> {
        self.send(self.http.post(self.url(segments, &[])?).json(body))
            .await
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Json, Error> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t.trim()),
            None => req,
        };
        let unreachable = |e: reqwest::Error| Error::Unreachable {
            base: self.base.to_string(),
            reason: e.to_string(),
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let text = resp.text().await.map_err(unreachable)?;
        let body: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        if status.is_success() {
            return Ok(body);
        }
        let title = body["title"]
            .as_str()
            .or(status.canonical_reason())
            .unwrap_or("Error");
        Err(Error::Problem {
            status: status.as_u16(),
            title: title.to_string(),
            detail: body["detail"]
                .as_str()
                .unwrap_or("no detail given")
                .to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_refused_and_others_escaped() {
        let Ok(client) = ApiClient::new("http://127.0.0.1:1", None) else {
            panic!("client");
        };
        for bad in ["..", ".", ""] {
            assert!(
                matches!(client.url(&["runs", bad], &[]), Err(Error::BadSegment(_))),
                "{bad:?}"
            );
        }
        let url = client.url(&["runs", "a/..b"], &[]).map(|u| u.to_string());
        assert_eq!(
            url.ok().as_deref(),
            Some("http://127.0.0.1:1/api/v1/runs/a%2F..b")
        );
    }
}

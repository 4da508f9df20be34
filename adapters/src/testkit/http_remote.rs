//! [`Remote`]: a `CountingServer` (`super::http`) in another process, driven through its
//! control endpoints.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::http::{Behavior, RequestRecord};

/// A CountingServer in another process (`flow-testkit http`), driven through its
/// control endpoints.
#[derive(Debug, Clone)]
pub struct Remote {
    base: String,
    http: reqwest::Client,
}

/// The state of a remote server, as `GET /_control/state` reports it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RemoteState {
    /// Requests that arrived.
    pub total: u32,
    /// Arrivals per `Idempotency-Key`.
    pub counts: HashMap<String, u32>,
    /// Completions per `Idempotency-Key`.
    pub completed: HashMap<String, u32>,
    /// Completed responses.
    pub completed_total: u32,
    /// Every arrived request.
    pub log: Vec<RequestRecord>,
}

impl Remote {
    /// A handle on the server at `base` (`http://127.0.0.1:PORT`).
    pub fn new(base: impl Into<String>) -> Self {
        Remote {
            base: base.into().trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: Option<Value>) -> Result<(), reqwest::Error> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(10));
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send().await?.error_for_status()?;
        Ok(())
    }

    /// Sets what requests to `path` get.
    pub async fn set(&self, path: &str, behavior: &Behavior) -> Result<(), reqwest::Error> {
        self.post(
            "/_control/set",
            Some(json!({"path": path, "behavior": behavior})),
        )
        .await
    }

    /// Releases held requests.
    pub async fn release(&self) -> Result<(), reqwest::Error> {
        self.post("/_control/release", None).await
    }

    /// Forgets counts and behaviours.
    pub async fn reset(&self) -> Result<(), reqwest::Error> {
        self.post("/_control/reset", None).await
    }

    /// Counts and log.
    pub async fn state(&self) -> Result<RemoteState, reqwest::Error> {
        self.http
            .get(format!("{}/_control/state", self.base))
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }
}

//! A server's whole tool listing, for flow's MCP proxy: each tool's name, description,
//! schemas and annotations as the server declares them (the proxy offers them to an
//! agent under the server's prefix).

use std::time::Duration;

use rmcp::model::Tool;
use tokio::time::Instant;

use super::pool::Key;
use super::{Pool, Spec, classify};
use crate::Error;

impl Pool {
    /// Every tool `spec.server` lists (all pages), starting its session if needed,
    /// within `timeout`. Listing has no side effect: a failure is for the caller to
    /// report or try again.
    pub async fn list_tools(&self, spec: &Spec, timeout: Duration) -> Result<Vec<Tool>, Error> {
        let deadline = Instant::now() + timeout;
        let key: Key = (
            spec.server.clone(),
            spec.auth.clone(),
            spec.elicitation.clone(),
        );
        let session = self.session(&key, deadline).await?;
        let what = format!("{} listing tools", session.label);
        let listing = session.client.peer().list_all_tools();
        match tokio::time::timeout_at(deadline, listing).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => {
                let failure = classify::request_error(&e, &what);
                if failure.discard {
                    self.discard(&key, &session).await;
                }
                Err(failure.error)
            }
            Err(_) => Err(Error::transient(format!("{what}: timed out"), None)),
        }
    }
}

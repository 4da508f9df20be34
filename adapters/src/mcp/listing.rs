//! A server's tool listing: every tool's name, description, schemas and annotations as
//! the server declares them — read for annotations by each session once
//! (`Pool::annotations`), and whole for flow's MCP proxy (`Pool::list_tools`).

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::Tool;
use tokio::time::Instant;

use super::pool::{Key, Session};
use super::{Pool, Spec, classify};
use crate::Error;

impl Pool {
    /// Every tool `spec.server` lists (all pages), starting its session if needed,
    /// within `timeout`. Listing has no side effect: a failure is for the caller to
    /// report or try again.
    pub async fn list_tools(&self, spec: &Spec, timeout: Duration) -> Result<Vec<Tool>, Error> {
        let deadline = Instant::now() + timeout;
        let key = Self::key(spec);
        let session = self.session(&key, deadline).await?;
        self.list_on(&key, &session, deadline).await
    }

    /// `tools/list` (all pages) on `session` before `deadline`; a session the error
    /// shows unusable is discarded.
    pub(super) async fn list_on(
        &self,
        key: &Key,
        session: &Arc<Session>,
        deadline: Instant,
    ) -> Result<Vec<Tool>, Error> {
        let what = format!("{} listing tools", session.label);
        let listing = session.client.peer().list_all_tools();
        match tokio::time::timeout_at(deadline, listing).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => {
                let failure = classify::request_error(&e, &what);
                if failure.discard {
                    self.discard(key, session).await;
                }
                Err(failure.error)
            }
            // Listing has no side effect: a timeout is just "try later".
            Err(_) => Err(Error::transient(format!("{what}: timed out"), None)),
        }
    }
}

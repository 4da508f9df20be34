//! HTTP clients built on first use.
//!
//! Building a `reqwest::Client` loads the platform's root certificates: every file under
//! `/etc/ssl/certs` opened, read and PEM-decoded (~150 files; measured as most of the
//! system time and a tenth of the user time of a `flow run` of 100 pure nodes). A
//! process has several (HTTP tools, MCP sessions, connection refreshes, webhooks), and
//! a run of pure functions sends nothing: it should pay for none of them.

use std::sync::{Arc, OnceLock};

use crate::Error;

/// A `reqwest::Client` made by `build` the first time it is needed, then shared by every
/// clone. A build that fails is reported as *not sent* (nothing left the process) and
/// tried again at the next use: it may have failed for a passing reason (a process out
/// of file descriptors cannot read the certificates), and a remembered failure would
/// fail every call until a restart.
#[derive(Clone)]
pub(crate) struct LazyClient {
    cell: Arc<OnceLock<reqwest::Client>>,
    build: fn() -> reqwest::ClientBuilder,
    what: &'static str,
}

impl std::fmt::Debug for LazyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyClient")
            .field("what", &self.what)
            .field("built", &self.cell.get().is_some())
            .finish()
    }
}

impl LazyClient {
    /// A client `what` (named in errors) that `build` configures.
    pub(crate) fn new(what: &'static str, build: fn() -> reqwest::ClientBuilder) -> Self {
        LazyClient {
            cell: Arc::new(OnceLock::new()),
            build,
            what,
        }
    }

    /// The client, built now if no use has built it yet. (Two first uses at once may
    /// both build one; the first stored wins, the other is dropped.)
    pub(crate) fn get(&self) -> Result<&reqwest::Client, Error> {
        if let Some(client) = self.cell.get() {
            return Ok(client);
        }
        let built = (self.build)()
            .build()
            .map_err(|e| Error::not_sent(format!("cannot build the {} client: {e}", self.what)))?;
        Ok(self.cell.get_or_init(|| built))
    }
}

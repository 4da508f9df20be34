//! HTTP clients built on first use.
//!
//! Building a `reqwest::Client` loads the platform's root certificates: every file under
//! `/etc/ssl/certs` opened, read and PEM-decoded (~150 files; measured as most of the
//! system time and a tenth of the user time of a `flow run` of 100 pure nodes). A
//! process builds up to three (HTTP tools, MCP sessions, connection refreshes), and a
//! run of pure functions sends nothing: it should pay for none of them.

use std::sync::{Arc, OnceLock};

use crate::Error;

/// A `reqwest::Client` made by `build` the first time it is needed, then shared by every
/// clone. A build that fails is remembered (it would fail again) and reported as *not
/// sent*: nothing left the process.
#[derive(Clone)]
pub(crate) struct LazyClient {
    cell: Arc<OnceLock<Result<reqwest::Client, String>>>,
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

    /// The client, built now if this is the first use.
    pub(crate) fn get(&self) -> Result<&reqwest::Client, Error> {
        self.cell
            .get_or_init(|| (self.build)().build().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::not_sent(format!("cannot build the {} client: {e}", self.what)))
    }
}

//! The HTTP client a connection pool sends through, built on first use.
//!
//! Building a `reqwest::Client` loads the platform's root certificates (every PEM file
//! under the system's certificate directories, parsed and base64-decoded): measured with
//! callgrind, ~19M instructions per client, and a process built two (the HTTP tools' pool
//! and the MCP pool's) before anything else. That was 28% of the instructions of a
//! `flow run` whose workflow uses only in-process functions (benches/README.md, "W2"),
//! for clients it never used. Built lazily, a process pays for a client only when a tool
//! or a token request actually goes over HTTP; clones share the one built.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::Error;

/// Bound on establishing a connection, so a black-holed host fails as `NotSent`
/// (connect error) rather than `Unknown` (overall timeout) when the call's timeout is longer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A rustls client that never follows redirects, built the first time [`LazyClient::get`]
/// is called and shared by every clone. Cheap to clone.
#[derive(Clone)]
pub(crate) struct LazyClient {
    /// The client, or the reason it could not be built (kept: building again would fail
    /// the same way, and each caller reports it as its own failure).
    cell: Arc<OnceLock<Result<reqwest::Client, String>>>,
    /// What the client is for, in the error message ("HTTP", "MCP HTTP").
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
    /// A client for `what`, not built yet.
    pub(crate) fn new(what: &'static str) -> Self {
        Self {
            cell: Arc::new(OnceLock::new()),
            what,
        }
    }

    /// The client, built now if this is the first use. Redirects are never followed by
    /// reqwest itself: the tools follow them when asked, so that every hop is counted.
    /// An error is permanent: nothing was sent, and no retry can build it either.
    pub(crate) fn get(&self) -> Result<&reqwest::Client, Error> {
        let built = self.cell.get_or_init(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(CONNECT_TIMEOUT)
                .user_agent(concat!("flow/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| e.to_string())
        });
        built.as_ref().map_err(|e| {
            Error::permanent(format!("cannot build the {} client: {e}", self.what))
        })
    }
}

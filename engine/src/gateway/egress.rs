//! `[egress]`: which hosts a call may reach. `flow.toml` declares it (`crate::config`
//! reads and checks the patterns at their FILE:LINE:COL); the gateway enforces it on
//! every call before the claim, the HTTP adapter on every redirect hop, and a
//! connection's token requests obey it too — so it lives with the gateway that owns the
//! rule, not in the file reader.

use serde::Deserialize;

/// Which hosts `http` and `mcp` (URL) tools may reach.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// Allowed hosts; `*.example.com` matches subdomains. `None` (no `[egress]` table or
    /// no `allow` key) allows every host; an empty list allows none. Each pattern is
    /// checked when the file is loaded ([`HostPattern`](crate::host_pattern::HostPattern)), so a malformed one is refused
    /// at its FILE:LINE:COL instead of silently matching nothing.
    #[serde(skip)]
    pub allow: Option<Vec<String>>,
    /// `allow` as read, with each entry's position in the file.
    #[serde(default, rename = "allow")]
    pub(crate) allow_read: Option<Vec<toml::Spanned<String>>>,
}

impl Egress {
    /// Whether `host` may be reached.
    pub fn allows(&self, host: &str) -> bool {
        self.allow_list().is_none_or(|list| list.allows(host))
    }

    /// The list every hop of a request must pass (`None`: every host is allowed).
    pub fn allow_list(&self) -> Option<flow_adapters::egress::AllowList> {
        self.allow
            .as_ref()
            .map(|allow| flow_adapters::egress::AllowList::new(allow.iter().cloned()))
    }
}

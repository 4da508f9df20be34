//! What an API token may do. A role is written in `flow.toml` (`[[api.tokens]]`), read
//! by the API and the console to authorize each request, and named by approval rules
//! (`approvers.roles`): it sits below all three, so none of them reaches up into another
//! to learn it.

use serde::Deserialize;

/// What a token may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read runs, calls in doubt, events.
    Viewer,
    /// Also submit, cancel, resume and resolve.
    Operator,
    /// Also bulk operations.
    Admin,
}

impl Role {
    /// The name in `flow.toml` and in problems.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

//! Protocol version negotiation: which MCP revisions flow speaks and how it finds one
//! the server shares.
//!
//! flow first sends `initialize` asking for 2025-11-25, the newest revision with that
//! handshake: every deployed server answers it, with 2025-11-25 or an older revision it
//! prefers. A server that has dropped the handshake (2026-07-28 and later only) refuses
//! it with JSON-RPC `-32022` (unsupported protocol version); flow then starts a fresh
//! session with `server/discover` for 2026-07-28. Whatever the server settles on must be
//! one of [`SUPPORTED`], or the session is closed and the call fails permanently with a
//! message naming the server's version and flow's.

use rmcp::model::{ErrorCode, ProtocolVersion};
use rmcp::service::{ClientInitializeError, ClientLifecycleMode};

use crate::Error;

/// The revisions flow speaks, oldest first. 2025-03-26 (the first with streamable HTTP)
/// stays: servers still answer it, the conformance suite's own among them, and rmcp
/// speaks it; 2024-11-05 (HTTP+SSE only) does not.
pub(crate) const SUPPORTED: [ProtocolVersion; 4] = [
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// How a session is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handshake {
    /// `initialize` / `notifications/initialized`, asking for 2025-11-25.
    Initialize,
    /// `server/discover` and per-request metadata, for 2026-07-28.
    Discover,
}

impl Handshake {
    /// rmcp's lifecycle for this handshake.
    pub(crate) fn lifecycle(self) -> ClientLifecycleMode {
        match self {
            Handshake::Initialize => ClientLifecycleMode::Initialize,
            Handshake::Discover => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        }
    }

    /// The version asked for in `initialize`.
    pub(crate) fn requested(self) -> ProtocolVersion {
        match self {
            Handshake::Initialize => ProtocolVersion::V_2025_11_25,
            Handshake::Discover => ProtocolVersion::V_2026_07_28,
        }
    }

    /// The handshake to try next after `error`, if another one could succeed: a server
    /// refusing `initialize` for its version may speak the discover-era protocol.
    pub(crate) fn next_after(self, error: &ClientInitializeError) -> Option<Handshake> {
        match (self, error) {
            (Handshake::Initialize, ClientInitializeError::JsonRpcError(data))
                if data.code == ErrorCode::UNSUPPORTED_PROTOCOL_VERSION =>
            {
                Some(Handshake::Discover)
            }
            _ => None,
        }
    }
}

/// Flow's revisions for messages: `2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28`.
pub(crate) fn supported_list() -> String {
    SUPPORTED
        .iter()
        .map(ProtocolVersion::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `Ok` when the negotiated `version` is one flow speaks; else a permanent error naming
/// both sides.
pub(crate) fn check(version: &ProtocolVersion, label: &str) -> Result<(), Error> {
    if SUPPORTED.contains(version) {
        return Ok(());
    }
    Err(Error::permanent(format!(
        "{label}: the server speaks MCP protocol version {version}; flow supports {}",
        supported_list()
    )))
}

/// The permanent error for a discover answer that shares no version with flow.
pub(crate) fn no_common_version(server: &[ProtocolVersion], label: &str) -> Error {
    let server = server
        .iter()
        .map(ProtocolVersion::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    Error::permanent(format!(
        "{label}: the server speaks MCP protocol versions {server}; flow supports {}",
        supported_list()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_versions_name_both_sides() {
        assert!(check(&ProtocolVersion::V_2025_06_18, "s").is_ok());
        assert!(check(&ProtocolVersion::V_2026_07_28, "s").is_ok());
        let error = check(&ProtocolVersion::V_2024_11_05, "MCP server x").unwrap_err();
        assert_eq!(error.kind, crate::FailureKind::Permanent);
        assert!(error.message.contains("2024-11-05"), "{}", error.message);
        assert!(
            error
                .message
                .contains("2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28"),
            "{}",
            error.message
        );
    }
}

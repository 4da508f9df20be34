//! The one error type every adapter returns, with its retryability in the type.

use std::fmt;
use std::time::Duration;

/// What the engine may do after a failed call. Decided by the adapter, which is the
/// only place that knows whether the request left the process and how the downstream
/// answered (errors keep their kind). Named apart from the ledger's `ErrorKind`, the
/// stored kind of a step's error, which the gateway maps this to (`ledger_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Retrying cannot help: bad configuration or arguments, a 4xx answer, a non-zero
    /// exit, an MCP tool that reported `isError`. The downstream may have been reached.
    Permanent,
    /// The downstream answered that it could not do it now (408/425/429/5xx); a later
    /// attempt may succeed. `retry_after` is the downstream's own hint, when it gave one.
    Transient {
        /// Delay asked for by the downstream (`Retry-After`), if any.
        retry_after: Option<Duration>,
    },
    /// The request left and may have been processed, but no answer was received
    /// (timeout, connection lost mid-response, command killed by the timeout, MCP
    /// transport died mid-call). The engine must not re-send blindly: the call is in doubt.
    Unknown,
    /// The request provably never left the process (connect refused, DNS failure,
    /// program not found, MCP server failed to start). Safe to send again.
    NotSent,
}

impl FailureKind {
    /// A stable lower-case name, for storage and logs (`permanent`, `transient`,
    /// `unknown`, `not_sent`), so the mapping to text lives in one place.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureKind::Permanent => "permanent",
            FailureKind::Transient { .. } => "transient",
            FailureKind::Unknown => "unknown",
            FailureKind::NotSent => "not_sent",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKind::Transient {
                retry_after: Some(delay),
            } => write!(f, "transient (retry after {}ms)", delay.as_millis()),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A failed tool call: its kind and a human-readable message.
///
/// The message never contains request headers (where credentials travel); it may
/// contain argument values or downstream answers, which the engine scrubs of secret
/// values before storing or logging them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    /// How the engine may react.
    pub kind: FailureKind,
    /// What happened, for operators.
    pub message: String,
}

impl Error {
    /// An error of the given kind.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// A [`FailureKind::Permanent`] error.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Permanent, message)
    }

    /// A [`FailureKind::Transient`] error with the downstream's retry hint.
    pub fn transient(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        Self::new(FailureKind::Transient { retry_after }, message)
    }

    /// An [`FailureKind::Unknown`] error: the outcome is in doubt.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Unknown, message)
    }

    /// A [`FailureKind::NotSent`] error: nothing left the process.
    pub fn not_sent(message: impl Into<String>) -> Self {
        Self::new(FailureKind::NotSent, message)
    }

    /// The call's [`crate::Fence`] closed before its next request was handed to the
    /// transport: [`FailureKind::NotSent`] when none of the call's `sent` requests left
    /// yet (the engine tells it from other not-sent failures by its fence, which is
    /// closed), else [`FailureKind::Unknown`] (an earlier request, a redirect hop or an
    /// MCP round, may have acted).
    pub fn fenced(why: crate::Closed, what: &str, sent: u32) -> Self {
        if sent == 0 {
            Self::not_sent(format!("{what}: not sent: {why}"))
        } else {
            Self::unknown(format!(
                "{what}: an earlier request of the call was sent and the next one not: {why}"
            ))
        }
    }

    /// The call's [`crate::Fence`] closed while its request was under way: it may have
    /// been processed ([`FailureKind::Unknown`]).
    pub fn fenced_in_flight(why: crate::Closed, what: &str) -> Self {
        Self::unknown(format!(
            "{what}: {why} while the request was under way; it may have been processed"
        ))
    }
}

/// Joins an error and its sources into one line ("a: b: c"), skipping a source whose
/// text the previous line already contains, because reqwest and hyper repeat themselves.
/// URLs quoted by reqwest lose their query and user info, which may carry credentials.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut urls = Vec::new();
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(url) = e
            .downcast_ref::<reqwest::Error>()
            .and_then(reqwest::Error::url)
        {
            urls.push(url.clone());
        }
        if !std::ptr::eq(e, error) {
            let text = e.to_string();
            if !text.is_empty() && !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
        }
        current = e.source();
    }
    for url in urls {
        let mut shown = url.clone();
        shown.set_query(None);
        shown.set_fragment(None);
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        out = out.replace(url.as_str(), shown.as_str());
    }
    out
}

/// The last `max` bytes of `bytes` as lossy UTF-8, marked when cut, so error messages
/// carry the useful end of a long stderr or body without growing without bound.
pub(crate) fn tail(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return String::from_utf8_lossy(bytes).trim().to_string();
    }
    let cut = &bytes[bytes.len() - max..];
    format!("…{}", String::from_utf8_lossy(cut).trim())
}

/// The first `max` bytes of `bytes` as lossy UTF-8, marked when cut.
pub(crate) fn head(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return String::from_utf8_lossy(bytes).trim().to_string();
    }
    format!("{}…", String::from_utf8_lossy(&bytes[..max]).trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_carries_kind_and_message() {
        let error = Error::transient("HTTP 503", Some(Duration::from_secs(2)));
        assert_eq!(
            error.to_string(),
            "transient (retry after 2000ms): HTTP 503"
        );
        assert_eq!(Error::not_sent("refused").to_string(), "not_sent: refused");
    }

    #[test]
    fn tail_and_head_mark_cuts() {
        assert_eq!(tail(b"abcdef", 3), "…def");
        assert_eq!(head(b"abcdef", 3), "abc…");
        assert_eq!(tail(b"ab", 3), "ab");
    }
}

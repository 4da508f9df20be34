//! Host allow-lists: which hosts a request may reach, checked on every hop.
//!
//! The engine checks a tool's URL against the operator's `[egress] allow` list before
//! anything is claimed; an HTTP tool that follows redirects must check each hop too, or
//! a `307 Location: http://elsewhere/` walks past the list with the request's body and
//! key. The matching lives here so that both checks are the same code.

/// Allowed host patterns: `host` (exact, case-insensitive, trailing dot ignored),
/// `*.example.com` (subdomains only, not `example.com` itself) or `*` (any host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    patterns: Vec<String>,
}

impl AllowList {
    /// A list of patterns; an empty list allows no host.
    pub fn new(patterns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            patterns: patterns
                .into_iter()
                .map(|p| p.into().to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether `host` may be reached (IPv6 brackets are ignored).
    pub fn allows(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        self.patterns
            .iter()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(suffix) => host.len() > suffix.len() && host.ends_with(&format!(".{suffix}")),
                None => pattern == "*" || *pattern == host,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let a = AllowList::new(["127.0.0.1", "*.Example.com", "::1"]);
        assert!(a.allows("127.0.0.1"));
        assert!(a.allows("api.example.com"));
        assert!(a.allows("API.Example.com."));
        assert!(a.allows("[::1]"));
        assert!(!a.allows("example.com"));
        assert!(!a.allows("evil.com"));
        assert!(!a.allows("example.com.evil.com"));
        assert!(!a.allows("localhost"));
        assert!(AllowList::new(["*"]).allows("anything"));
        assert!(!AllowList::new(Vec::<String>::new()).allows("anything"));
    }
}

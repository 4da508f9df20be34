//! The grammar of a host pattern, shared by `[egress] allow` and the `host` of a
//! `[[policy.approvals]]` rule: one rule of what a pattern may be, checked when
//! `flow.toml` is loaded.

/// One `[egress] allow` entry: `*` (every host), a host name, `*.` and a host name (its
/// subdomains), an IPv4 address, or an IPv6 address (bracketed or not). A URL, a port, a
/// path, an empty string, `*.` alone or a `*` inside a name would match nothing (or not
/// what was meant) and is refused with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(pub String);

impl HostPattern {
    /// Checks `text` against the grammar above.
    pub fn parse(text: &str) -> Result<Self, String> {
        let refuse = |why: &str| Err(format!("egress pattern `{text}` {why}"));
        if text.is_empty() {
            return refuse(
                "is empty: name a host (`api.example.com`, `*.example.com`, `127.0.0.1`)",
            );
        }
        if text.contains("://") {
            return refuse("is a URL: write only its host (`http://x` → `x`)");
        }
        if text == "*" {
            return Ok(Self(text.into()));
        }
        let bare = text.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<std::net::IpAddr>().is_ok() {
            return Ok(Self(text.into()));
        }
        let name = text.strip_prefix("*.").unwrap_or(text);
        if name.is_empty() {
            return refuse("has no name after `*.`: write `*.example.com`");
        }
        if name.contains('*') {
            return refuse("has a `*` inside: only a leading `*.` (subdomains) is a wildcard");
        }
        if let Some(c) = name
            .chars()
            .find(|c| matches!(c, '/' | ':' | '@' | '?' | '#'))
        {
            return refuse(&format!(
                "holds `{c}`: write a host name alone, without a port, path or user"
            ));
        }
        let name = name.strip_suffix('.').unwrap_or(name);
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return refuse(
                "is not a host name (labels of letters, digits and `-`, 1 to 63 long, joined by `.`)",
            );
        }
        Ok(Self(text.into()))
    }
}

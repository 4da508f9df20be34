//! The naming rules of node ids, input names and tool names.

/// Node ids: `[a-z0-9_-]+`, at most 128 bytes (they become step ids and appear in
/// URLs and file names). This is the one id grammar (`flow_ledger::ids::check_id`)
/// narrowed to lower case and without `.`, so every node id is also a valid id there.
pub fn is_node_id(id: &str) -> bool {
    flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Node, id).is_ok()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// What a connection name may be (it appears in commands, AAD and messages; a tool
/// names its connection, `flow.toml` declares it).
pub const CONNECTION_NAME_HELP: &str =
    "a connection name is 1 to 63 of a-z, 0-9, `-`, `_`, starting with a letter or digit";

/// Whether `name` is a valid connection name.
pub fn is_connection_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

/// The `n` of a trailing `_retry<n>`, which would collide with retry step ids.
pub fn reserved_retry_suffix(id: &str) -> Option<&str> {
    let idx = id.rfind("_retry")?;
    let digits = &id[idx + "_retry".len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

pub(super) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_and_reserved_suffixes() {
        assert!(is_node_id("fetch-user_2"));
        assert!(!is_node_id("Fetch"));
        assert!(!is_node_id("a b"));
        assert!(!is_node_id(""));
        assert!(!is_node_id("a.b"), "no dots in node ids");
        assert!(is_node_id(&"a".repeat(128)));
        assert!(
            !is_node_id(&"a".repeat(129)),
            "the id grammar's length limit"
        );
        assert_eq!(reserved_retry_suffix("charge_retry1"), Some("1"));
        assert_eq!(reserved_retry_suffix("charge_retry"), None);
        assert_eq!(reserved_retry_suffix("retry1"), None);
        assert_eq!(reserved_retry_suffix("charge_retryx"), None);
    }
}

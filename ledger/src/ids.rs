//! The one grammar of the names a user chooses: run ids, tenant and workspace names (and,
//! narrowed to lower case, node ids).
//!
//! These names end up in keys, log lines, metrics labels, file names and URL path
//! segments, so every entry point (the API's submit and batch, `flow run --run-id`,
//! `flow submit --run-id`, `flow show`/`cancel`/`resume` and their `--server` client,
//! `--tenant`, `--workspace`) checks them with [`check_id`] before anything is sent or
//! written. The grammar: 1 to [`MAX_ID_LEN`] ASCII letters, digits, `_`, `-` and `.`,
//! and not `.` or `..` (a URL path segment that is a dot-segment is removed by every
//! client that normalizes URLs, so such a run could be created but never addressed).

/// Longest id, in bytes (all ASCII, so also in characters).
pub const MAX_ID_LEN: usize = 128;

/// What an id names, for the message that refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A run id (`--run-id`, `run_id`, the `RUN` of `flow show`).
    Run,
    /// A node id of a workflow.
    Node,
    /// A tenant name (`--tenant`).
    Tenant,
    /// A workspace name (`--workspace`).
    Workspace,
    /// The name of a run input that gets a searchable `run_inputs` row, and of one a
    /// `RunFilter` searches by: workflow input names are identifiers, so every one of
    /// them passes the grammar.
    Input,
}

impl IdKind {
    /// The kind in a message ("run id", "tenant").
    pub fn as_str(self) -> &'static str {
        match self {
            IdKind::Run => "run id",
            IdKind::Node => "node id",
            IdKind::Tenant => "tenant",
            IdKind::Workspace => "workspace",
            IdKind::Input => "input name",
        }
    }
}

/// Why an id was refused. The messages quote the id escaped (a control character is
/// shown as `\u{0}`, never written raw to a terminal or a log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The id is empty.
    #[error("{} is empty: {RULE}", kind.as_str())]
    Empty {
        /// What it names.
        kind: IdKind,
    },
    /// The id is longer than [`MAX_ID_LEN`] bytes.
    #[error("{} \"{shown}…\" is {len} bytes long, over {MAX_ID_LEN}: {RULE}", kind.as_str())]
    TooLong {
        /// What it names.
        kind: IdKind,
        /// Its first characters, escaped.
        shown: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The id is `.` or `..`.
    #[error("{} \"{id}\" is a path dot-segment, which URLs cannot address: {RULE}", kind.as_str())]
    Dots {
        /// What it names.
        kind: IdKind,
        /// The id.
        id: String,
    },
    /// The id holds a character outside the grammar.
    #[error("{} \"{shown}\" holds {ch:?}: {RULE}", kind.as_str())]
    Char {
        /// What it names.
        kind: IdKind,
        /// The id (at most 80 characters), escaped.
        shown: String,
        /// The first character outside the grammar.
        ch: char,
    },
}

/// The grammar, as the messages state it.
pub const RULE: &str =
    "use 1 to 128 ASCII letters, digits, `_`, `-` and `.` (not `.` or `..` alone)";

/// Checks `id` against the grammar of the module docs.
pub fn check_id(kind: IdKind, id: &str) -> Result<(), Error> {
    let shown = || id.chars().take(80).flat_map(char::escape_debug).collect();
    if id.is_empty() {
        return Err(Error::Empty { kind });
    }
    if let Some(ch) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(Error::Char {
            kind,
            shown: shown(),
            ch,
        });
    }
    if id.len() > MAX_ID_LEN {
        return Err(Error::TooLong {
            kind,
            shown: shown(),
            len: id.len(),
        });
    }
    if id == "." || id == ".." {
        return Err(Error::Dots {
            kind,
            id: id.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_accepts_names_and_refuses_the_rest() {
        for ok in [
            "r-1",
            "run_01HXYZ",
            "refund.42",
            "a",
            "...",
            ".hidden",
            "A_b-C.9",
        ] {
            assert_eq!(check_id(IdKind::Run, ok), Ok(()), "{ok}");
        }
        assert_eq!(
            check_id(IdKind::Run, &"x".repeat(MAX_ID_LEN)),
            Ok(()),
            "the limit itself"
        );
        let refused = |id: &str| check_id(IdKind::Run, id).err();
        assert_eq!(refused(""), Some(Error::Empty { kind: IdKind::Run }));
        assert!(matches!(refused("."), Some(Error::Dots { .. })));
        assert!(matches!(refused(".."), Some(Error::Dots { .. })));
        assert!(matches!(
            refused(&"x".repeat(MAX_ID_LEN + 1)),
            Some(Error::TooLong { len: 129, .. })
        ));
        for (bad, ch) in [
            ("a\0b", '\0'),
            ("a/b", '/'),
            ("a b", ' '),
            ("a\nb", '\n'),
            ("a\u{7f}", '\u{7f}'),
            ("é", 'é'),
            ("a%2e", '%'),
            ("../x", '/'),
        ] {
            assert!(
                matches!(refused(bad), Some(Error::Char { ch: c, .. }) if c == ch),
                "{bad:?}: {:?}",
                refused(bad)
            );
        }
        let msg = refused("a\0b").map(|e| e.to_string()).unwrap_or_default();
        assert!(!msg.contains('\0'), "escaped: {msg:?}");
        assert!(msg.contains("run id \"a\\0b\""), "{msg}");
        assert!(msg.contains("not `.` or `..`"), "{msg}");
        let msg = check_id(IdKind::Tenant, "..").map_err(|e| e.to_string());
        assert!(
            msg.as_ref().err().is_some_and(|m| m.starts_with("tenant")),
            "{msg:?}"
        );
    }
}

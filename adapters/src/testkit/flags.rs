//! Environment flags of the test suites (`CI`, `FLOW_BLESS`), read by one rule.
//!
//! `CI` once meant three things in three files (any value; `true` or `1`; only `true`),
//! so a CI that set `CI=1` skipped the browser test instead of failing it. Every test
//! now asks [`env_flag`]. The ledger's conformance tests may not depend on this crate
//! (the two leaves never depend on each other), so `ledger/tests/conformance/common.rs`
//! holds a copy of [`flag_on`]; `tests/tidy.rs` checks that the two texts are identical.

/// Whether a flag's value turns it on: set, and not `""`, `"0"` or `"false"` (any case).
pub fn flag_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// Whether the environment flag `name` is on, by [`flag_on`].
pub fn env_flag(name: &str) -> bool {
    flag_on(std::env::var(name).ok().as_deref())
}

/// Whether the tests run in CI (`CI` on): there a missing service or tool is a failure,
/// not a skip, and goldens are checked, never rewritten.
pub fn ci() -> bool {
    env_flag("CI")
}

#[cfg(test)]
mod tests {
    use super::flag_on;

    #[test]
    fn a_flag_is_on_unless_unset_empty_zero_or_false() {
        for on in ["true", "1", "yes", "TRUE", "anything"] {
            assert!(flag_on(Some(on)), "{on}");
        }
        for off in [
            None,
            Some(""),
            Some("0"),
            Some("false"),
            Some("False"),
            Some(" "),
        ] {
            assert!(!flag_on(off), "{off:?}");
        }
    }
}

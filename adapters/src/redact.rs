//! Debug output for specs that may carry secrets: names are shown, values never.
//!
//! The engine renders secrets into header and environment values before building a
//! spec, so a derived `Debug` would print them into any log that formats a spec.

use std::fmt;

/// Formats `(name, value)` pairs as `{name: "…"}`.
pub(crate) struct Pairs<'a>(pub &'a [(String, String)]);

impl fmt::Debug for Pairs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, _)| (name, Hidden)))
            .finish()
    }
}

/// A value that is never printed.
pub(crate) struct Hidden;

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"…\"")
    }
}

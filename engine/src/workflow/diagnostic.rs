//! Validation diagnostics: what is wrong, where, and (when obvious) how to fix it.
//!
//! Every problem in a workflow file becomes one [`Diagnostic`]; validation collects them
//! all before reporting, so a user fixes a file in one pass instead of one error per run.

use std::fmt;

/// A 1-based line and column (in characters) in a workflow file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column, counted in characters.
    pub col: u32,
}

/// One problem found in a workflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where the problem is.
    pub pos: Pos,
    /// What is wrong, in one sentence.
    pub message: String,
    /// A suggested fix, when one is obvious.
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic without a hint.
    pub fn new(pos: Pos, message: String) -> Self {
        Self {
            pos,
            message,
            help: None,
        }
    }

    /// Adds a `help:` line.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Renders as `FILE:LINE:COL: error: message` plus an indented `help:` line.
    pub fn render(&self, file: &str) -> String {
        let mut out = format!(
            "{file}:{}:{}: error: {}",
            self.pos.line, self.pos.col, self.message
        );
        if let Some(help) = &self.help {
            out.push_str("\n  help: ");
            out.push_str(help);
        }
        out
    }
}

/// All the problems of one file, sorted by position; returned when a file is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics {
    /// The file name as the user gave it, used as the `FILE` part of each line.
    pub file: String,
    /// The problems, in file order.
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// Sorts by position (stable, so problems at one place keep their discovery order).
    pub fn new(file: impl Into<String>, mut items: Vec<Diagnostic>) -> Self {
        items.sort_by_key(|d| d.pos);
        Self {
            file: file.into(),
            items,
        }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            writeln!(f, "{}", d.render(&self.file))?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// The closest candidate to a misspelt name, for "did you mean" hints.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let candidates: Vec<&str> = candidates.into_iter().collect();
    let near = candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len().max(name.len()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c);
    // `retry` for `retry_policy`: a long-enough prefix is as telling as a typo.
    near.or_else(|| {
        candidates
            .iter()
            .copied()
            .find(|c| name.len() >= 4 && c.len() > name.len() && c.starts_with(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_file_line_col_and_help() {
        let d = Diagnostic::new(Pos { line: 3, col: 5 }, "unknown key `retry`".into())
            .with_help("did you mean `retry_policy`?");
        assert_eq!(
            d.render("w.yaml"),
            "w.yaml:3:5: error: unknown key `retry`\n  help: did you mean `retry_policy`?"
        );
    }

    #[test]
    fn did_you_mean_finds_near_names_only() {
        let keys = ["retry_policy", "timeout", "needs"];
        assert_eq!(did_you_mean("retry_polcy", keys), Some("retry_policy"));
        assert_eq!(did_you_mean("need", keys), Some("needs"));
        assert_eq!(did_you_mean("retry", keys), Some("retry_policy"));
        assert_eq!(did_you_mean("zzz", keys), None);
    }
}

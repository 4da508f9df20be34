//! Plain-text tables for `flow runs` and `flow events`: a header row, columns sized to
//! their content, cut to the terminal's width; `--json` carries the full text.

/// The first line of `text` (error messages can span lines; `--json` has them whole).
pub(super) fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}

/// The terminal's width from `COLUMNS`, else none (a pipe: nothing is cut).
pub(super) fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    Some(
        std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(120),
    )
}

/// A plain-text table: a header row, columns as wide as their widest cell, two spaces
/// apart; with a `width`, the last column is cut (`…`) so a line fits.
pub(super) fn table(header: &[&str], rows: &[Vec<String>], width: Option<usize>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        let mut line = line.trim_end().to_string();
        if let Some(max) = width
            && line.chars().count() > max
        {
            line = line.chars().take(max.saturating_sub(1)).collect::<String>() + "…";
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `text`'s first line, at most `max` characters (`…` marks a cut): a table cell for an
/// error that may be long.
pub(super) fn cell(text: &str, max: usize) -> String {
    let line = first_line(text);
    if line.chars().count() <= max {
        return line;
    }
    line.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_lines_fit_the_width() {
        let rows = vec![
            vec!["a".to_string(), "long error text".to_string()],
            vec!["bbbb".to_string(), String::new()],
        ];
        let text = table(&["ID", "ERROR"], &rows, None);
        assert_eq!(text, "ID    ERROR\na     long error text\nbbbb\n");
        let cut = table(&["ID", "ERROR"], &rows, Some(10));
        assert_eq!(cut.lines().nth(1), Some("a     lon…"));
    }

    #[test]
    fn a_cell_is_one_line_at_most_max_characters() {
        assert_eq!(cell("short", 10), "short");
        assert_eq!(cell("first\nsecond", 10), "first");
        assert_eq!(cell("abcdefghijkl", 5), "abcd…");
    }
}

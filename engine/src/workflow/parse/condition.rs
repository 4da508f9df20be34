//! Conditions: `if:` on a node, `reconcile.found` / `not_found`, a wait's `match` —
//! always one expression, never a string whose truth is its non-emptiness.

use super::Cx;
use crate::workflow::expr::Template;
use crate::workflow::yaml::{Node, Value};

/// An `if:`: always one expression, never a string whose truth is its non-emptiness.
///
/// `true` / `false` are themselves; a single `${{ expr }}`, whatever whitespace surrounds
/// it, is `expr`; a string without `${{ }}` is an expression too, as in GitHub Actions
/// (`if: inputs.go`, `if: "false"`). Text mixed with expressions (`"${{ a }} and
/// ${{ b }}"`, `"x ${{ a }}"`), an empty string and numbers are refused: each used to be
/// a non-empty string, which is always true.
pub(super) fn condition(cx: &mut Cx, n: &Node, field: &str) -> Option<Template> {
    let text = match &n.value {
        Value::Bool(b) => return Template::expression(&b.to_string(), n.pos).ok(),
        Value::Str(s) => s.trim(),
        _ => {
            cx.error_help(
                n.pos,
                format!(
                    "`{field}` must be true, false or an expression, found {}",
                    n.type_name()
                ),
                format!(
                    "write `{field}: true`, `{field}: false` or `{field}: ${{{{ inputs.go }}}}`"
                ),
            );
            return None;
        }
    };
    if text.is_empty() {
        cx.error_help(
            n.pos,
            format!("`{field}` is empty"),
            format!(
                "write `{field}: true`, `{field}: false` or an expression{}",
                if field == "if" {
                    "; remove `if` to always run"
                } else {
                    ""
                }
            ),
        );
        return None;
    }
    let template = match Template::parse(text, n.pos) {
        Ok(t) => t,
        Err(e) => {
            cx.error(n.pos, format!("`{field}`: {e}"));
            return None;
        }
    };
    let src = match (template.whole_expr(), template.has_expr()) {
        (Some(src), _) => src.to_string(),
        (None, false) => text.to_string(),
        (None, true) => {
            cx.error_help(
                n.pos,
                format!("`{field}` must be one expression, found `{text}`"),
                "text around or between `${{ }}` makes a string, which is always true; put the whole condition in one `${{ … }}`, e.g. `${{ a and b }}`",
            );
            return None;
        }
    };
    match Template::expression(&src, n.pos) {
        Ok(t) => Some(t),
        Err(e) => {
            cx.error(n.pos, format!("`{field}`: {e}"));
            None
        }
    }
}

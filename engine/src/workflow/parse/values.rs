//! The small value parsers every converter shares: plain strings (which refuse `${{`),
//! free text, booleans (YAML booleans only), bounded counts and numbers, durations and
//! templates. Each reports at the value and returns `None` (or an empty list) when wrong.

use std::time::Duration;

use serde_json::Value as Json;

use super::Cx;
use crate::workflow::expr::{TValue, Template};
use crate::workflow::yaml::{Node, Value};

impl Cx {
    /// A plain string field. Such fields are never rendered, so a `${{ }}` in one would be
    /// used as literal text: refused rather than silently kept.
    pub(super) fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        let s = self.text(node, what)?;
        if s.contains("${{") {
            self.error_help(
                node.pos,
                format!("{what} does not take expressions, found `{s}`"),
                "expressions are evaluated in `with`, `if`, `idempotency_key` and a tool's templated fields (url, headers, query, body, command, env, auth); this value would be used as literal text",
            );
            return None;
        }
        Some(s)
    }

    /// A constant value (an input's `default`, `elicitation.accept`): never rendered, so
    /// every string inside it that holds `${{` is refused, as [`Cx::string`] does for a
    /// plain string field. Returns whether the value is free of expressions.
    pub(super) fn constant(&mut self, node: &Node, what: &str) -> bool {
        match &node.value {
            Value::Str(s) if s.contains("${{") => {
                self.error_help(
                    node.pos,
                    format!("{what} does not take expressions, found `{s}`"),
                    "this value is used as written, so `${{ }}` would be sent as literal text; put the expression in a templated field (`with`, a tool's url, headers, body…)",
                );
                false
            }
            // Every item is checked (no short circuit), so each one is reported.
            Value::Seq(items) => {
                let mut ok = true;
                for i in items {
                    ok &= self.constant(i, what);
                }
                ok
            }
            Value::Map(entries) => {
                let mut ok = true;
                for (_, v) in entries {
                    ok &= self.constant(v, what);
                }
                ok
            }
            _ => true,
        }
    }

    /// Free text (`description`): anything goes, it is never evaluated.
    pub(super) fn text(&mut self, node: &Node, what: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a string, found {}", node.type_name()),
                );
                None
            }
        }
    }

    pub(super) fn bool(&mut self, node: &Node, what: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            Value::Str(s) if s.contains("${{") => {
                self.error_help(
                    node.pos,
                    format!("{what} must be true or false, found the expression `{s}`"),
                    format!("{what} is fixed when the workflow is written; it is not evaluated"),
                );
                None
            }
            Value::Str(s) if matches!(s.trim(), "true" | "false") => {
                self.error_help(
                    node.pos,
                    format!("{what} must be true or false, found the string `{s}`"),
                    format!("write {} without quotes", s.trim()),
                );
                None
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be true or false, found {}", node.type_name()),
                );
                None
            }
        }
    }

    pub(super) fn count(&mut self, node: &Node, what: &str, min: u64, max: u64) -> Option<u64> {
        match &node.value {
            Value::Int(i) if *i >= 0 && (*i as u64) >= min && (*i as u64) <= max => Some(*i as u64),
            Value::Int(i) => {
                self.error(
                    node.pos,
                    format!("{what} must be between {min} and {max}, found {i}"),
                );
                None
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a whole number, found {}", node.type_name()),
                );
                None
            }
        }
    }

    pub(super) fn number(&mut self, node: &Node, what: &str, min: f64, max: f64) -> Option<f64> {
        let value = match &node.value {
            Value::Int(i) => *i as f64,
            Value::Float(f) => *f,
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a number, found {}", node.type_name()),
                );
                return None;
            }
        };
        if !(min..=max).contains(&value) {
            self.error(
                node.pos,
                format!("{what} must be between {min} and {max}, found {value}"),
            );
            return None;
        }
        Some(value)
    }

    pub(super) fn duration(&mut self, node: &Node, what: &str, max: Duration) -> Option<Duration> {
        let text = match &node.value {
            Value::Str(s) => s.clone(),
            Value::Int(i) => {
                self.error_help(
                    node.pos,
                    format!("{what} needs a unit, found `{i}`"),
                    format!("write `{i}s` or `{i}ms`"),
                );
                return None;
            }
            _ => {
                self.error(
                    node.pos,
                    format!(
                        "{what} must be a duration like `250ms`, `30s`, `5m`, `1h`, found {}",
                        node.type_name()
                    ),
                );
                return None;
            }
        };
        match parse_duration(&text) {
            Ok(d) if d.is_zero() => {
                self.error(node.pos, format!("{what} must be longer than zero"));
                None
            }
            Ok(d) if d > max => {
                self.error(
                    node.pos,
                    format!(
                        "{what} `{text}` is longer than the limit of {}",
                        humantime::format_duration(max)
                    ),
                );
                None
            }
            Ok(d) => Some(d),
            Err(reason) => {
                self.error_help(
                    node.pos,
                    format!("invalid duration `{text}` for {what}: {reason}"),
                    "use a number and a unit: `250ms`, `30s`, `5m`, `1h`",
                );
                None
            }
        }
    }

    pub(super) fn template(&mut self, node: &Node, what: &str) -> Option<Template> {
        let text = match &node.value {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a string, found {}", node.type_name()),
                );
                return None;
            }
        };
        match Template::parse(&text, node.pos) {
            Ok(t) => Some(t),
            Err(e) => {
                self.error(node.pos, format!("{what}: {e}"));
                None
            }
        }
    }

    pub(super) fn template_list(&mut self, node: &Node, what: &str) -> Vec<Template> {
        match &node.value {
            Value::Seq(items) => items
                .iter()
                .filter_map(|i| self.template(i, what))
                .collect(),
            Value::Str(s) => {
                self.error_help(
                    node.pos,
                    format!("{what} must be a list (argv, no shell), found a string"),
                    format!(
                        "write `[{}]`",
                        s.split_whitespace()
                            .map(|w| format!("\"{w}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                Vec::new()
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a list, found {}", node.type_name()),
                );
                Vec::new()
            }
        }
    }

    pub(super) fn template_map(&mut self, node: &Node, what: &str) -> Vec<(String, Template)> {
        let Some(entries) = self.map(node, what) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|(k, v)| {
                self.template(v, &format!("{what}.{}", k.name))
                    .map(|t| (k.name.clone(), t))
            })
            .collect()
    }

    pub(super) fn tvalue(&mut self, node: &Node, what: &str) -> TValue {
        if let Value::Map(entries) = &node.value {
            self.check_duplicates(entries, what);
        }
        match &node.value {
            Value::Str(_) => self
                .template(node, what)
                .map_or(TValue::Const(Json::Null), |t| {
                    if t.has_expr() {
                        TValue::Str(t)
                    } else {
                        TValue::Const(node.to_json())
                    }
                }),
            Value::Seq(items) => TValue::Seq(items.iter().map(|i| self.tvalue(i, what)).collect()),
            Value::Map(entries) => TValue::Map(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), self.tvalue(v, what)))
                    .collect(),
            ),
            _ => TValue::Const(node.to_json()),
        }
    }
}

/// Parses `250ms`, `30s`, `5m`, `1h`, `1h30m` (humantime's grammar).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| e.to_string())
}

pub(super) fn string_list(cx: &mut Cx, node: &Node, what: &str) -> Vec<String> {
    match &node.value {
        Value::Seq(items) => items.iter().filter_map(|i| cx.string(i, what)).collect(),
        _ => {
            cx.error(
                node.pos,
                format!(
                    "{what} must be a list of strings, found {}",
                    node.type_name()
                ),
            );
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}

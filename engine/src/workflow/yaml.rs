//! A span-annotated YAML tree for workflow files.
//!
//! Validation must report *every* problem with `FILE:LINE:COL`, which serde's data model
//! cannot carry (it has no positions and stops at the first error). So workflow files are
//! parsed from `saphyr-parser` events into this small tree, where every value and every
//! mapping key keeps its position. The loader is iterative (no recursion on nesting), caps
//! nesting depth, and counts the nodes that aliases expand to, so a "billion laughs" file
//! is refused in bounded time and memory.

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use super::diagnostic::{Diagnostic, Pos};

/// Most nodes that YAML aliases may add by expansion: legitimate files rarely use aliases
/// at all, and an alias bomb grows exponentially, so a small budget refuses bombs quickly.
pub const ALIAS_EXPANSION_BUDGET: usize = 100_000;
/// Deepest nesting accepted; workflow files are shallow and the converters recurse.
pub const MAX_DEPTH: usize = 64;

/// One YAML value with the position where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Where the value starts in the file.
    pub pos: Pos,
    /// The value itself.
    pub value: Value,
}

/// A YAML value resolved with the YAML 1.2 core schema (`yes` is a string, not a bool).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`, `~` or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits in `i64`.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Any other scalar, including every quoted one.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in file order. Duplicate keys are kept (the first wins on lookup) so that
    /// the converter, which knows the context, can name them ("duplicate node id").
    Map(Vec<(Key, Node)>),
}

/// A mapping key: always a string in workflow files, with its own position so that
/// "unknown key" points at the key, not at its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The key text.
    pub name: String,
    /// Where the key starts.
    pub pos: Pos,
}

impl Node {
    /// A short English name of the value's type, for "expected X, found Y" messages.
    pub fn type_name(&self) -> &'static str {
        match &self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// Converts to JSON; YAML and JSON share the data model once keys are strings.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// Counts this node and everything under it.
    fn size(&self) -> usize {
        match &self.value {
            Value::Seq(items) => 1 + items.iter().map(Node::size).sum::<usize>(),
            Value::Map(entries) => 1 + entries.iter().map(|(_, v)| v.size()).sum::<usize>(),
            _ => 1,
        }
    }
}

enum Frame {
    Seq {
        pos: Pos,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        pos: Pos,
        anchor: usize,
        entries: Vec<(Key, Node)>,
        pending_key: Option<Key>,
    },
}

fn pos_of(span: &Span) -> Pos {
    Pos {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX),
        col: u32::try_from(span.start.col() + 1).unwrap_or(u32::MAX),
    }
}

/// Parses one YAML document into a [`Node`] tree, or returns the first fatal problem.
pub fn load(text: &str) -> Result<Node, Diagnostic> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: Vec<Option<Node>> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut alias_budget = ALIAS_EXPANSION_BUDGET;

    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| {
            let m = e.marker();
            Diagnostic::new(
                Pos {
                    line: u32::try_from(m.line()).unwrap_or(u32::MAX),
                    col: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
                },
                format!("invalid YAML: {}", e.info()),
            )
        })?;
        let pos = pos_of(&span);
        let finished: Option<(Node, usize)> = match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(Diagnostic::new(
                        pos,
                        "a workflow file holds exactly one YAML document".to_string(),
                    )
                    .with_help("remove the `---` separator and the second document"));
                }
                None
            }
            Event::Alias(id) => {
                let target = anchors.get(id).and_then(Option::as_ref).ok_or_else(|| {
                    Diagnostic::new(pos, "alias refers to an unknown anchor".to_string())
                })?;
                let size = target.size();
                if size > alias_budget {
                    return Err(Diagnostic::new(
                        pos,
                        format!(
                            "YAML aliases expand to more than {ALIAS_EXPANSION_BUDGET} values; \
                             refusing the file (an alias bomb?)"
                        ),
                    ));
                }
                alias_budget -= size;
                let mut node = target.clone();
                node.pos = pos;
                Some((node, 0))
            }
            Event::Scalar(text, style, anchor, tag) => Some((
                scalar(pos, text.into_owned(), style, tag.as_deref())?,
                anchor,
            )),
            Event::SequenceStart(anchor, tag) => {
                reject_tag(pos, tag.is_some())?;
                check_depth(pos, stack.len())?;
                stack.push(Frame::Seq {
                    pos,
                    anchor,
                    items: Vec::new(),
                });
                None
            }
            Event::MappingStart(anchor, tag) => {
                reject_tag(pos, tag.is_some())?;
                check_depth(pos, stack.len())?;
                stack.push(Frame::Map {
                    pos,
                    anchor,
                    entries: Vec::new(),
                    pending_key: None,
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => stack.pop().map(Frame::close),
        };
        let Some((node, anchor)) = finished else {
            continue;
        };
        if anchor > 0 {
            if anchors.len() <= anchor {
                anchors.resize(anchor + 1, None);
            }
            anchors[anchor] = Some(node.clone());
        }
        attach(&mut stack, &mut root, node)?;
    }
    let root = root.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        value: Value::Null,
    });
    Ok(root)
}

impl Frame {
    /// The finished collection and its anchor, at its end event.
    fn close(self) -> (Node, usize) {
        match self {
            Frame::Seq { pos, anchor, items } => (
                Node {
                    pos,
                    value: Value::Seq(items),
                },
                anchor,
            ),
            Frame::Map {
                pos,
                anchor,
                entries,
                ..
            } => (
                Node {
                    pos,
                    value: Value::Map(entries),
                },
                anchor,
            ),
        }
    }
}

/// A scalar's node: `!!str` keeps the text as a string; any other tag is refused.
fn scalar(
    pos: Pos,
    text: String,
    style: ScalarStyle,
    tag: Option<&Tag>,
) -> Result<Node, Diagnostic> {
    if let Some(tag) = tag {
        let plain_str = tag.handle == "tag:yaml.org,2002:" && tag.suffix == "str";
        if !plain_str {
            return Err(Diagnostic::new(
                pos,
                format!(
                    "YAML tags are not supported (found `{}{}`)",
                    tag.handle, tag.suffix
                ),
            ));
        }
        Ok(Node {
            pos,
            value: Value::Str(text),
        })
    } else {
        Ok(Node {
            pos,
            value: resolve_scalar(&text, style),
        })
    }
}

/// Puts a finished node where it belongs: the root, the open sequence, or the open
/// mapping (as its next key, which must be a scalar, or as the value of that key).
fn attach(stack: &mut [Frame], root: &mut Option<Node>, node: Node) -> Result<(), Diagnostic> {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Frame::Seq { items, .. }) => items.push(node),
        Some(Frame::Map {
            entries,
            pending_key,
            ..
        }) => match pending_key.take() {
            None => {
                let name = match node.value {
                    Value::Str(s) => s,
                    Value::Int(i) => i.to_string(),
                    Value::Bool(b) => b.to_string(),
                    Value::Float(f) => f.to_string(),
                    Value::Null => "null".to_string(),
                    Value::Seq(_) | Value::Map(_) => {
                        return Err(Diagnostic::new(
                            node.pos,
                            "mapping keys must be plain strings".to_string(),
                        ));
                    }
                };
                *pending_key = Some(Key {
                    name,
                    pos: node.pos,
                });
            }
            Some(key) => entries.push((key, node)),
        },
    }
    Ok(())
}

fn reject_tag(pos: Pos, tagged: bool) -> Result<(), Diagnostic> {
    if tagged {
        return Err(Diagnostic::new(
            pos,
            "YAML tags are not supported in workflow files".to_string(),
        ));
    }
    Ok(())
}

fn check_depth(pos: Pos, depth: usize) -> Result<(), Diagnostic> {
    if depth >= MAX_DEPTH {
        return Err(Diagnostic::new(
            pos,
            format!("values are nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    Ok(())
}

/// YAML 1.2 core schema resolution of a scalar.
fn resolve_scalar(text: &str, style: ScalarStyle) -> Value {
    if style != ScalarStyle::Plain {
        return Value::Str(text.to_string());
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Value::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Value::Float(f64::NAN),
        _ => {}
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(i) = i64::from_str_radix(hex, 16)
    {
        return Value::Int(i);
    }
    if let Some(oct) = text.strip_prefix("0o")
        && let Ok(i) = i64::from_str_radix(oct, 8)
    {
        return Value::Int(i);
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && let Ok(i) = text.parse::<i64>()
    {
        return Value::Int(i);
    }
    if looks_like_float(digits)
        && let Ok(f) = text.parse::<f64>()
    {
        return Value::Float(f);
    }
    Value::Str(text.to_string())
}

fn looks_like_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = {
        let mut parts = mantissa.splitn(2, '.');
        let int = parts.next().unwrap_or("");
        let frac = parts.next();
        let int_ok = int.bytes().all(|b| b.is_ascii_digit());
        match frac {
            Some(f) => {
                int_ok && f.bytes().all(|b| b.is_ascii_digit()) && !(int.is_empty() && f.is_empty())
            }
            None => int_ok && !int.is_empty() && exponent.is_some(),
        }
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> Value {
        load(text)
            .map(|root| root.value)
            .unwrap_or(Value::Str("ERROR".into()))
    }

    #[test]
    fn scalars_follow_the_yaml_1_2_core_schema() {
        let cases = [
            ("~", Value::Null),
            ("null", Value::Null),
            ("true", Value::Bool(true)),
            ("yes", Value::Str("yes".into())),
            ("42", Value::Int(42)),
            ("-7", Value::Int(-7)),
            ("0x1f", Value::Int(31)),
            ("1.5", Value::Float(1.5)),
            ("1e3", Value::Float(1000.0)),
            ("'42'", Value::Str("42".into())),
            ("30s", Value::Str("30s".into())),
            ("1.2.3", Value::Str("1.2.3".into())),
        ];
        for (text, expected) in cases {
            assert_eq!(value(text), expected, "for {text:?}");
        }
    }

    #[test]
    fn keys_and_values_keep_their_positions() {
        let root = load("a: 1\nnested:\n  b: [x, y]\n").expect("parses");
        let Value::Map(entries) = root.value else {
            panic!("not a map")
        };
        assert_eq!(entries[1].0.name, "nested");
        assert_eq!(entries[1].0.pos, Pos { line: 2, col: 1 });
        let Value::Map(inner) = &entries[1].1.value else {
            panic!("not a map")
        };
        assert_eq!(inner[0].0.pos, Pos { line: 3, col: 3 });
        assert_eq!(inner[0].1.pos, Pos { line: 3, col: 6 });
    }

    #[test]
    fn duplicate_keys_are_kept_for_the_converter_to_report() {
        let root = load("a: 1\na: 2\n").expect("parses");
        let Value::Map(entries) = root.value else {
            panic!("not a map")
        };
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].0.pos, Pos { line: 2, col: 1 });
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let err = load("a: [1, 2\nb: 3\n").expect_err("must fail");
        assert!(err.message.starts_with("invalid YAML"), "{}", err.message);
        assert!(err.pos.line >= 1);
    }

    #[test]
    fn alias_bombs_are_refused_quickly() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let started = std::time::Instant::now();
        let err = load(&text).expect_err("must refuse");
        assert!(err.message.contains("alias"), "{}", err.message);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let text = "[".repeat(MAX_DEPTH + 5) + &"]".repeat(MAX_DEPTH + 5);
        let err = load(&text).expect_err("must refuse");
        assert!(err.message.contains("nested"), "{}", err.message);
    }

    #[test]
    fn two_documents_are_refused() {
        assert!(load("a: 1\n---\nb: 2\n").is_err());
    }
}

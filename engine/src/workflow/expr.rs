//! `${{ expr }}` templates: parsing, the names they reference, and rendering.
//!
//! Expressions use minijinja's expression language (`a.b`, `x > 0`, `x ~ "s"`, filters).
//! A value that is exactly one `${{ expr }}` keeps the expression's JSON type; anything
//! else renders to a string. Templates are parsed once at validation, so a bad expression
//! is reported with its position before anything runs.

use std::sync::OnceLock;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value as Json;

use super::diagnostic::Pos;

/// One piece of a templated string.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    /// Literal text.
    Lit(String),
    /// An expression's source, without the `${{ }}`.
    Expr(String),
}

/// A string that may contain `${{ expr }}` parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The pieces in order.
    pub segments: Vec<Segment>,
    /// Where the string starts in the file.
    pub pos: Pos,
}

/// A JSON-like value whose strings may be templates (`with:`, `body:`).
#[derive(Debug, Clone, PartialEq)]
pub enum TValue {
    /// A JSON scalar that holds no template.
    Const(Json),
    /// A templated string.
    Str(Template),
    /// A list.
    Seq(Vec<TValue>),
    /// A mapping, in file order.
    Map(Vec<(String, TValue)>),
}

impl Default for TValue {
    fn default() -> Self {
        Self::Map(Vec::new())
    }
}

/// Why a template could not be parsed or rendered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// `${{` without a closing `}}`.
    #[error("`${{{{` is not closed by `}}}}`")]
    Unclosed,
    /// `${{ }}` with nothing inside.
    #[error("empty expression `${{{{ }}}}`")]
    Empty,
    /// minijinja rejected the expression.
    #[error("invalid expression `{src}`: {reason}")]
    Syntax {
        /// The expression's source.
        src: String,
        /// minijinja's explanation.
        reason: String,
    },
    /// Evaluation failed (undefined value, type error).
    #[error("cannot evaluate `{src}`: {reason}")]
    Eval {
        /// The expression's source.
        src: String,
        /// minijinja's explanation.
        reason: String,
    },
}

/// The shared expression environment: strict about undefined values, so a misspelt field
/// fails the step instead of silently sending `null` to a payment API.
pub fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_recursion_limit(64);
        env
    })
}

impl Template {
    /// Splits `text` into literal and `${{ }}` segments and checks each expression parses.
    pub fn parse(text: &str, pos: Pos) -> Result<Self, Error> {
        let mut segments = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("${{") {
            if start > 0 {
                segments.push(Segment::Lit(rest[..start].to_string()));
            }
            let after = &rest[start + 3..];
            let end = find_close(after).ok_or(Error::Unclosed)?;
            let src = after[..end].trim();
            if src.is_empty() {
                return Err(Error::Empty);
            }
            environment()
                .compile_expression(src)
                .map_err(|e| Error::Syntax {
                    src: src.to_string(),
                    reason: short_reason(&e),
                })?;
            segments.push(Segment::Expr(src.to_string()));
            rest = &after[end + 2..];
        }
        if !rest.is_empty() || segments.is_empty() {
            segments.push(Segment::Lit(rest.to_string()));
        }
        Ok(Self { segments, pos })
    }

    /// A template that is exactly the expression `src` (an `if:` condition), checked to
    /// parse.
    pub fn expression(src: &str, pos: Pos) -> Result<Self, Error> {
        let src = src.trim();
        if src.is_empty() {
            return Err(Error::Empty);
        }
        environment()
            .compile_expression(src)
            .map_err(|e| Error::Syntax {
                src: src.to_string(),
                reason: short_reason(&e),
            })?;
        Ok(Self {
            segments: vec![Segment::Expr(src.to_string())],
            pos,
        })
    }

    /// A template with no expressions.
    pub fn literal(text: &str) -> Self {
        Self {
            segments: vec![Segment::Lit(text.to_string())],
            pos: Pos::default(),
        }
    }

    /// The expression if the whole string is exactly one `${{ expr }}`.
    pub fn whole_expr(&self) -> Option<&str> {
        match self.segments.as_slice() {
            [Segment::Expr(src)] => Some(src),
            _ => None,
        }
    }

    /// Whether the string holds any expression.
    pub fn has_expr(&self) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Expr(_)))
    }

    /// The expressions' sources.
    pub fn exprs(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Expr(src) => Some(src.as_str()),
            Segment::Lit(_) => None,
        })
    }

    /// The literal text, when the string holds no expression.
    pub fn as_literal(&self) -> Option<String> {
        if self.has_expr() {
            return None;
        }
        Some(
            self.segments
                .iter()
                .map(|s| match s {
                    Segment::Lit(t) | Segment::Expr(t) => t.as_str(),
                })
                .collect(),
        )
    }

    /// Renders against `ctx`: the expression's own JSON value when the string is exactly
    /// one expression, else a string.
    pub fn render(&self, ctx: &Json) -> Result<Json, Error> {
        if let Some(src) = self.whole_expr() {
            return eval(src, ctx);
        }
        self.render_string(ctx).map(Json::String)
    }

    /// Renders to a string whatever the expressions' types (URLs, headers, argv).
    pub fn render_string(&self, ctx: &Json) -> Result<String, Error> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Lit(text) => out.push_str(text),
                Segment::Expr(src) => match eval(src, ctx)? {
                    Json::String(s) => out.push_str(&s),
                    Json::Null => {}
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }
}

/// Evaluates one expression against a JSON context.
pub fn eval(src: &str, ctx: &Json) -> Result<Json, Error> {
    // Most expressions are a plain path (`item.email`, `nodes.list.output.customers`):
    // read it from the context as is. minijinja would first convert the whole context
    // (every input, every upstream output it holds) into its own values, once per
    // expression — for a fan-out's items, once per item.
    if let Some(v) = plain_path(src, ctx) {
        return Ok(v.clone());
    }
    let eval_err = |e: minijinja::Error| Error::Eval {
        src: src.to_string(),
        reason: short_reason(&e),
    };
    let expr = environment().compile_expression(src).map_err(eval_err)?;
    let value = expr
        .eval(minijinja::Value::from(minijinja::value::Serde(ctx)))
        .map_err(eval_err)?;
    if value.is_undefined() {
        return Err(Error::Eval {
            src: src.to_string(),
            reason: "the value is undefined".to_string(),
        });
    }
    serde_json::to_value(&value).map_err(|e| Error::Eval {
        src: src.to_string(),
        reason: e.to_string(),
    })
}

/// The value at `src` when `src` is a dotted path of plain names (`a.b_c.d`) that every
/// step of finds in an object; `None` sends the expression to minijinja, which says
/// what is undefined where.
fn plain_path<'c>(src: &str, ctx: &'c Json) -> Option<&'c Json> {
    let mut at = ctx;
    for part in src.trim().split('.') {
        let mut chars = part.chars();
        let first = chars.next()?;
        let plain = (first.is_ascii_alphabetic() || first == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain || matches!(part, "true" | "false" | "none" | "True" | "False" | "None") {
            return None;
        }
        at = at.as_object()?.get(part)?;
    }
    Some(at)
}

/// [`plain_path`], giving the value itself out of a context the caller owns.
fn take_plain_path(src: &str, ctx: &mut Json) -> Option<Json> {
    plain_path(src, ctx)?;
    let mut at = ctx;
    for part in src.trim().split('.') {
        at = at.as_object_mut()?.get_mut(part)?;
    }
    Some(std::mem::take(at))
}

/// Evaluates an `if:` condition to its truthiness. A condition is one expression (see
/// `parse::nodes::condition`); anything else is an error here rather than a non-empty string,
/// which would always be true.
pub fn eval_condition(t: &Template, ctx: &Json) -> Result<bool, Error> {
    match t.whole_expr() {
        Some(src) => eval(src, ctx).map(|v| is_truthy(&v)),
        None => Err(Error::Eval {
            src: t
                .segments
                .iter()
                .map(|s| match s {
                    Segment::Lit(x) | Segment::Expr(x) => x.as_str(),
                })
                .collect(),
            reason: "a condition must be one expression".to_string(),
        }),
    }
}

/// Truthiness of a rendered `if:` value, as in the expression language.
pub fn is_truthy(value: &Json) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// The secret names a set of templates reads (`secrets.NAME`), sorted, each once: what
/// the gateway resolves for one call and what a run checks up front.
pub fn secret_names<'a>(templates: impl IntoIterator<Item = &'a Template>) -> Vec<String> {
    let mut names: Vec<String> = templates
        .into_iter()
        .flat_map(|t| t.exprs().flat_map(references).collect::<Vec<_>>())
        .filter_map(|r| {
            r.strip_prefix("secrets.")
                .map(|n| n.split('.').next().unwrap_or(n).to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The dotted variable paths an expression reads (`inputs.x`, `nodes.a.output.total`).
pub fn references(src: &str) -> Vec<String> {
    match environment().compile_expression(src) {
        Ok(expr) => {
            let mut refs: Vec<String> = expr.undeclared_variables(true).into_iter().collect();
            refs.sort();
            refs
        }
        Err(_) => Vec::new(),
    }
}

fn short_reason(e: &minijinja::Error) -> String {
    let mut reason = e
        .detail()
        .map_or_else(|| e.kind().to_string(), str::to_string);
    if let Some(source) = std::error::Error::source(e) {
        reason.push_str(&format!(": {source}"));
    }
    reason
}

/// Index of the `}}` that closes an expression, skipping braces and quotes inside it.
fn find_close(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 1;
            } else if b == q {
                quote = None;
            }
        } else {
            match b {
                b'"' | b'\'' => quote = Some(b),
                b'{' => depth += 1,
                b'}' if depth > 0 => depth -= 1,
                b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(i),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

impl TValue {
    /// Renders every template inside.
    pub fn render(&self, ctx: &Json) -> Result<Json, Error> {
        Ok(match self {
            Self::Const(v) => v.clone(),
            Self::Str(t) => t.render(ctx)?,
            Self::Seq(items) => Json::Array(
                items
                    .iter()
                    .map(|i| i.render(ctx))
                    .collect::<Result<_, _>>()?,
            ),
            Self::Map(entries) => Json::Object(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), v.render(ctx)?)))
                    .collect::<Result<_, Error>>()?,
            ),
        })
    }

    /// [`TValue::render`] in a context the caller gives up: a value that is one plain
    /// path (`${{ inputs.customers }}`) is moved out of it rather than copied, so a
    /// large list is not held twice while it is read.
    pub fn render_owned(&self, mut ctx: Json) -> Result<Json, Error> {
        if let Self::Str(t) = self
            && let Some(src) = t.whole_expr()
            && let Some(v) = take_plain_path(src, &mut ctx)
        {
            return Ok(v);
        }
        self.render(&ctx)
    }

    /// Visits every template inside.
    pub fn templates(&self) -> Vec<&Template> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(v) = stack.pop() {
            match v {
                Self::Const(_) => {}
                Self::Str(t) => out.push(t),
                Self::Seq(items) => stack.extend(items.iter().rev()),
                Self::Map(entries) => stack.extend(entries.iter().rev().map(|(_, v)| v)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_path_reads_the_same_value_minijinja_would() {
        let ctx = serde_json::json!({
            "inputs": { "n": 3, "f": 1.5, "big": u64::MAX, "s": "x", "nul": null },
            "nodes": { "a": { "output": { "list": [1, { "k": "v" }], "obj": { "z": 1, "a": 2 } } } },
            "item": { "id": "c1" },
        });
        for src in [
            "inputs.n",
            "inputs.f",
            "inputs.big",
            "inputs.s",
            "inputs.nul",
            "nodes.a.output.list",
            "nodes.a.output.obj",
            "item.id",
            " item.id ",
        ] {
            let fast = plain_path(src, &ctx).cloned();
            assert!(fast.is_some(), "{src} is a plain path");
            let expr = environment().compile_expression(src).expect("compiles");
            let slow = expr
                .eval(minijinja::Value::from(minijinja::value::Serde(&ctx)))
                .expect("evaluates");
            let slow = serde_json::to_value(&slow).expect("to json");
            assert_eq!(fast, Some(slow), "{src}");
        }
        for src in [
            "inputs.missing",
            "inputs.s.len",
            "inputs.n + 1",
            "nodes.a.output.list.0",
            "true",
        ] {
            assert!(plain_path(src, &ctx).is_none(), "{src} goes to minijinja");
        }
        assert!(
            eval("inputs.missing", &ctx).is_err(),
            "undefined is still an error"
        );
    }
    use serde_json::json;

    fn t(text: &str) -> Template {
        Template::parse(text, Pos::default()).expect("parses")
    }

    #[test]
    fn whole_expressions_keep_their_type() {
        let ctx =
            json!({"inputs": {"n": 41, "name": "ada"}, "nodes": {"a": {"output": {"total": 5}}}});
        assert_eq!(t("${{ inputs.n + 1 }}").render(&ctx), Ok(json!(42)));
        assert_eq!(
            t("${{ nodes.a.output }}").render(&ctx),
            Ok(json!({"total": 5}))
        );
        assert_eq!(t("n=${{ inputs.n }}").render(&ctx), Ok(json!("n=41")));
        assert_eq!(
            t("hi ${{ inputs.name }}!").render(&ctx),
            Ok(json!("hi ada!"))
        );
        assert_eq!(t("plain").render(&ctx), Ok(json!("plain")));
        assert_eq!(
            t("${{ nodes.a.output.total > 0 }}").render(&ctx),
            Ok(json!(true))
        );
    }

    #[test]
    fn closing_braces_inside_literals_do_not_end_the_expression() {
        let tpl = t("${{ {'a': {'b': 1}} }}");
        assert_eq!(tpl.whole_expr(), Some("{'a': {'b': 1}}"));
        assert_eq!(t("${{ '}}' }}").render(&json!({})), Ok(json!("}}")));
    }

    #[test]
    fn bad_templates_are_rejected() {
        assert_eq!(
            Template::parse("${{ a", Pos::default()),
            Err(Error::Unclosed)
        );
        assert_eq!(Template::parse("${{ }}", Pos::default()), Err(Error::Empty));
        assert!(matches!(
            Template::parse("${{ a + }}", Pos::default()),
            Err(Error::Syntax { .. })
        ));
    }

    /// Values templated into a URL are inserted as they are; `urlencode` escapes all but
    /// `/` (Jinja's rule), and `replace` escapes that too for a single path segment (the
    /// README's http example shows both).
    #[test]
    fn urlencode_escapes_a_value_for_a_url() {
        let ctx = json!({"with": {"order": "a/b c?d=1&e"}});
        assert_eq!(
            t("https://x/refunds/${{ with.order | urlencode }}").render(&ctx),
            Ok(json!("https://x/refunds/a/b%20c%3Fd%3D1%26e"))
        );
        assert_eq!(
            t("https://x/refunds/${{ with.order | urlencode | replace('/', '%2F') }}").render(&ctx),
            Ok(json!("https://x/refunds/a%2Fb%20c%3Fd%3D1%26e"))
        );
        assert_eq!(
            t("https://x/refunds/${{ with.order }}").render(&ctx),
            Ok(json!("https://x/refunds/a/b c?d=1&e")),
            "as is without the filter"
        );
    }

    #[test]
    fn undefined_values_are_errors_not_nulls() {
        let err = t("${{ inputs.missing }}").render(&json!({"inputs": {}}));
        assert!(matches!(err, Err(Error::Eval { .. })), "{err:?}");
    }

    #[test]
    fn references_are_dotted_paths() {
        assert_eq!(
            references("nodes.a.output.total > inputs.min and secrets.X"),
            vec!["inputs.min", "nodes.a.output.total", "secrets.X"]
        );
    }

    #[test]
    fn truthiness() {
        assert!(!is_truthy(&json!(0)));
        assert!(is_truthy(&json!("x")));
        assert!(!is_truthy(&json!(null)));
        assert!(!is_truthy(&json!([])));
    }
}

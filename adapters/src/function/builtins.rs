//! The `core.*` functions every registry starts with (documented in the module docs).

use std::time::Duration;

use serde_json::{Map, Number, Value, json};

use super::{FunctionSpec, Registry};
use crate::{Error, FailureKind};

/// A synchronous built-in.
type Builtin = fn(Value) -> Result<Value, Error>;

/// Registers every built-in into a fresh registry.
pub(super) fn register_all(registry: &Registry) {
    let builtins: [(&str, &str, Builtin); 9] = [
        ("core.echo", "Returns its arguments.", |args| Ok(args)),
        ("core.fail", "Fails with the given kind and message.", fail),
        (
            "core.merge",
            "Shallow-merges objects; later keys win.",
            merge,
        ),
        ("core.template", "Returns `text`, already rendered.", text),
        ("core.format", "Returns `text`, already rendered.", text),
        ("core.sum", "Adds `values`.", sum),
        ("core.pick", "Keeps only `keys` of `object`.", pick),
        ("core.get", "Reads `path` (dotted) out of `value`.", get),
        ("core.json_parse", "Parses `text` as JSON.", json_parse),
    ];
    for (name, description, function) in builtins {
        // A fresh registry cannot hold duplicates; ignoring keeps construction infallible.
        let _ = registry.register(name, FunctionSpec::pure(description), move |args| {
            std::future::ready(function(args))
        });
    }
    let _ = registry.register(
        "core.sleep",
        FunctionSpec::pure("Sleeps for `duration` or `ms`."),
        sleep,
    );
}

/// The arguments object of built-in `name`, with every key checked against `allowed`
/// so a typo fails loudly instead of being ignored.
fn object<'a>(
    name: &str,
    args: &'a Value,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, Error> {
    let map = match args {
        Value::Object(map) => map,
        other => {
            return Err(Error::permanent(format!(
                "{name}: arguments must be an object, got {}",
                type_name(other)
            )));
        }
    };
    let unknown: Vec<&str> = map
        .keys()
        .map(String::as_str)
        .filter(|key| !allowed.contains(key))
        .collect();
    if !unknown.is_empty() {
        return Err(Error::permanent(format!(
            "{name}: unknown argument(s) {}; expected {}",
            quote_list(&unknown),
            quote_list(allowed)
        )));
    }
    Ok(map)
}

fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn required<'a>(name: &str, map: &'a Map<String, Value>, key: &str) -> Result<&'a Value, Error> {
    map.get(key)
        .ok_or_else(|| Error::permanent(format!("{name}: missing required argument `{key}`")))
}

async fn sleep(args: Value) -> Result<Value, Error> {
    let name = "core.sleep";
    let map = object(name, &args, &["duration", "ms"])?;
    let duration = match (map.get("duration"), map.get("ms")) {
        (Some(Value::String(text)), None) => humantime::parse_duration(text).map_err(|e| {
            Error::permanent(format!(
                "{name}: bad `duration` {text:?}: {e} (e.g. \"250ms\", \"2s\")"
            ))
        })?,
        (None, Some(ms)) => Duration::from_millis(ms.as_u64().ok_or_else(|| {
            Error::permanent(format!("{name}: `ms` must be a non-negative integer"))
        })?),
        (Some(_), Some(_)) => {
            return Err(Error::permanent(format!(
                "{name}: give `duration` or `ms`, not both"
            )));
        }
        (Some(other), None) => {
            return Err(Error::permanent(format!(
                "{name}: `duration` must be a string like \"250ms\", got {}",
                type_name(other)
            )));
        }
        (None, None) => {
            return Err(Error::permanent(format!(
                "{name}: missing `duration` or `ms`"
            )));
        }
    };
    tokio::time::sleep(duration).await;
    Ok(json!({ "slept_ms": duration.as_millis() as u64 }))
}

fn fail(args: Value) -> Result<Value, Error> {
    let name = "core.fail";
    let map = object(name, &args, &["message", "kind", "retry_after_ms"])?;
    let message = match map.get("message") {
        None => "core.fail".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    let retry_after = match map.get("retry_after_ms") {
        None => None,
        Some(value) => Some(Duration::from_millis(value.as_u64().ok_or_else(|| {
            Error::permanent(format!(
                "{name}: `retry_after_ms` must be a non-negative integer"
            ))
        })?)),
    };
    let kind = match map.get("kind").map(|k| k.as_str()) {
        None | Some(Some("permanent")) => FailureKind::Permanent,
        Some(Some("transient")) => FailureKind::Transient { retry_after },
        Some(Some("unknown")) => FailureKind::Unknown,
        Some(Some("not_sent")) => FailureKind::NotSent,
        Some(_) => {
            return Err(Error::permanent(format!(
                "{name}: `kind` must be one of permanent, transient, unknown, not_sent"
            )));
        }
    };
    Err(Error::new(kind, message))
}

fn merge(args: Value) -> Result<Value, Error> {
    let name = "core.merge";
    let map = match &args {
        Value::Object(map) => map,
        other => {
            return Err(Error::permanent(format!(
                "{name}: arguments must be an object, got {}",
                type_name(other)
            )));
        }
    };
    let parts: Vec<&Value> = match map.get("objects") {
        Some(Value::Array(items)) if map.len() == 1 => items.iter().collect(),
        Some(Value::Array(_)) => {
            return Err(Error::permanent(format!(
                "{name}: with `objects`, no other argument is allowed"
            )));
        }
        _ => map.values().collect(),
    };
    let mut out = Map::new();
    for (index, part) in parts.into_iter().enumerate() {
        match part {
            Value::Object(fields) => out.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Value::Null => {}
            other => {
                return Err(Error::permanent(format!(
                    "{name}: item {index} is {}, not an object",
                    type_name(other)
                )));
            }
        }
    }
    Ok(Value::Object(out))
}

fn text(args: Value) -> Result<Value, Error> {
    let name = "core.template";
    let map = object(name, &args, &["text"])?;
    match required(name, map, "text")? {
        Value::String(text) => Ok(Value::String(text.clone())),
        other => Ok(Value::String(other.to_string())),
    }
}

fn sum(args: Value) -> Result<Value, Error> {
    let name = "core.sum";
    let map = object(name, &args, &["values"])?;
    let Value::Array(values) = required(name, map, "values")? else {
        return Err(Error::permanent(format!(
            "{name}: `values` must be an array"
        )));
    };
    let mut int_total: Option<i64> = Some(0);
    let mut float_total = 0.0_f64;
    for (index, value) in values.iter().enumerate() {
        let Value::Number(number) = value else {
            return Err(Error::permanent(format!(
                "{name}: values[{index}] is {}, not a number",
                type_name(value)
            )));
        };
        int_total = match (int_total, number.as_i64()) {
            (Some(total), Some(n)) => total.checked_add(n),
            _ => None,
        };
        float_total += number.as_f64().unwrap_or(0.0);
    }
    match int_total {
        Some(total) => Ok(Value::Number(total.into())),
        None => Number::from_f64(float_total)
            .map(Value::Number)
            .ok_or_else(|| Error::permanent(format!("{name}: the sum is not a finite number"))),
    }
}

fn pick(args: Value) -> Result<Value, Error> {
    let name = "core.pick";
    let map = object(name, &args, &["object", "keys"])?;
    let Value::Object(source) = required(name, map, "object")? else {
        return Err(Error::permanent(format!(
            "{name}: `object` must be an object"
        )));
    };
    let Value::Array(keys) = required(name, map, "keys")? else {
        return Err(Error::permanent(format!(
            "{name}: `keys` must be an array of strings"
        )));
    };
    let mut out = Map::new();
    for key in keys {
        let Value::String(key) = key else {
            return Err(Error::permanent(format!(
                "{name}: `keys` must be an array of strings"
            )));
        };
        if let Some(value) = source.get(key) {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(Value::Object(out))
}

fn get(args: Value) -> Result<Value, Error> {
    let name = "core.get";
    let map = object(name, &args, &["value", "path"])?;
    let value = required(name, map, "value")?;
    let Value::String(path) = required(name, map, "path")? else {
        return Err(Error::permanent(format!(
            "{name}: `path` must be a string like \"a.b.0\""
        )));
    };
    let mut current = value;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let next = match current {
            Value::Object(fields) => fields.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(value) => current = value,
            None => return Ok(Value::Null),
        }
    }
    Ok(current.clone())
}

fn json_parse(args: Value) -> Result<Value, Error> {
    let name = "core.json_parse";
    let map = object(name, &args, &["text"])?;
    let Value::String(text) = required(name, map, "text")? else {
        return Err(Error::permanent(format!("{name}: `text` must be a string")));
    };
    serde_json::from_str(text)
        .map_err(|e| Error::permanent(format!("{name}: `text` is not valid JSON: {e}")))
}

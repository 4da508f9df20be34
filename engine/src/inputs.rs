//! Run inputs: from `--input K=V` and `--inputs-file`, typed by the workflow's
//! declarations, checked before anything is written.
//!
//! Bounded like workflow files: the inputs file is read through
//! [`crate::read_limited`] (1 MiB), its nesting is checked on the YAML event stream
//! before it is deserialized (64 levels, as in workflow files: deserializing a file
//! nested 100,000 deep took 101 s), and the resolved inputs may take at most
//! [`MAX_INPUTS_BYTES`] as JSON, since every run row stores them.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::workflow::model::InputDecl;
use crate::workflow::{InputType, Workflow};

/// Largest run inputs accepted, measured as compact JSON: 1 MiB. Inputs are stored
/// with the run (and hashed, and read by every step's expressions); data this large
/// belongs in a file or object store the workflow reads, not in the ledger.
pub const MAX_INPUTS_BYTES: usize = 1024 * 1024;

/// Deepest nesting accepted in an inputs file, the same as in workflow files.
pub const MAX_DEPTH: usize = crate::workflow::yaml::MAX_DEPTH;

/// Why inputs were refused (exit code 2: invalid input).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// `--input` without `=`.
    #[error("--input `{0}`: expected NAME=VALUE")]
    Syntax(String),
    /// A name the workflow does not declare.
    #[error("unknown input `{name}` (declared: {declared})")]
    Unknown {
        /// The name given.
        name: String,
        /// The declared names.
        declared: String,
    },
    /// A value of the wrong type.
    #[error("input `{name}` must be {expected}, got {got}")]
    Type {
        /// The input.
        name: String,
        /// The declared type.
        expected: &'static str,
        /// What was given.
        got: String,
    },
    /// A required input without a value or default.
    #[error("missing required input `{0}`")]
    Missing(String),
    /// The same `--input` name given twice (the later one would silently win).
    #[error("--input `{0}` is given twice")]
    Duplicate(String),
    /// The inputs are over [`MAX_INPUTS_BYTES`] as JSON.
    #[error("inputs are {size} bytes as JSON, over the limit of {limit} bytes (1 MiB)")]
    TooLarge {
        /// Their size (at least; counting stops at the first value over the limit).
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The inputs file could not be read or parsed.
    #[error("inputs file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// Resolves the run's inputs: file values, then `--input` pairs on top, then defaults;
/// every value type-checked against its declaration.
pub fn resolve(wf: &Workflow, pairs: &[String], file: Option<&Path>) -> Result<Json, Error> {
    let mut values = Map::new();
    if let Some(path) = file {
        let text = crate::read_limited::read_to_string(path, crate::read_limited::MAX_FILE_BYTES)
            .map_err(|e| Error::File {
            path: path.display().to_string(),
            reason: e.reason(),
        })?;
        let file_err = |reason: String| Error::File {
            path: path.display().to_string(),
            reason,
        };
        // JSON first: it is what most inputs files are, and a YAML parser holds a 470 KB
        // JSON list (one flow collection, a 10,000-item `for_each` list) as tens of MiB
        // while it reads it — the depth check's event stream as much as the parse
        // (`benches/README.md`, "Fan-out"). serde_json stops at 128 levels by itself;
        // what it parsed is measured, and only text it refuses goes to the YAML side.
        let parsed: Json = match serde_json::from_str(&text) {
            Ok(v) if json_depth(&v) > MAX_DEPTH => {
                return Err(file_err(format!(
                    "values are nested more than {MAX_DEPTH} levels deep"
                )));
            }
            Ok(v) => v,
            Err(_) => {
                check_depth(&text).map_err(file_err)?;
                yaml_serde::from_str(&text).map_err(|e| file_err(e.to_string()))?
            }
        };
        let Json::Object(map) = parsed else {
            return Err(Error::File {
                path: path.display().to_string(),
                reason: "must hold a mapping of input names to values".into(),
            });
        };
        insert_checked(&wf.inputs, map, &mut values)?;
    }
    let mut given = BTreeSet::new();
    for pair in pairs {
        if pair.len() > MAX_INPUTS_BYTES {
            // Refused before it is parsed: a 200 MB `--input` would be parsed, copied and
            // hashed before the total is checked.
            return Err(Error::TooLarge {
                size: pair.len(),
                limit: MAX_INPUTS_BYTES,
            });
        }
        let (name, raw) = pair
            .split_once('=')
            .ok_or_else(|| Error::Syntax(pair.clone()))?;
        if !given.insert(name) {
            return Err(Error::Duplicate(name.to_string()));
        }
        let ty = declared(&wf.inputs, name)?;
        values.insert(name.to_string(), parse_typed(name, ty, raw)?);
    }
    complete(&wf.inputs, values)
}

/// The run's inputs from a JSON object (the operator API's `inputs`), checked and
/// completed with defaults exactly as [`resolve`] does for an inputs file.
pub fn from_json(wf: &Workflow, given: Map<String, Json>) -> Result<Json, Error> {
    declared_from_json(&wf.inputs, given)
}

/// Values for `decls` (an approval's inputs) from a JSON object, checked and completed
/// with defaults as a run's are.
pub fn declared_from_json(decls: &[InputDecl], given: Map<String, Json>) -> Result<Json, Error> {
    let mut values = Map::new();
    insert_checked(decls, given, &mut values)?;
    complete(decls, values)
}

/// `NAME=VALUE` pairs (the CLI's `--input` of `flow approve`) typed by `decls`: a
/// string input takes the text as is, others parse as their type.
pub fn pairs_to_json(decls: &[InputDecl], pairs: &[String]) -> Result<Map<String, Json>, Error> {
    let mut values = Map::new();
    for pair in pairs {
        let (name, raw) = pair
            .split_once('=')
            .ok_or_else(|| Error::Syntax(pair.clone()))?;
        if values.contains_key(name) {
            return Err(Error::Duplicate(name.to_string()));
        }
        let ty = declared(decls, name)?;
        values.insert(name.to_string(), parse_typed(name, ty, raw)?);
    }
    Ok(values)
}

/// Type-checks each of `given` against its declaration into `values`.
fn insert_checked(
    decls: &[InputDecl],
    given: Map<String, Json>,
    values: &mut Map<String, Json>,
) -> Result<(), Error> {
    for (name, value) in given {
        let ty = declared(decls, &name)?;
        check(&name, ty, &value)?;
        values.insert(name, value);
    }
    Ok(())
}

/// Defaults for what was not given, refusing missing required inputs and inputs over
/// [`MAX_INPUTS_BYTES`].
fn complete(decls: &[InputDecl], mut values: Map<String, Json>) -> Result<Json, Error> {
    for decl in decls {
        if values.contains_key(&decl.name) {
            continue;
        }
        match &decl.default {
            Some(default) => {
                values.insert(decl.name.clone(), default.clone());
            }
            None if decl.required => return Err(Error::Missing(decl.name.clone())),
            None => {
                values.insert(decl.name.clone(), Json::Null);
            }
        }
    }
    let inputs = Json::Object(values);
    let size = inputs.to_string().len();
    if size > MAX_INPUTS_BYTES {
        return Err(Error::TooLarge {
            size,
            limit: MAX_INPUTS_BYTES,
        });
    }
    Ok(inputs)
}

/// How deeply `v` nests arrays and objects (a scalar: 0), without recursion.
fn json_depth(v: &Json) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Json>> = match v {
            Json::Array(items) => Box::new(items.iter()),
            Json::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(d + 1);
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

/// Refuses YAML (or JSON) text nested deeper than [`MAX_DEPTH`], reading only the event
/// stream up to the first level too deep: cheap, and it runs before the deserializer,
/// whose time grows with the square of the depth. A syntax error is left for the
/// deserializer to report, in its words.
fn check_depth(text: &str) -> Result<(), String> {
    use saphyr_parser::{Event, Parser};
    let mut depth = 0usize;
    for item in Parser::new_from_str(text) {
        let (event, span) = match item {
            Ok(next) => next,
            // The scanner reads flow collections ahead and stops past 255 open levels
            // with this message, before their events come out.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Err(format!(
                    "line {}: values are nested more than {MAX_DEPTH} levels deep",
                    e.marker().line()
                ));
            }
            Err(_) => return Ok(()),
        };
        match event {
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "line {}: values are nested more than {MAX_DEPTH} levels deep",
                        span.start.line()
                    ));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn declared(decls: &[InputDecl], name: &str) -> Result<InputType, Error> {
    let found = decls.iter().find(|d| d.name == name);
    found.map(|d| d.ty).ok_or_else(|| Error::Unknown {
        name: name.to_string(),
        declared: if decls.is_empty() {
            "none".to_string()
        } else {
            decls
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

fn check(name: &str, ty: InputType, value: &Json) -> Result<(), Error> {
    if ty.accepts(value) {
        Ok(())
    } else {
        Err(Error::Type {
            name: name.to_string(),
            expected: article(ty),
            got: value.to_string(),
        })
    }
}

fn article(ty: InputType) -> &'static str {
    match ty {
        InputType::String => "a string",
        InputType::Integer => "an integer",
        InputType::Number => "a number",
        InputType::Boolean => "true or false",
        InputType::Object => "a JSON object",
        InputType::Array => "a JSON array",
    }
}

/// `--input n=42` is an integer when `n` is declared `integer`; strings are taken as is.
fn parse_typed(name: &str, ty: InputType, raw: &str) -> Result<Json, Error> {
    let bad = || Error::Type {
        name: name.to_string(),
        expected: article(ty),
        got: format!("`{raw}`"),
    };
    let value = match ty {
        InputType::String => Json::String(raw.to_string()),
        InputType::Integer => raw
            .trim()
            .parse::<i64>()
            .map(Json::from)
            .map_err(|_| bad())?,
        InputType::Number => {
            let f = raw.trim().parse::<f64>().map_err(|_| bad())?;
            if let Ok(i) = raw.trim().parse::<i64>() {
                Json::from(i)
            } else {
                serde_json::Number::from_f64(f)
                    .map(Json::Number)
                    .ok_or_else(bad)?
            }
        }
        InputType::Boolean => match raw.trim() {
            "true" => Json::Bool(true),
            "false" => Json::Bool(false),
            _ => return Err(bad()),
        },
        InputType::Object | InputType::Array => {
            let v: Json = serde_json::from_str(raw).map_err(|_| bad())?;
            check(name, ty, &v)?;
            v
        }
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::parse_str;
    use serde_json::json;

    fn wf() -> crate::workflow::ValidWorkflow {
        parse_str(
            "inputs:\n  n: { type: integer, required: true }\n  x: { type: number, default: 1.5 }\n  s: { type: string }\n  b: { type: boolean, default: false }\n  o: { type: object, default: {} }\ntools:\n  t: { kind: function, function: core.echo }\nnodes:\n  a: { tool: t }\n",
            "w.yaml",
        )
        .expect("valid")
    }

    #[test]
    fn pairs_are_typed_by_declaration() {
        let v = resolve(
            &wf(),
            &[
                "n=42".into(),
                "s=42".into(),
                "b=true".into(),
                "o={\"k\":1}".into(),
            ],
            None,
        )
        .expect("ok");
        assert_eq!(
            v,
            json!({"n": 42, "x": 1.5, "s": "42", "b": true, "o": {"k": 1}})
        );
    }

    #[test]
    fn bad_inputs_are_refused() {
        let w = wf();
        assert_eq!(resolve(&w, &[], None), Err(Error::Missing("n".into())));
        assert!(matches!(
            resolve(&w, &["n=4.5".into()], None),
            Err(Error::Type { .. })
        ));
        assert!(matches!(
            resolve(&w, &["n=1".into(), "b=yes".into()], None),
            Err(Error::Type { .. })
        ));
        assert!(matches!(
            resolve(&w, &["n=1".into(), "zz=1".into()], None),
            Err(Error::Unknown { .. })
        ));
        assert_eq!(
            resolve(&w, &["n".into()], None),
            Err(Error::Syntax("n".into()))
        );
    }

    #[test]
    fn duplicate_pairs_and_oversize_inputs_are_refused() {
        let w = wf();
        assert_eq!(
            resolve(&w, &["n=1".into(), "s=a".into(), "s=b".into()], None),
            Err(Error::Duplicate("s".into()))
        );
        let big = format!("s={}", "x".repeat(MAX_INPUTS_BYTES));
        assert!(matches!(
            resolve(&w, &["n=1".into(), big], None),
            Err(Error::TooLarge { .. })
        ));
        // Under the limit one by one, over it together (the limit is on the total).
        let half = "y".repeat(MAX_INPUTS_BYTES / 2 + 1);
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("in.json");
        std::fs::write(&f, format!("{{\"n\": 1, \"s\": \"{half}\"}}")).expect("write");
        assert!(matches!(
            resolve(&w, &[format!("o={{\"k\": \"{half}\"}}")], Some(&f)),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn a_deeply_nested_file_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("deep.json");
        let deep = 100_000;
        std::fs::write(
            &f,
            format!("{{\"o\": {}{}}}", "[".repeat(deep), "]".repeat(deep)),
        )
        .expect("write");
        let started = std::time::Instant::now();
        let err = resolve(&wf(), &["n=1".into()], Some(&f)).expect_err("too deep");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(err.to_string().contains("nested more than 64"), "{err}");
        // 64 levels are fine.
        std::fs::write(
            &f,
            format!("o: {}{}\nn: 1\n", "[".repeat(63), "]".repeat(63)),
        )
        .expect("write");
        assert!(matches!(
            resolve(&wf(), &[], Some(&f)),
            Err(Error::Type { .. })
        ));
    }

    #[test]
    fn inputs_file_yaml_or_json_and_pairs_win() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("in.yaml");
        std::fs::write(&f, "n: 7\ns: from-file\n").expect("write");
        let v = resolve(&wf(), &["s=cli".into()], Some(&f)).expect("ok");
        assert_eq!(v["n"], json!(7));
        assert_eq!(v["s"], json!("cli"));
        std::fs::write(&f, "{\"n\": \"seven\"}").expect("write");
        assert!(matches!(
            resolve(&wf(), &[], Some(&f)),
            Err(Error::Type { .. })
        ));
    }
}

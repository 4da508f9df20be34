//! Run inputs: from `--input K=V` and `--inputs-file`, typed by the workflow's
//! declarations, checked before anything is written.

use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::workflow::{InputType, Workflow};

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
        let text = std::fs::read_to_string(path).map_err(|e| Error::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let parsed: Json = yaml_serde::from_str(&text).map_err(|e| Error::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let Json::Object(map) = parsed else {
            return Err(Error::File {
                path: path.display().to_string(),
                reason: "must hold a mapping of input names to values".into(),
            });
        };
        for (name, value) in map {
            let ty = declared(wf, &name)?;
            check(&name, ty, &value)?;
            values.insert(name, value);
        }
    }
    for pair in pairs {
        let (name, raw) = pair
            .split_once('=')
            .ok_or_else(|| Error::Syntax(pair.clone()))?;
        let ty = declared(wf, name)?;
        values.insert(name.to_string(), parse_typed(name, ty, raw)?);
    }
    for decl in &wf.inputs {
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
    Ok(Json::Object(values))
}

fn declared(wf: &Workflow, name: &str) -> Result<InputType, Error> {
    wf.input(name).map(|d| d.ty).ok_or_else(|| Error::Unknown {
        name: name.to_string(),
        declared: if wf.inputs.is_empty() {
            "none".to_string()
        } else {
            wf.inputs
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

    fn wf() -> Workflow {
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

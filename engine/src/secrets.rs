//! Secrets: where their values come from, and how they are kept off disk and out of logs.
//!
//! Values come from the environment (`FLOW_SECRET_<NAME>`) or a dotenv file
//! (`--secrets-file`); the environment wins. The ledger stores `{"$secret": "NAME"}` in
//! place of a value ([`REDACTED_KEY`]), and every output, error message and log line that
//! leaves the gateway goes through [`Secrets::scrub`] first, so a downstream that echoes a
//! token back cannot smuggle it into the database.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde_json::Value as Json;

/// Prefix of the environment variables that provide secrets.
pub const ENV_PREFIX: &str = "FLOW_SECRET_";
/// The key of the object that stands in for a secret value in stored requests.
pub const REDACTED_KEY: &str = "$secret";

/// Why secrets could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The secrets file could not be read or parsed.
    #[error("cannot read secrets file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong (never a value).
        reason: String,
    },
    /// The secrets file is over [`crate::read_limited::MAX_FILE_BYTES`] (1 MiB); reading
    /// stopped there (`--secrets-file /dev/zero` is refused at once; exit 2).
    #[error("secrets file {path} is larger than the limit of {limit} bytes (1 MiB)")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
}

/// The secret values available to a process. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    values: BTreeMap<String, String>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// Loads the optional dotenv file, then `FLOW_SECRET_*` from the environment on top.
    pub fn load(file: Option<&Path>) -> Result<Self, Error> {
        let mut values = BTreeMap::new();
        if let Some(path) = file {
            let bytes = crate::read_limited::read(path, crate::read_limited::MAX_FILE_BYTES)
                .map_err(|e| match e {
                    crate::read_limited::Error::TooLarge { limit, .. } => Error::TooLarge {
                        path: path.display().to_string(),
                        limit,
                    },
                    other => Error::File {
                        path: path.display().to_string(),
                        reason: other.reason(),
                    },
                })?;
            let iter = dotenvy::from_read_iter(bytes.as_slice());
            for item in iter {
                let (name, value) = item.map_err(|e| Error::File {
                    path: path.display().to_string(),
                    reason: describe(&e),
                })?;
                values.insert(
                    name.strip_prefix(ENV_PREFIX).unwrap_or(&name).to_string(),
                    value,
                );
            }
        }
        for (key, value) in std::env::vars() {
            if let Some(name) = key.strip_prefix(ENV_PREFIX)
                && !name.is_empty()
            {
                values.insert(name.to_string(), value);
            }
        }
        Ok(Self { values })
    }

    /// Secrets from explicit pairs (embedders, tests).
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        Self {
            values: pairs.into_iter().collect(),
        }
    }

    /// The value of a secret.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The names of every loaded secret.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// The expression-context object for the named secrets: real values, or, with
    /// `redacted`, `{"$secret": NAME}` stand-ins. Missing names are left out, so an
    /// expression reading one fails with a clear "undefined" error (checked earlier by
    /// [`Secrets::missing`]).
    pub fn context<'a>(&self, names: impl IntoIterator<Item = &'a str>, redacted: bool) -> Json {
        let mut map = serde_json::Map::new();
        for name in names {
            if let Some(value) = self.get(name) {
                let v = if redacted {
                    placeholder(name)
                } else {
                    Json::String(value.to_string())
                };
                map.insert(name.to_string(), v);
            }
        }
        Json::Object(map)
    }

    /// The first of `names` that has no value.
    pub fn missing<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        names.into_iter().find(|n| self.get(n).is_none())
    }

    /// Replaces every secret value inside `text` by its stand-in.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        // Longest first, so a secret that contains another is replaced whole.
        let mut pairs: Vec<(&String, &String)> =
            self.values.iter().filter(|(_, v)| !v.is_empty()).collect();
        pairs.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        for (name, value) in pairs {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &placeholder_text(name));
            }
        }
        out
    }

    /// [`Secrets::scrub`] applied to every string (and object key) in a JSON value.
    pub fn scrub_json(&self, value: &Json) -> Json {
        if self.values.is_empty() {
            return value.clone();
        }
        match value {
            Json::String(s) => Json::String(self.scrub(s)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.scrub_json(v)).collect()),
            Json::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (self.scrub(k), self.scrub_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// `{"$secret": NAME}`: what the ledger stores instead of a whole secret value.
pub fn placeholder(name: &str) -> Json {
    let mut map = serde_json::Map::new();
    map.insert(REDACTED_KEY.to_string(), Json::String(name.to_string()));
    Json::Object(map)
}

/// The stand-in used inside a longer string (`Bearer {"$secret":"TOKEN"}`).
pub fn placeholder_text(name: &str) -> String {
    placeholder(name).to_string()
}

/// dotenvy errors can quote the offending line, which may hold a value: describe the
/// error by kind only.
fn describe(e: &dotenvy::Error) -> String {
    match e {
        dotenvy::Error::LineParse(_, index) => format!("syntax error at character {index}"),
        dotenvy::Error::Io(io) => io.to_string(),
        dotenvy::Error::EnvVar(_) => "invalid variable".to_string(),
        _ => "unreadable".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scrub_replaces_values_everywhere() {
        let s = Secrets::from_pairs([
            ("TOKEN".into(), "s3cr3t-value".into()),
            ("PIN".into(), "s3cr3t".into()),
        ]);
        assert_eq!(
            s.scrub("Bearer s3cr3t-value and s3cr3t"),
            r#"Bearer {"$secret":"TOKEN"} and {"$secret":"PIN"}"#
        );
        let v = s.scrub_json(&json!({"echo": ["s3cr3t-value"], "s3cr3t": 1}));
        assert_eq!(
            v,
            json!({"echo": [r#"{"$secret":"TOKEN"}"#], r#"{"$secret":"PIN"}"#: 1})
        );
    }

    #[test]
    fn context_is_redacted_on_request() {
        let s = Secrets::from_pairs([("A".into(), "x".into())]);
        assert_eq!(s.context(["A", "B"], false), json!({"A": "x"}));
        assert_eq!(s.context(["A"], true), json!({"A": {"$secret": "A"}}));
        assert_eq!(s.missing(["A", "B"]), Some("B"));
    }

    #[test]
    fn dotenv_file_and_debug_never_show_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secrets.env");
        std::fs::write(&path, "API_TOKEN=abc123\nFLOW_SECRET_OTHER=\"q w\"\n").expect("write");
        let s = Secrets::load(Some(&path)).expect("loads");
        assert_eq!(s.get("API_TOKEN"), Some("abc123"));
        assert_eq!(s.get("OTHER"), Some("q w"));
        assert!(!format!("{s:?}").contains("abc123"));
        std::fs::write(&path, "GOOD=1\nBAD LINE=oops-secret\n").expect("write");
        let err = Secrets::load(Some(&path))
            .expect_err("bad file")
            .to_string();
        assert!(!err.contains("oops-secret"), "{err}");
    }
}

//! `flow.toml`: settings that belong to an installation rather than to one workflow.
//!
//! Read from `--config FILE` or `FLOW_CONFIG`; without either, `./flow.toml` if present,
//! else defaults. Unknown keys are errors, like in workflow files.
//!
//! ```toml
//! [egress]
//! allow = ["127.0.0.1", "*.example.com"]   # hosts http and mcp-url tools may reach
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why the configuration could not be loaded (exit code 5).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read config {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is not valid TOML or has unknown keys.
    #[error("invalid config {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        reason: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Outbound network policy.
    #[serde(default)]
    pub egress: Egress,
    /// Where the file came from (`None` = defaults).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// Which hosts `http` and `mcp` (URL) tools may reach.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// Allowed hosts; `*.example.com` matches subdomains. `None` (no `[egress]` table or
    /// no `allow` key) allows every host; an empty list allows none.
    pub allow: Option<Vec<String>>,
}

impl Config {
    /// Loads the configuration from `explicit`, else `./flow.toml` if it exists.
    pub fn load(explicit: Option<&Path>) -> Result<Self, Error> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                let default = PathBuf::from("flow.toml");
                if !default.exists() {
                    return Ok(Self::default());
                }
                default
            }
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|e| Error::Parse {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        config.path = Some(path);
        Ok(config)
    }
}

impl Egress {
    /// Whether `host` may be reached.
    pub fn allows(&self, host: &str) -> bool {
        let Some(allow) = &self.allow else {
            return true;
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        allow.iter().any(|pattern| {
            let pattern = pattern.to_ascii_lowercase();
            match pattern.strip_prefix("*.") {
                Some(suffix) => host.len() > suffix.len() && host.ends_with(&format!(".{suffix}")),
                None => pattern == "*" || pattern == host,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_patterns() {
        let e = Egress {
            allow: Some(vec!["127.0.0.1".into(), "*.example.com".into()]),
        };
        assert!(e.allows("127.0.0.1"));
        assert!(e.allows("api.example.com"));
        assert!(e.allows("API.Example.com."));
        assert!(!e.allows("example.com"));
        assert!(!e.allows("evil.com"));
        assert!(!e.allows("example.com.evil.com"));
        assert!(Egress::default().allows("anything"));
        assert!(
            !Egress {
                allow: Some(vec![])
            }
            .allows("127.0.0.1")
        );
    }

    #[test]
    fn unknown_keys_are_errors_with_a_position() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("flow.toml");
        std::fs::write(&p, "[egress]\nallow = [\"a\"]\nalow = 1\n").expect("write");
        let err = Config::load(Some(&p)).expect_err("unknown key").to_string();
        assert!(err.contains("alow") && err.contains("line 3"), "{err}");
        std::fs::write(&p, "[egress]\nallow = [\"a\"]\n").expect("write");
        assert_eq!(
            Config::load(Some(&p)).expect("ok").egress.allow,
            Some(vec!["a".to_string()])
        );
    }
}

//! `flow.toml`: settings that belong to an installation rather than to one workflow.
//!
//! Read from `--config FILE` or `FLOW_CONFIG`; without either, `./flow.toml` if present,
//! else defaults. Unknown keys are errors, like in workflow files.
//!
//! ```toml
//! [egress]
//! allow = ["127.0.0.1", "*.example.com"]   # hosts http and mcp-url tools may reach
//!
//! [[consumers]]                             # event consumers (see `crate::events`)
//! name = "ops-webhook"
//! kind = "webhook"
//! url = "https://ops.example.com/flow-events"
//! secret_name = "WEBHOOK"                   # FLOW_SECRET_WEBHOOK or --secrets-file
//! events = ["run.paused", "tool_call.in_doubt"]
//! timeout = "5s"
//! max_attempts = 64
//!
//! [[consumers]]
//! name = "audit"
//! kind = "file"
//! path = "/var/log/flow/events.jsonl"
//!
//! [[schedules]]                             # fired by every daemon, once per tick
//! id = "nightly"                            # (see `crate::schedule`)
//! workflow = "workflows/reconcile.yaml"
//! cron = "0 2 * * *"
//! timezone = "Europe/Paris"
//!
//! [[connections]]                           # OAuth sign-ins (`flow connect NAME`;
//! name = "tracker"                          #  see `crate::connections`)
//! server = "https://mcp.tracker.example/mcp"
//! scopes = ["issues:write"]
//!
//! [retention]                               # what is deleted, and when
//! runs = "30d"                              # (see `crate::retention`)
//! events = "7d"
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why the configuration could not be loaded (exit code 5, except [`Error::TooLarge`]:
/// 2, the path given is not a configuration file at all).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is over [`crate::read_limited::MAX_FILE_BYTES`] (1 MiB); reading stopped
    /// there, so `--config /dev/zero` is refused at once instead of filling memory.
    #[error("config {path} is larger than the limit of {limit} bytes (1 MiB)")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The file could not be read.
    #[error("cannot read config {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is not valid TOML, has an unknown key or a value of the wrong type:
    /// `FILE:LINE:COL: error: …`, the form workflow diagnostics and editors use.
    #[error("{path}:{line}:{column}: error: {message}")]
    At {
        /// The file.
        path: String,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// The parser's message, without its own location and excerpt.
        message: String,
    },
    /// A consumer's settings do not go together (checked after parsing).
    #[error("invalid config {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        reason: String,
    },
}

use crate::gateway::egress::Egress;
pub use crate::host_pattern::HostPattern;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Outbound network policy.
    #[serde(default)]
    pub egress: Egress,
    /// Event consumers (`[[consumers]]`), checked by [`ConsumerConfig::check`] when
    /// the file is loaded.
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
    /// The operator API (`flow serve`): its tokens.
    #[serde(default)]
    pub api: Api,
    /// `[[policy.approvals]]`: calls that need an approval whatever the workflow says.
    #[serde(default)]
    pub policy: crate::policy::Policy,
    /// `[[schedules]]` as written (checked into [`Config::schedules`] on load).
    #[serde(default, rename = "schedules")]
    pub schedule_entries: Vec<crate::schedule::ScheduleConfig>,
    /// The schedules every daemon fires (`crate::schedule`), checked.
    #[serde(skip)]
    pub schedules: Vec<crate::schedule::Schedule>,
    /// `[[connections]]`: MCP servers signed in to once by a person (`flow connect`).
    #[serde(default)]
    pub connections: Vec<crate::connections::ConnectionConfig>,
    /// `[retention]` as written (checked into [`Config::retention`] on load).
    #[serde(default, rename = "retention")]
    pub retention_entry: crate::retention::RetentionConfig,
    /// What retention deletes and how fast (`crate::retention`), checked.
    #[serde(skip)]
    pub retention: crate::retention::Retention,
    /// `[telemetry]`: where traces go (`crate::telemetry`; the environment's
    /// `OTEL_*` variables configure the rest).
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// `[mcp]`: the workflows agents may call as MCP tools (`crate::mcp`).
    #[serde(default)]
    pub mcp: Mcp,
    /// Where the file came from (`None` = defaults).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// `[api]`: who may use the operator API.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Api {
    /// `[[api.tokens]]`: bearer tokens; without any, `flow serve` refuses to start
    /// unless `--insecure-no-auth`.
    #[serde(default)]
    pub tokens: Vec<ApiToken>,
    /// `metrics_token = "NAME"`: `/metrics` of `flow serve` (and `flow daemon --serve`)
    /// then needs the bearer token of that `[[api.tokens]]` entry, for servers whose
    /// figures (run counts, tool names) are not for everyone who can reach the port.
    #[serde(default)]
    pub metrics_token: Option<String>,
    /// `public_url = "https://flow.example.com"`: the address downstreams reach
    /// `flow serve` at. `${{ callback.url }}` is built from it; a workflow with a
    /// `callback:` node is refused without it.
    #[serde(default)]
    pub public_url: Option<String>,
}

/// `[mcp]`: flow as an MCP server. Its workflows are tools an agent lists and calls
/// over `/mcp` (`flow serve`, `flow daemon --serve`) or stdio (`flow mcp serve`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mcp {
    /// Workflow files offered as tools: paths or globs (`workflows/*.yaml`), relative to
    /// the directory of `flow.toml`. Empty: `/mcp` answers 404.
    #[serde(default)]
    pub workflows: Vec<String>,
    /// How long identical calls without an idempotency key (same caller, tool and
    /// arguments) join the first call's run instead of starting another (default 5s):
    /// agent clients are seen sending one call twice, milliseconds apart, with new ids.
    #[serde(default)]
    pub window: Option<String>,
    /// How long a `tools/call` waits for its run before answering "still running"
    /// with the run id (default 20s, under the server's 30 s request limit).
    #[serde(default)]
    pub wait: Option<String>,
    /// `[[mcp.servers]]`: MCP servers whose tools flow offers as its own (the proxy),
    /// each call a one-node run through the gateway.
    #[serde(default)]
    pub servers: Vec<McpServer>,
}

/// One `[[mcp.servers]]` entry: a name (the prefix of its tools, `<name>__<tool>`) and
/// the settings of a workflow's `kind: mcp` tool — `server`, `auth`, `elicitation`,
/// `propagate_trace`, `timeout` — checked by the workflow parser when the proxy starts.
#[derive(Debug, Clone, Deserialize)]
pub struct McpServer {
    /// The prefix of its tools.
    pub name: String,
    /// The tool settings, as a workflow writes them.
    #[serde(flatten)]
    pub tool: toml::Table,
}

/// One `[[api.tokens]]` entry. It names the secret holding the token's value, never the
/// value itself (`flow.toml` is often committed).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// Recorded as `by` on everything the token does.
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: crate::role::Role,
    /// The secret whose value is the token (`FLOW_SECRET_<NAME>` or `--secrets-file`).
    pub secret: String,
}

impl Error {
    /// Whether the error is the user's input rather than the installation (exit 2, not 5).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }
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
        let text = crate::read_limited::read_to_string(&path, crate::read_limited::MAX_FILE_BYTES)
            .map_err(|e| match e {
                crate::read_limited::Error::TooLarge { limit, .. } => Error::TooLarge {
                    path: path.display().to_string(),
                    limit,
                },
                other => Error::Read {
                    path: path.display().to_string(),
                    reason: other.reason(),
                },
            })?;
        let mut config: Config = toml::from_str(&text).map_err(|e| located(&path, &text, &e))?;
        if let Some(read) = config.egress.allow_read.take() {
            let mut allow = Vec::with_capacity(read.len());
            for pattern in read {
                let start = pattern.span().start;
                HostPattern::parse(pattern.get_ref())
                    .map_err(|message| at(&path, &text, start, message))?;
                allow.push(pattern.into_inner());
            }
            config.egress.allow = Some(allow);
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &config.consumers {
            let problem = c.check().err().or_else(|| {
                (!seen.insert(c.name.as_str())).then(|| "the name is used twice".to_string())
            });
            if let Some(reason) = problem {
                return Err(Error::Parse {
                    path: path.display().to_string(),
                    reason: format!("consumer `{}`: {reason}", c.name),
                });
            }
        }
        for (i, rule) in config.policy.approvals.iter().enumerate() {
            rule.check().map_err(|reason| Error::Parse {
                path: path.display().to_string(),
                reason: format!("{}: {reason}", rule.label(i)),
            })?;
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &config.connections {
            let problem = c.check().err().or_else(|| {
                (!names.insert(c.name.as_str())).then(|| "the name is used twice".to_string())
            });
            if let Some(reason) = problem {
                return Err(Error::Parse {
                    path: path.display().to_string(),
                    reason: format!("connection `{}`: {reason}", c.name),
                });
            }
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        config.schedules = crate::schedule::check_all(&config.schedule_entries, &base)
            .map_err(|p| at(&path, &text, p.at, p.message))?;
        config.retention = config
            .retention_entry
            .check()
            .map_err(|p| at(&path, &text, p.at, p.message))?;
        if let Some(u) = &config.api.public_url {
            let ok = url::Url::parse(u)
                .is_ok_and(|p| matches!(p.scheme(), "http" | "https") && p.host().is_some());
            if !ok {
                return Err(Error::Parse {
                    path: path.display().to_string(),
                    reason: format!(
                        "[api] public_url `{u}` is not an http(s) URL (e.g. `https://flow.example.com`)"
                    ),
                });
            }
        }
        config.telemetry.check().map_err(|reason| Error::Parse {
            path: path.display().to_string(),
            reason,
        })?;
        config.path = Some(path);
        Ok(config)
    }

    /// Why this configuration cannot run `wf`: a `callback:` node needs
    /// `[api] public_url` (the URL it hands its downstream is built from it).
    pub fn refuses(&self, wf: &crate::workflow::Workflow) -> Option<String> {
        let node = wf.nodes.iter().find(|n| n.callback().is_some())?;
        self.api.public_url.is_none().then(|| {
            format!(
                "node `{}` has `callback:`, which needs `public_url` under `[api]` in flow.toml (the address downstreams reach `flow serve` at; `callback.url` is built from it)",
                node.id
            )
        })
    }
}

/// A TOML error at the line and column its span starts (the start of the file when the
/// parser gives no span).
fn located(path: &Path, text: &str, e: &toml::de::Error) -> Error {
    let start = e.span().map_or(0, |s| s.start);
    at(path, text, start, e.message().trim().to_string())
}

/// `message` at the line and column of byte `offset` of `text`.
fn at(path: &Path, text: &str, offset: usize, message: String) -> Error {
    let before = text.get(..offset.min(text.len())).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Error::At {
        path: path.display().to_string(),
        line,
        column,
        message,
    }
}

/// Default of [`ConsumerConfig::max_attempts`]: at least once, then a dead letter after
/// 64 attempts (about five hours of backoff), as in the runtime flow grew from.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 64;

/// Default of [`ConsumerConfig::timeout`] for webhooks.
pub const DEFAULT_WEBHOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a consumer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerKind {
    /// POST each event as JSON, signed with HMAC-SHA256.
    Webhook,
    /// Append each event as one JSON line, fsynced.
    File,
}

/// Where a consumer that has never run starts reading the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerStart {
    /// Every event still in the outbox (nothing is missed; the default).
    #[default]
    Beginning,
    /// Only events written after the consumer's first dispatch.
    Latest,
}

/// One `[[consumers]]` entry. A flat table rather than a tagged enum so that unknown
/// keys keep their line and column in the error; [`ConsumerConfig::check`] enforces
/// which keys go with which kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Unique name: the consumer checkpoint is kept under it, so renaming a consumer
    /// starts it afresh.
    pub name: String,
    /// `webhook` or `file`.
    pub kind: ConsumerKind,
    /// Webhook: the `http`/`https` URL events are POSTed to.
    pub url: Option<String>,
    /// Webhook: the name of the flow secret that signs the body (`FLOW_SECRET_<NAME>`
    /// or `--secrets-file`). A name, never the value: flow.toml is often committed.
    pub secret_name: Option<String>,
    /// File: the JSON-lines file to append to (created if missing).
    pub path: Option<PathBuf>,
    /// Event types to deliver (`run.paused`, or a family such as `run.*`); absent = all.
    pub events: Option<Vec<String>>,
    /// Webhook: bound on one delivery (connect, send, response), e.g. `5s`.
    pub timeout: Option<String>,
    /// Attempts before a delivery becomes a dead letter (`flow events --failed`).
    pub max_attempts: Option<u32>,
    /// Where a new consumer starts: `beginning` (default) or `latest`.
    #[serde(default)]
    pub start: ConsumerStart,
}

impl ConsumerConfig {
    /// Checks what serde cannot: names, the keys of each kind, event types, durations.
    pub fn check(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return Err("name: use 1 to 64 letters, digits, `_`, `-` and `.`".into());
        }
        match self.kind {
            ConsumerKind::Webhook => {
                let url = self.url.as_deref().ok_or("a webhook needs `url`")?;
                let parsed =
                    url::Url::parse(url).map_err(|e| format!("url: not a valid URL ({e})"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("url: use http or https, not `{}`", parsed.scheme()));
                }
                let secret = self
                    .secret_name
                    .as_deref()
                    .ok_or("a webhook needs `secret_name` (the flow secret that signs it)")?;
                if secret.is_empty()
                    || !secret
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(
                        "secret_name: a secret's name (letters, digits, `_`), not its value".into(),
                    );
                }
                if self.path.is_some() {
                    return Err("`path` goes with kind = \"file\"".into());
                }
            }
            ConsumerKind::File => {
                if self.path.is_none() {
                    return Err("a file consumer needs `path`".into());
                }
                for (key, set) in [
                    ("url", self.url.is_some()),
                    ("secret_name", self.secret_name.is_some()),
                    ("timeout", self.timeout.is_some()),
                ] {
                    if set {
                        return Err(format!("`{key}` goes with kind = \"webhook\""));
                    }
                }
            }
        }
        self.types()?;
        self.timeout()?;
        if self.max_attempts == Some(0) {
            return Err("max_attempts: at least 1".into());
        }
        Ok(())
    }

    /// The event types to deliver (empty = all), families (`run.*`) expanded.
    pub fn types(&self) -> Result<Vec<flow_ledger::EventType>, String> {
        let Some(patterns) = &self.events else {
            return Ok(Vec::new());
        };
        if patterns.is_empty() {
            return Err("events: an empty list delivers nothing; leave it out for all".into());
        }
        let all = flow_ledger::EventType::ALL;
        let mut out = Vec::new();
        for p in patterns {
            let matched: Vec<_> = match p.strip_suffix(".*") {
                Some(family) => all
                    .iter()
                    .copied()
                    .filter(|t| t.as_str().split('.').next() == Some(family))
                    .collect(),
                None => all.iter().copied().filter(|t| t.as_str() == p).collect(),
            };
            if matched.is_empty() {
                let names: Vec<&str> = all.iter().map(|t| t.as_str()).collect();
                return Err(format!(
                    "events: unknown event type `{p}` (known: {})",
                    names.join(", ")
                ));
            }
            for t in matched {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    /// The per-delivery timeout (webhooks; default 10 s).
    pub fn timeout(&self) -> Result<std::time::Duration, String> {
        match &self.timeout {
            None => Ok(DEFAULT_WEBHOOK_TIMEOUT),
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err("timeout: must be positive".into()),
                Err(e) => Err(format!("timeout: `{text}` is not a duration ({e})")),
            },
        }
    }

    /// Attempts before a dead letter.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_egress_patterns_are_refused_with_their_reason() {
        for good in [
            "*",
            "api.example.com",
            "*.example.com",
            "API.Example.com.",
            "127.0.0.1",
            "::1",
            "[::1]",
            "localhost",
            "my_host",
        ] {
            assert!(HostPattern::parse(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            ("", "is empty"),
            ("*.", "no name after"),
            ("http://x", "is a URL"),
            ("https://api.example.com/v1", "is a URL"),
            ("api.example.com:443", "holds `:`"),
            ("api.example.com/v1", "holds `/`"),
            ("a.*.com", "`*` inside"),
            ("*example.com", "`*` inside"),
            ("exa mple.com", "not a host name"),
            ("-x.com", "not a host name"),
            ("a..b", "not a host name"),
        ] {
            let err = HostPattern::parse(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_bad_egress_pattern_is_refused_at_its_line_and_column() {
        let err = load("[egress]\nallow = [\n  \"ok.example.com\",\n  \"*.\",\n]\n")
            .expect_err("refused");
        assert!(err.contains(":4:3: error: "), "{err}");
        assert!(err.contains("no name after `*.`"), "{err}");
        for bad in ["\"\"", "\"http://x\""] {
            let err = load(&format!("[egress]\nallow = [{bad}]\n")).expect_err(bad);
            assert!(err.contains(":2:10: error: egress pattern"), "{bad}: {err}");
        }
    }

    #[test]
    fn egress_patterns() {
        let e = Egress {
            allow: Some(vec!["127.0.0.1".into(), "*.example.com".into()]),
            ..Egress::default()
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
                allow: Some(vec![]),
                ..Egress::default()
            }
            .allows("127.0.0.1")
        );
    }

    fn load(text: &str) -> Result<Config, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("flow.toml");
        std::fs::write(&p, text).expect("write");
        Config::load(Some(&p)).map_err(|e| e.to_string())
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_file_line_and_column() {
        for (text, at, says) in [
            (
                "[egress]\nallow = [\"a\"]\nallwo = 1\n",
                ":3:1: error: ",
                "unknown field `allwo`",
            ),
            ("[egres]\n", ":1:2: error: ", "unknown field `egres`"),
            (
                "[egress]\n  allow = \"x\"\n",
                ":2:11: error: ",
                "invalid type",
            ),
            (
                "[[consumers]]\nname = \"a\"\nkind = \"file\"\npath = \"/x\"\nmax_attempts = \"9\"\n",
                ":5:16: error: ",
                "invalid type",
            ),
            ("[egress\n", ":1:8: error: ", ""),
        ] {
            let err = load(text).expect_err(text);
            assert!(err.contains(&format!("flow.toml{at}")), "{text:?}: {err}");
            assert!(err.contains(says), "{text:?}: {err}");
            assert_eq!(err.lines().count(), 1, "one line: {err}");
        }
    }

    #[test]
    fn consumers_are_checked() {
        let ok = load(
            r#"
[[consumers]]
name = "ops-webhook"
kind = "webhook"
url = "https://ops.example.com/hook"
secret_name = "WEBHOOK"
events = ["run.paused", "tool_call.*"]
timeout = "5s"
max_attempts = 10
[[consumers]]
name = "audit"
kind = "file"
path = "/tmp/events.jsonl"
start = "latest"
"#,
        )
        .expect("valid");
        let hook = &ok.consumers[0];
        assert_eq!(
            hook.types().expect("types"),
            [
                flow_ledger::EventType::RunPaused,
                flow_ledger::EventType::ToolCallInDoubt,
                flow_ledger::EventType::ToolCallResolved,
                flow_ledger::EventType::ToolCallProbed,
                flow_ledger::EventType::ToolCallNeedsOperator,
                flow_ledger::EventType::ToolCallSlotReleased,
                flow_ledger::EventType::ToolCallTaskStarted,
                flow_ledger::EventType::ToolCallElicited,
            ]
        );
        assert_eq!(hook.timeout(), Ok(std::time::Duration::from_secs(5)));
        assert_eq!(hook.max_attempts(), 10);
        assert_eq!(ok.consumers[1].max_attempts(), DEFAULT_MAX_ATTEMPTS);
        assert_eq!(ok.consumers[1].start, ConsumerStart::Latest);
        assert!(ok.consumers[1].types().expect("types").is_empty());
        let hook = "[[consumers]]\nname = \"h\"\nkind = \"webhook\"\nurl = \"http://x\"\nsecret_name = \"S\"\n";
        for (extra, expect) in [
            (
                "events = [\"run.pasued\"]\n",
                "unknown event type `run.pasued`",
            ),
            ("events = []\n", "empty list"),
            ("timeout = \"soon\"\n", "not a duration"),
            ("max_attempts = 0\n", "at least 1"),
            ("path = \"/x\"\n", "`path` goes with"),
            ("retries = 3\n", "retries"),
            (
                "[[consumers]]\nname = \"h\"\nkind = \"file\"\npath = \"/x\"\n",
                "used twice",
            ),
        ] {
            let err = load(&format!("{hook}{extra}")).expect_err(extra);
            assert!(err.contains(expect), "{extra}: {err}");
        }
        for (text, expect) in [
            (
                "name = \"h\"\nkind = \"webhook\"\nurl = \"http://x\"\n",
                "secret_name",
            ),
            (
                "name = \"h\"\nkind = \"webhook\"\nurl = \"ftp://x\"\nsecret_name = \"S\"\n",
                "http or https",
            ),
            (
                "name = \"h\"\nkind = \"webhook\"\nurl = \"http://x\"\nsecret_name = \"s3cr3t value!\"\n",
                "not its value",
            ),
            ("name = \"a b\"\nkind = \"file\"\npath = \"/x\"\n", "name:"),
            ("name = \"f\"\nkind = \"file\"\n", "needs `path`"),
            (
                "name = \"f\"\nkind = \"file\"\npath = \"/x\"\ntimeout = \"1s\"\n",
                "`timeout` goes with",
            ),
            ("name = \"f\"\nkind = \"queue\"\n", "queue"),
        ] {
            let err = load(&format!("[[consumers]]\n{text}")).expect_err(text);
            assert!(err.contains(expect), "{text}: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_with_a_position() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("flow.toml");
        std::fs::write(&p, "[egress]\nallow = [\"a\"]\nalow = 1\n").expect("write");
        let err = Config::load(Some(&p)).expect_err("unknown key").to_string();
        assert!(
            err.contains("alow") && err.contains("flow.toml:3:1: error: "),
            "{err}"
        );
        std::fs::write(&p, "[egress]\nallow = [\"a\"]\n").expect("write");
        assert_eq!(
            Config::load(Some(&p)).expect("ok").egress.allow,
            Some(vec!["a".to_string()])
        );
    }
}

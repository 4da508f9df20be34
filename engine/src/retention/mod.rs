//! Retention: `[retention]` in `flow.toml`, and the passes that apply it (`gc.rs`).
//!
//! ```toml
//! [retention]
//! runs = "30d"      # finished runs older than this are deleted (whole, one per transaction)
//! events = "7d"     # outbox events every consumer has, and published events no wait needs
//! keys = "400d"     # idempotency-key tombstones, counted from the run's deletion
//! rate = 1000       # rows per second a daemon deletes at most
//! interval = "1m"   # between a daemon's passes
//! ```
//!
//! The ledger decides what is safe to delete (`flow_ledger` `retention`); this module
//! decides the horizons and the pace.

pub mod gc;

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

/// Default of `keys`: a key stays refused for a year and a month after the run that used
/// it was deleted, longer than any downstream is known to keep keys.
pub const DEFAULT_KEYS: Duration = Duration::from_secs(400 * 86_400);

/// Default of `rate`: rows per second one daemon deletes at most.
pub const DEFAULT_RATE: u32 = 1_000;

/// Default of `interval`: between a daemon's passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// `[retention]` as written: each value keeps its place in the file for errors.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Finished runs older than this are deleted.
    #[serde(default)]
    pub runs: Option<Spanned<String>>,
    /// Delivered events older than this are deleted.
    #[serde(default)]
    pub events: Option<Spanned<String>>,
    /// Tombstones expire this long after their run was deleted.
    #[serde(default)]
    pub keys: Option<Spanned<String>>,
    /// Rows per second.
    #[serde(default)]
    pub rate: Option<Spanned<i64>>,
    /// Between a daemon's passes.
    #[serde(default)]
    pub interval: Option<Spanned<String>>,
}

/// `[retention]`, checked. Nothing set: nothing is ever deleted (the default; a ledger
/// keeps everything until someone decides otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Finished runs older than this are deleted (`None`: kept).
    pub runs: Option<Duration>,
    /// Delivered events older than this are deleted (`None`: kept).
    pub events: Option<Duration>,
    /// Tombstones expire this long after their run was deleted.
    pub keys: Duration,
    /// Rows per second a daemon deletes at most.
    pub rate: u32,
    /// Between a daemon's passes.
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            runs: None,
            events: None,
            keys: DEFAULT_KEYS,
            rate: DEFAULT_RATE,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// A problem in `[retention]`: the byte offset of the value, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Byte offset in the file.
    pub at: usize,
    /// In words.
    pub message: String,
}

fn duration(key: &str, v: &Spanned<String>) -> Result<Duration, Problem> {
    let problem = |message: String| Problem {
        at: v.span().start,
        message,
    };
    match humantime::parse_duration(v.get_ref()) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(problem(format!("{key}: must be more than zero"))),
        Err(e) => Err(problem(format!(
            "{key}: `{}` is not a duration ({e}); write e.g. \"30d\", \"12h\"",
            v.get_ref()
        ))),
    }
}

impl RetentionConfig {
    /// Whether the table says anything (an empty `[retention]` deletes nothing).
    pub fn is_set(&self) -> bool {
        self.runs.is_some() || self.events.is_some()
    }

    /// The checked settings.
    pub fn check(&self) -> Result<Retention, Problem> {
        let runs = self
            .runs
            .as_ref()
            .map(|v| duration("runs", v))
            .transpose()?;
        let events = self
            .events
            .as_ref()
            .map(|v| duration("events", v))
            .transpose()?;
        let keys = self
            .keys
            .as_ref()
            .map(|v| duration("keys", v))
            .transpose()?
            .unwrap_or(DEFAULT_KEYS);
        let rate = match &self.rate {
            None => DEFAULT_RATE,
            Some(v) => u32::try_from(*v.get_ref())
                .ok()
                .filter(|r| *r > 0)
                .ok_or_else(|| Problem {
                    at: v.span().start,
                    message: "rate: rows per second, from 1 to 4294967295".into(),
                })?,
        };
        let interval = self
            .interval
            .as_ref()
            .map(|v| duration("interval", v))
            .transpose()?
            .unwrap_or(DEFAULT_INTERVAL);
        Ok(Retention {
            runs,
            events,
            keys,
            rate,
            interval,
        })
    }
}

impl Retention {
    /// Whether anything is ever deleted.
    pub fn is_on(&self) -> bool {
        self.runs.is_some() || self.events.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Retention, Problem> {
        #[derive(Deserialize)]
        struct F {
            retention: RetentionConfig,
        }
        let f: F = toml::from_str(text).expect("toml");
        f.retention.check()
    }

    #[test]
    fn defaults_and_refusals() {
        let r = check("[retention]\nruns = \"30d\"\nevents = \"7d\"\n").expect("ok");
        assert_eq!(r.runs, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(r.keys, DEFAULT_KEYS);
        assert_eq!(r.rate, DEFAULT_RATE);
        assert!(r.is_on());
        let r = check("[retention]\nruns = \"30d\"\nkeys = \"1d\"\n").expect("short keys");
        assert_eq!(
            r.keys,
            Duration::from_secs(86_400),
            "counted from the deletion"
        );
        let e = check("[retention]\nkeys = \"0s\"\n").expect_err("zero");
        assert!(e.message.starts_with("keys:"), "{e:?}");
        let e = check("[retention]\nruns = \"soon\"\n").expect_err("bad");
        assert!(e.message.contains("`soon` is not a duration"), "{e:?}");
        assert_eq!(e.at, "[retention]\nruns = ".len());
        let e = check("[retention]\nruns = \"1d\"\nrate = 0\n").expect_err("rate");
        assert!(e.message.starts_with("rate:"), "{e:?}");
        assert!(!check("[retention]\n").expect("empty").is_on());
    }
}

//! How long this process's leases last, and how much earlier than their stored end it
//! stops trusting them.
//!
//! A worker holds a run (and each call it sends) under a lease it renews every third of
//! its length; another worker takes the run over once the lease has expired by the
//! ledger's reckoning. The length is the worker's own choice (the lease row stores its
//! end), so processes with different lengths share a ledger safely. `FLOW_LEASE`
//! (default 30 s, at least 1 s) sets it: a shorter lease takes a dead or paused worker's
//! runs over sooner, at the cost of more renewals.
//!
//! A request leaves only before the lease's *local* deadline (`flow_adapters::Fence`):
//! its last confirmed renewal plus the length, less [`margin`] — a sixth of the length,
//! 5 s by default, which covers the other workers' clock skew (bounded by
//! `daemon::clock`) and monotonic clock drift.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flow_ledger::Timestamp;

/// The default lease length.
pub const DEFAULT: Duration = Duration::from_secs(30);

/// The shortest lease `FLOW_LEASE` may set: renewals every third of it must still fit.
pub const SHORTEST: Duration = Duration::from_secs(1);

/// A `FLOW_LEASE` value flow cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("FLOW_LEASE={value:?}: {why} (a duration of at least 1s, e.g. 30s)")]
pub struct Invalid {
    /// The value as set.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// Reads `FLOW_LEASE` (unset or empty: [`DEFAULT`]).
pub fn from_env() -> Result<Duration, Invalid> {
    match std::env::var("FLOW_LEASE") {
        Ok(value) if !value.trim().is_empty() => parse(&value),
        _ => Ok(DEFAULT),
    }
}

fn parse(value: &str) -> Result<Duration, Invalid> {
    let invalid = |why: String| Invalid {
        value: value.to_string(),
        why,
    };
    let d = humantime::parse_duration(value.trim()).map_err(|e| invalid(e.to_string()))?;
    if d < SHORTEST {
        return Err(invalid("shorter than 1s".to_string()));
    }
    Ok(d)
}

/// This process's lease length (read once; an invalid `FLOW_LEASE` was refused at start
/// by the commands that run workflows, and counts as unset here).
pub fn length() -> Duration {
    static LENGTH: OnceLock<Duration> = OnceLock::new();
    *LENGTH.get_or_init(|| from_env().unwrap_or(DEFAULT))
}

/// How much earlier than its end a lease stops letting requests leave.
pub fn margin() -> Duration {
    length() / 6
}

/// How long a lease confirmed at `asked` lets requests leave: until `asked + length -
/// margin`.
pub fn confirmed_until(asked: Instant) -> Instant {
    asked + length().saturating_sub(margin())
}

/// The local, monotonic deadline of a lease whose stored end is `expires_at`, read at
/// `now` by this process's clock (which wrote it).
pub fn local_deadline(expires_at: Timestamp, now: Timestamp) -> Instant {
    let left = u64::try_from(expires_at.as_millis().saturating_sub(now.as_millis())).unwrap_or(0);
    Instant::now() + Duration::from_millis(left).saturating_sub(margin())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_parse_or_say_why() {
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse(" 1m "), Ok(Duration::from_secs(60)));
        let short = parse("500ms").unwrap_err();
        assert!(short.to_string().contains("shorter than 1s"), "{short}");
        let junk = parse("soon").unwrap_err();
        assert!(
            junk.to_string().starts_with("FLOW_LEASE=\"soon\""),
            "{junk}"
        );
    }
}

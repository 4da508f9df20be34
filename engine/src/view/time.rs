//! The forms a reader may type a time in (`--since`, `?since=`). Views write times as
//! the ledger's `Timestamp` serializes them: RFC 3339, UTC.

use flow_ledger::Timestamp;

/// `--since` / `--until` / `?since=`: an RFC 3339 time, or a duration before `now`
/// (`2h`, `30m`).
pub fn parse_time(text: &str, now: Timestamp) -> Option<Timestamp> {
    Timestamp::parse_rfc3339(text).or_else(|| {
        humantime::parse_duration(text)
            .ok()
            .map(|ago| now.minus(ago))
    })
}

//! When a schedule's ticks fall: a cron expression read on the wall clock of an IANA
//! time zone and mapped to UTC instants, with two rules for daylight-saving changes:
//! a local time that does not exist (the spring-forward gap) is skipped, and a local
//! time that occurs twice (the fall-back overlap) fires once, at its first occurrence.
//!
//! croner is asked about a wall clock that never changes offset (the local time carried
//! as if it were UTC), so its own DST handling (which moves a time in a gap to the gap's
//! end, and fires interval schedules twice in a repeated hour) never applies; each
//! candidate is mapped to an instant here, where both rules are one line each.

use chrono::{DateTime, LocalResult, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Longer than a fall-back repeats local time anywhere (2 h, Antarctica/Troll): the
/// scan for the ticks up to an instant goes this far past its local time, so a tick
/// whose local time is later than the instant's (in a repeated hour) is reached.
const OVERLAP: TimeDelta = TimeDelta::hours(3);

/// A parsed schedule: its cron expression and time zone.
#[derive(Debug, Clone)]
pub struct Ticks {
    cron: Cron,
    tz: Tz,
}

/// Why a schedule's `cron` or `timezone` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The expression does not parse.
    #[error(
        "cron `{expr}` is not a cron expression: {reason} (five fields `min hour day month weekday`, six with seconds first, or @hourly, @daily, @weekly, @monthly, @yearly)"
    )]
    Cron {
        /// The expression as written.
        expr: String,
        /// croner's reason.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("timezone `{0}` is not an IANA time zone name (like `Europe/Paris` or `UTC`)")]
    Zone(String),
}

impl Ticks {
    /// Parses `expr` (five fields, six with seconds first, or an `@name`) in the time
    /// zone `tz` (`None`: UTC).
    pub fn parse(expr: &str, tz: Option<&str>) -> Result<Self, Error> {
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expr.trim()).map_err(|e| Error::Cron {
            expr: expr.to_string(),
            reason: e.to_string(),
        })?;
        let tz = match tz {
            None => Tz::UTC,
            Some(name) => name
                .parse::<Tz>()
                .map_err(|_| Error::Zone(name.to_string()))?,
        };
        Ok(Self { cron, tz })
    }

    /// The first tick strictly after `after`, if the expression has one.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let far = after + TimeDelta::days(366 * 8);
        self.between(after, far, 1).into_iter().next()
    }

    /// The ticks in `(after, until]`, in order, at most `limit`.
    pub fn between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        // The wall clock, as a `DateTime<Utc>` that never changes offset, from a whole
        // second (croner keeps a start's fraction of a second in what it finds). It
        // starts at `after`'s local time: a tick fires at its local time's first
        // occurrence, and first occurrences increase with local time, so no tick after
        // `after` has an earlier local time.
        let whole = after.with_nanosecond(0).unwrap_or(after);
        let mut wall = whole.with_timezone(&self.tz).naive_local().and_utc();
        let end = until.with_timezone(&self.tz).naive_local().and_utc() + OVERLAP;
        while out.len() < limit {
            let Ok(next) = self.cron.find_next_occurrence(&wall, false) else {
                break;
            };
            if next > end {
                break;
            }
            wall = next;
            let instant = match self.tz.from_local_datetime(&next.naive_utc()) {
                // A time in the spring-forward gap does not exist: skipped.
                LocalResult::None => continue,
                LocalResult::Single(t) => t,
                // A repeated time fires once, at its first occurrence.
                LocalResult::Ambiguous(first, _) => first,
            };
            let instant = instant.with_timezone(&Utc);
            if instant <= after {
                continue;
            }
            if instant > until {
                break;
            }
            out.push(instant);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("rfc 3339")
            .with_timezone(&Utc)
    }

    fn shown(ticks: &[DateTime<Utc>]) -> Vec<String> {
        ticks
            .iter()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect()
    }

    #[test]
    fn five_and_six_fields_and_names_parse_and_bad_ones_say_why() {
        for ok in [
            "0 2 * * *",
            "*/1 * * * * *",
            "@hourly",
            "@daily",
            "0 0 1 * *",
        ] {
            assert!(Ticks::parse(ok, None).is_ok(), "{ok}");
        }
        let e = Ticks::parse("61 * * * *", None).expect_err("minute 61");
        assert!(e.to_string().contains("cron `61 * * * *`"), "{e}");
        let e = Ticks::parse("0 2 * * *", Some("Europe/Pariss")).expect_err("zone");
        assert!(e.to_string().contains("Europe/Pariss"), "{e}");
        assert!(Ticks::parse("* * *", None).is_err());
    }

    #[test]
    fn ticks_between_two_instants_in_utc() {
        let t = Ticks::parse("*/15 * * * *", None).expect("cron");
        let got = t.between(at("2026-01-01T00:00:00Z"), at("2026-01-01T01:00:00Z"), 10);
        assert_eq!(
            shown(&got),
            [
                "2026-01-01T00:15:00Z",
                "2026-01-01T00:30:00Z",
                "2026-01-01T00:45:00Z",
                "2026-01-01T01:00:00Z"
            ]
        );
        assert_eq!(
            t.between(at("2026-01-01T00:00:00Z"), at("2026-01-02T00:00:00Z"), 3)
                .len(),
            3
        );
        let secs = Ticks::parse("* * * * * *", None).expect("seconds");
        assert_eq!(
            shown(&[secs.next_after(at("2026-01-01T00:00:00Z")).expect("next")]),
            ["2026-01-01T00:00:01Z"]
        );
        // From a time with a fraction of a second, ticks are whole seconds.
        let from = at("2026-01-01T00:00:00.613Z");
        let next = secs.next_after(from).expect("next");
        assert_eq!(next, at("2026-01-01T00:00:01Z"));
        let hourly = t.next_after(at("2026-01-01T00:59:59.999Z")).expect("next");
        assert_eq!(hourly, at("2026-01-01T01:00:00Z"));
    }

    /// 2026-03-29: Paris goes from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    #[test]
    fn a_local_time_in_the_spring_forward_gap_is_skipped() {
        let t = Ticks::parse("30 2 * * *", Some("Europe/Paris")).expect("cron");
        let got = t.between(at("2026-03-27T12:00:00Z"), at("2026-03-30T12:00:00Z"), 10);
        assert_eq!(
            shown(&got),
            [
                "2026-03-28T01:30:00Z", // 02:30 CET; none on the 29th
                "2026-03-30T00:30:00Z", // 02:30 CEST
            ]
        );
        let hourly = Ticks::parse("0 * * * *", Some("Europe/Paris")).expect("cron");
        let got = hourly.between(at("2026-03-29T00:00:00Z"), at("2026-03-29T02:00:00Z"), 10);
        // 02:00 local is in the gap: 01:00 CET (00:00Z) was the last before 03:00 CEST.
        assert_eq!(
            shown(&got),
            ["2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"]
        );
    }

    /// 2026-10-25: Paris goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    #[test]
    fn a_repeated_local_time_fires_once_at_its_first_occurrence() {
        let t = Ticks::parse("30 2 * * *", Some("Europe/Paris")).expect("cron");
        let got = t.between(at("2026-10-24T12:00:00Z"), at("2026-10-26T12:00:00Z"), 10);
        assert_eq!(
            shown(&got),
            [
                "2026-10-25T00:30:00Z", // 02:30 CEST, the first 02:30
                "2026-10-26T01:30:00Z", // 02:30 CET
            ]
        );
        // Asked from between the two 02:30s, the second is not a new tick.
        let got = t.between(at("2026-10-25T00:45:00Z"), at("2026-10-25T02:00:00Z"), 10);
        assert!(got.is_empty(), "{:?}", shown(&got));
        let next = t.next_after(at("2026-10-25T00:30:00Z")).expect("next");
        assert_eq!(shown(&[next]), ["2026-10-26T01:30:00Z"]);
    }
}

//! Times as people read them on a worklist: relative ("in doubt for 12 min", "3 h
//! ago"), computed on the server so the page reads right without JavaScript, with the
//! absolute UTC time beside it for the `title` and `<time datetime>` (which `live.js`
//! turns into the viewer's own time zone). The template filters `lasting` and `utc`
//! call these; `ago` is `ago.rs`'s (the runs list's), whose units these share
//! (templates/macros.html wraps all three).

use flow_ledger::Timestamp;

/// A span of `ms` milliseconds, coarse as a glance needs it and in the units of
/// `ago::between`: `45 s`, `12 min`, `3 h`, `2 d` (a worklist sorts by age; the exact
/// time is in the title).
pub(super) fn span(ms: i64) -> String {
    let s = ms.max(0) / 1_000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3_599 => format!("{} min", s / 60),
        3_600..=86_399 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}

/// How long since `since`: `12 min` (for "in doubt for 12 min").
pub(super) fn lasting(since: Timestamp, now: Timestamp) -> String {
    span(now.as_millis() - since.as_millis())
}

/// `2026-11-30 10:42:04 UTC`: the absolute time for a `title`.
pub(super) fn utc(t: Timestamp) -> String {
    let text = t.to_rfc3339();
    // `2026-11-30T10:42:04.123Z` → date, time to the second.
    match (text.get(..10), text.get(11..19)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => text,
    }
}

/// The current time of this server (what relative times count from).
pub(super) fn now() -> Timestamp {
    use flow_ledger::Clock;
    flow_ledger::SystemClock.now()
}

/// A template value that should be a time (the views serialize them as RFC 3339).
pub(super) fn parse(value: &str) -> Option<Timestamp> {
    Timestamp::parse_rfc3339(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timestamp = Timestamp(1_800_000_000_000);

    fn at(secs: i64) -> Timestamp {
        Timestamp(T.as_millis() + secs * 1_000)
    }

    #[test]
    fn spans_are_coarse_and_read_like_ago() {
        assert_eq!(lasting(T, at(45)), "45 s");
        assert_eq!(lasting(T, at(12 * 60 + 59)), "12 min");
        assert_eq!(lasting(T, at(3 * 3600 + 1)), "3 h");
        assert_eq!(lasting(T, at(3 * 86_400)), "3 d");
        assert_eq!(lasting(at(10), T), "0 s", "clock skew is not negative");
        // The same units as the runs list's "… ago".
        for secs in [45, 12 * 60, 3 * 3600, 23 * 3600, 3 * 86_400] {
            let ago = super::super::ago::between(T, at(secs));
            assert_eq!(ago, format!("{} ago", lasting(T, at(secs))), "{secs} s");
        }
    }

    #[test]
    fn the_absolute_time_is_utc_to_the_second() {
        assert_eq!(utc(T), "2027-01-15 08:00:00 UTC");
        assert_eq!(parse(&T.to_rfc3339()), Some(T));
        assert_eq!(parse("yesterday"), None);
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    #[test]
    fn every_template_parses_and_the_time_macros_render() {
        for name in [
            "macros.html",
            "layout.html",
            "error.html",
            "sign_in.html",
            "runs.html",
            "run.html",
            "in_doubt.html",
            "approvals.html",
        ] {
            assert!(
                super::super::TEMPLATES.get_template(name).is_ok(),
                "{name} does not parse"
            );
        }
        let t = Timestamp(now().as_millis() - 12 * 60_000 - 5_000).to_rfc3339();
        let html = super::super::TEMPLATES
            .render_str(
                r#"{% import "macros.html" as m %}{{ m.lasting(t, "for ") }}|{{ m.ago(t) }}|{{ m.ago(none) }}"#,
                minijinja::context! { t => t.clone() },
            )
            .unwrap_or_else(|e| panic!("{e:#}"));
        let title = utc(parse(&t).unwrap_or_default());
        assert_eq!(
            html,
            format!(
                r#"<time datetime="{t}" title="since {title}">for 12 min</time>|<time datetime="{t}" title="{title}">12 min ago</time>|–"#
            )
        );
    }
}

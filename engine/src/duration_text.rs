//! The one way flow prints a duration to people (progress lines, `flow show`): short
//! for short things, never a bare `0s` for a step that took under a millisecond — and
//! the one way a duration becomes the whole milliseconds the ledger stores
//! ([`whole_millis`]).
//!
//! `0ms`…`999ms`, then `1.008s`…`59.999s`, then `2m05s`, then `1h02m`.

/// `ms` milliseconds as text; negative values (clock skew between hosts) print as `0ms`.
pub fn duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{:03}s", ms / 1_000, ms % 1_000),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1_000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// A [`std::time::Duration`] as text (see [`duration_ms`]).
pub fn duration(d: std::time::Duration) -> String {
    duration_ms(whole_millis(d))
}

/// `d` in whole milliseconds, as the ledger stores timeouts and offsets; a duration
/// past `i64::MAX` ms (never written by a person) saturates instead of wrapping.
pub fn whole_millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_format() {
        for (ms, text) in [
            (-5, "0ms"),
            (0, "0ms"),
            (6, "6ms"),
            (999, "999ms"),
            (1_008, "1.008s"),
            (5_292, "5.292s"),
            (59_999, "59.999s"),
            (125_000, "2m05s"),
            (3_720_000, "1h02m"),
        ] {
            assert_eq!(duration_ms(ms), text, "{ms}");
        }
        assert_eq!(duration(std::time::Duration::from_micros(300)), "0ms");
    }
}

//! Relative times for the console ("12 min ago", "in 5 s"): what an operator scanning a
//! list reads first; the absolute UTC time stays in the element's `title`.

use flow_ledger::{Clock, SystemClock, Timestamp};

/// `rfc3339` relative to now, in words; the text itself when it is not a time.
pub fn ago(rfc3339: &str) -> String {
    match Timestamp::parse_rfc3339(rfc3339) {
        Some(t) => between(t, SystemClock.now()),
        None => rfc3339.to_string(),
    }
}

/// How long before (or after) `now` the time `t` is, to the largest whole unit.
pub fn between(t: Timestamp, now: Timestamp) -> String {
    let ms = now.0 - t.0;
    let (future, ms) = (ms < 0, ms.unsigned_abs());
    let s = ms / 1000;
    let text = match s {
        0..=4 => return "just now".into(),
        5..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::between;
    use flow_ledger::Timestamp;

    #[test]
    fn times_read_to_their_largest_unit() {
        let now = Timestamp(10_000_000_000);
        let cases = [
            (0, "just now"),
            (30_000, "30 s ago"),
            (12 * 60_000 + 5_000, "12 min ago"),
            (3 * 3_600_000, "3 h ago"),
            (2 * 86_400_000, "2 d ago"),
            (-90_000, "in 1 min"),
        ];
        for (back, want) in cases {
            assert_eq!(between(Timestamp(now.0 - back), now), want);
        }
    }
}

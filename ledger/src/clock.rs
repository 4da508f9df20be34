//! Time as an input.
//!
//! Every ledger method takes `now` and binds it into its SQL, so no scheduling predicate
//! reads the database clock: tests drive time with [`ManualClock`], SQLite and PostgreSQL
//! agree on every comparison (both store `BIGINT` milliseconds), and a lease decision made
//! by one worker can be replayed exactly in a test.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Milliseconds since the Unix epoch, UTC. Stored as `BIGINT` in both backends so that
/// comparisons have no dialect differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Builds a timestamp from epoch milliseconds (the stored form).
    pub const fn from_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// The stored form: epoch milliseconds.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating, because lease lengths come from configuration.
    pub fn plus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(ms))
    }

    /// `self - d`, saturating.
    pub fn minus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_sub(ms))
    }

    /// RFC 3339 in UTC with milliseconds (`2026-11-30T10:42:04.123Z`), the form shown to
    /// users and written in event payloads.
    pub fn to_rfc3339(self) -> String {
        let ms = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            sod / 3600,
            (sod / 60) % 60,
            sod % 60
        )
    }

    /// Parses the RFC 3339 forms this crate writes (`...Z` or `+00:00`, optional
    /// fraction). Returns `None` for anything else rather than guessing.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return None;
        }
        let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let mut rest = &s[19..];
        let mut ms = 0i64;
        if let Some(frac) = rest.strip_prefix('.') {
            let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
            if digits.is_empty() {
                return None;
            }
            let mut padded = digits.clone();
            padded.truncate(3);
            while padded.len() < 3 {
                padded.push('0');
            }
            ms = padded.parse().ok()?;
            rest = &frac[digits.len()..];
        }
        let offset_min = match rest {
            "Z" | "z" => 0,
            _ => {
                let sign = match rest.as_bytes().first()? {
                    b'+' => 1,
                    b'-' => -1,
                    _ => return None,
                };
                let oh: i64 = rest.get(1..3)?.parse().ok()?;
                let om: i64 = rest.get(4..6)?.parse().ok()?;
                sign * (oh * 60 + om)
            }
        };
        let days = days_from_civil(y, mo, d);
        let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_min * 60;
        Some(Self(secs * 1000 + ms))
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        self.plus(d)
    }
}

impl std::ops::Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, d: Duration) -> Timestamp {
        self.minus(d)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// As JSON a timestamp is its RFC 3339 text (see the `Serialize` impl): what API
/// schemas describe it as.
impl schemars::JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339, UTC",
        })
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {s:?}")))
    }
}

// Howard Hinnant's civil calendar algorithms (public domain), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A source of "now". The engine holds one and passes `clock.now()` to every ledger
/// method; tests swap in a [`ManualClock`].
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// This process's time: the ledger's clock where the ledger has one, else the wall clock.
///
/// Leases, `not_before`, deadlines and schedule ticks are compared with the `now` each
/// process passes in, so a process whose wall clock is ahead would take live leases over
/// and fire ticks early, and one behind would never claim. A PostgreSQL ledger anchors
/// every process to the *server's* clock instead ([`anchor`], from
/// `Ledger::measure_skew` at open and every 30 s): `now` is then the server's time at the
/// last anchoring plus the monotonic time since, which neither a skewed nor a stepped
/// wall clock moves. A SQLite ledger has no clock of its own; the processes sharing its
/// file share their host's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let anchored = *ANCHOR.read().unwrap_or_else(|e| e.into_inner());
        match anchored {
            Some(a) => {
                let since = i64::try_from(a.at.elapsed().as_millis()).unwrap_or(i64::MAX);
                Timestamp(a.ledger_ms.saturating_add(since))
            }
            None => Timestamp(wall_ms()),
        }
    }
}

/// The wall clock, epoch milliseconds.
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The ledger's time at a monotonic instant, and how far the wall clock was from it.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    ledger_ms: i64,
    at: std::time::Instant,
    skew_ms: i64,
}

static ANCHOR: std::sync::RwLock<Option<Anchor>> = std::sync::RwLock::new(None);

/// Anchors [`SystemClock`] to the ledger's clock: the database read `ledger_ms` at the
/// monotonic instant `at`. Returns the wall clock's skew from it, in milliseconds
/// (positive: this host's clock is ahead).
pub fn anchor(ledger_ms: i64, at: std::time::Instant) -> i64 {
    let wall_then = wall_ms() - i64::try_from(at.elapsed().as_millis()).unwrap_or(0);
    let skew_ms = wall_then - ledger_ms;
    *ANCHOR.write().unwrap_or_else(|e| e.into_inner()) = Some(Anchor {
        ledger_ms,
        at,
        skew_ms,
    });
    skew_ms
}

/// The wall clock's skew from the ledger's at the last anchoring, in milliseconds
/// (`None`: not anchored — a SQLite ledger, or none open yet).
pub fn skew_ms() -> Option<i64> {
    ANCHOR
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .map(|a| a.skew_ms)
}

/// A clock that only moves when told to, so lease expiry, backoff and rate windows can be
/// tested without sleeping. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            ms: Arc::new(AtomicI64::new(start.0)),
        }
    }

    /// Moves the clock to `t` (backwards too: tests of clock skew need it).
    pub fn set(&self, t: Timestamp) {
        self.ms.store(t.0, Ordering::SeqCst);
    }

    /// Moves the clock forward by `d` and returns the new time.
    pub fn advance(&self, d: Duration) -> Timestamp {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.ms.fetch_add(ms, Ordering::SeqCst).saturating_add(ms))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_795_948_924_123, "2026-11-29T10:42:04.123Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(Timestamp(ms).to_rfc3339(), text);
            assert_eq!(Timestamp::parse_rfc3339(text), Some(Timestamp(ms)));
        }
        assert_eq!(
            Timestamp::parse_rfc3339("2000-02-29T01:00:00+01:00"),
            Some(Timestamp(951_782_400_000))
        );
        assert_eq!(Timestamp::parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(1000));
        assert_eq!(c.now(), Timestamp(1000));
        assert_eq!(c.advance(Duration::from_secs(2)), Timestamp(3000));
        let c2 = c.clone();
        c2.set(Timestamp(7));
        assert_eq!(c.now(), Timestamp(7));
    }
}

//! How long to wait before trying again, in one shape for every retry flow makes: a
//! node's retry steps (`retry_policy`), an event delivery that failed, a reconciliation
//! probe that could not tell. Each caller names its own numbers; the arithmetic — the
//! growth, the cap, the jitter — is written once here and table-tested once.
//!
//! Not here: the daemon's wait while the database does not answer (a stateful
//! `backon` iterator, reset when the database answers again) and the ledger's SQLite
//! busy wait (the ledger crate's own).

use std::time::Duration;

/// Try `n` (1-based: the first retry) waits `initial × multiplier^(n-1)`, at most
/// `max`, shortened by up to `jitter` of itself (0 = an exact schedule operators and
/// tests can reason about).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// How much each wait grows over the one before (1 = constant).
    pub multiplier: f64,
    /// The longest wait.
    pub max: Duration,
    /// The share of a wait that may be taken off at random (0 to 1): retries of many
    /// runs that failed together do not all come back at once.
    pub jitter: f64,
}

impl Backoff {
    /// Doubling from `initial`, capped at `max`, without jitter.
    pub const fn doubling(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            multiplier: 2.0,
            max,
            jitter: 0.0,
        }
    }

    /// The wait before try `n` (1-based; 0 counts as 1) without jitter.
    pub fn exact(&self, n: u32) -> Duration {
        whole_nanos(self.capped_secs(n))
    }

    /// The wait before try `n`, its jitter drawn from `rng`.
    pub fn delay(&self, n: u32, rng: &mut dyn rand::RngCore) -> Duration {
        let capped = self.capped_secs(n);
        let jitter = if self.jitter > 0.0 {
            rand::Rng::random::<f64>(rng) * self.jitter
        } else {
            0.0
        };
        whole_nanos((capped * (1.0 - jitter)).max(0.0))
    }

    fn capped_secs(&self, n: u32) -> f64 {
        let exp = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
        let grown = self.initial.as_secs_f64() * self.multiplier.powi(exp);
        let max = self.max.as_secs_f64();
        // 0 × ∞ (a zero first wait grown past f64) is no wait, not NaN.
        if grown.is_nan() { 0.0 } else { grown.min(max) }
    }
}

/// `secs` (finite, not negative) to the nearest nanosecond: `0.3 s × 2` is 600 ms, not
/// the 599.999999 ms a truncating conversion of its binary value would give.
fn whole_nanos(secs: f64) -> Duration {
    Duration::from_nanos((secs * 1e9).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_grows_from_the_first_try_to_the_cap_and_stays() {
        let b = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(300));
        for (n, secs) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (9, 256),
            (10, 300),
            (64, 300),
            (u32::MAX, 300),
        ] {
            assert_eq!(b.exact(n), Duration::from_secs(secs), "try {n}");
        }
    }

    #[test]
    fn a_wait_that_is_not_a_binary_fraction_stays_whole_milliseconds() {
        let b = Backoff::doubling(Duration::from_millis(300), Duration::from_secs(60));
        assert_eq!(b.exact(2), Duration::from_millis(600));
        assert_eq!(b.exact(3), Duration::from_millis(1200));
    }

    #[test]
    fn a_zero_first_wait_never_waits_however_many_tries() {
        let b = Backoff::doubling(Duration::ZERO, Duration::from_secs(60));
        assert_eq!(b.exact(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn jitter_only_shortens_and_by_at_most_its_share() {
        use rand::SeedableRng;
        let b = Backoff {
            jitter: 0.5,
            ..Backoff::doubling(Duration::from_secs(8), Duration::from_secs(60))
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let d = b.delay(1, &mut rng);
            assert!(
                d <= Duration::from_secs(8) && d >= Duration::from_secs(4),
                "{d:?}"
            );
        }
    }
}

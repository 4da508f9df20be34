//! Node retry delays: a pure function of the policy, the retry number and an RNG.
//!
//! The delay is stored as the next step's durable `not_before`, so it survives a crash;
//! nothing here sleeps. Jitter draws from an injected RNG so tests are exact.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::workflow::RetryPolicy;

/// The wait before retry `retry` (1-based): `initial * multiplier^(retry-1)`, capped at
/// `max`, minus up to `jitter` of itself drawn from `rng` ("equal jitter" when 0.5) —
/// the policy as a [`Backoff`].
pub fn next_delay(policy: &RetryPolicy, retry: u32, rng: &mut dyn rand::RngCore) -> Duration {
    Backoff {
        initial: policy.initial,
        multiplier: policy.multiplier,
        max: policy.max,
        jitter: policy.jitter,
    }
    .delay(retry, rng)
}

/// Whether retry `retry` (1-based) is within the policy's budget.
pub fn allows(policy: &RetryPolicy, retry: u32) -> bool {
    retry <= policy.max_retries
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn policy(jitter: f64) -> RetryPolicy {
        RetryPolicy {
            max_retries: 5,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            multiplier: 2.0,
            jitter,
        }
    }

    #[test]
    fn exponential_and_capped_without_jitter() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let table = [
            (1, 1.0),
            (2, 2.0),
            (3, 4.0),
            (4, 8.0),
            (5, 10.0),
            (50, 10.0),
        ];
        for (retry, secs) in table {
            assert_eq!(
                next_delay(&policy(0.0), retry, &mut rng),
                Duration::from_secs_f64(secs),
                "retry {retry}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_its_fraction_and_is_reproducible() {
        let mut a = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = rand::rngs::StdRng::seed_from_u64(7);
        for retry in 1..=6 {
            let d = next_delay(&policy(0.5), retry, &mut a);
            let full = next_delay(
                &policy(0.0),
                retry,
                &mut rand::rngs::StdRng::seed_from_u64(0),
            );
            assert!(
                d <= full && d >= full / 2,
                "retry {retry}: {d:?} vs {full:?}"
            );
            assert_eq!(d, next_delay(&policy(0.5), retry, &mut b));
        }
    }

    #[test]
    fn max_retries_counts_retries() {
        let p = RetryPolicy {
            max_retries: 2,
            ..policy(0.0)
        };
        assert!(allows(&p, 1) && allows(&p, 2) && !allows(&p, 3));
        assert!(!allows(&RetryPolicy::default(), 1));
    }
}

//! When a failed delivery is tried again: the pure schedule, table tested.
//!
//! Attempt `n` (counted from 1 when the delivery is leased) that fails is retried after
//! 2^(n-1) seconds, capped at 300 s: 1, 2, 4, … 256, 300, 300 … . A downstream's
//! `Retry-After` can only lengthen the wait (never past the cap): it knows its own load.
//! No jitter: deliveries of different events are already spread by when they were
//! written, and an exact schedule is what operators and tests can reason about.
//! After attempt `max_attempts` fails, the delivery is dead (a dead letter).

use std::time::Duration;

use flow_ledger::{DeliveryOutcome, Timestamp};

use crate::backoff::Backoff;

/// The longest wait between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// The schedule: doubling from one second to [`MAX_DELAY`], no jitter.
const SCHEDULE: Backoff = Backoff::doubling(Duration::from_secs(1), MAX_DELAY);

/// The wait after failed attempt `attempt` (1-based).
pub fn delay(attempt: u32) -> Duration {
    SCHEDULE.exact(attempt)
}

/// What to record after attempt `attempt` failed with `error` at `now`.
pub fn after_failure(
    attempt: u32,
    max_attempts: u32,
    retry_after: Option<Duration>,
    now: Timestamp,
    error: String,
) -> DeliveryOutcome {
    if attempt >= max_attempts {
        return DeliveryOutcome::Dead {
            error: format!("gave up after {attempt} attempts: {error}"),
        };
    }
    let wait = retry_after
        .map_or(delay(attempt), |hint| hint.max(delay(attempt)))
        .min(MAX_DELAY);
    DeliveryOutcome::Retry {
        at: now.plus(wait),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_one_second_up_to_five_minutes() {
        let table: [(u32, u64); 12] = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 8),
            (8, 128),
            (9, 256),
            (10, 300),
            (11, 300),
            (33, 300),
            (64, 300),
            (u32::MAX, 300),
        ];
        for (attempt, secs) in table {
            assert_eq!(
                delay(attempt),
                Duration::from_secs(secs),
                "attempt {attempt}"
            );
        }
    }

    #[test]
    fn the_last_attempt_is_a_dead_letter() {
        let now = Timestamp(1_000_000);
        let err = || "HTTP 500".to_string();
        assert_eq!(
            after_failure(3, 64, None, now, err()),
            DeliveryOutcome::Retry {
                at: Timestamp(1_004_000),
                error: err()
            }
        );
        assert!(matches!(
            after_failure(64, 64, None, now, err()),
            DeliveryOutcome::Dead { error } if error.contains("64 attempts") && error.contains("HTTP 500")
        ));
        assert!(matches!(
            after_failure(1, 1, None, now, err()),
            DeliveryOutcome::Dead { .. }
        ));
    }

    #[test]
    fn retry_after_lengthens_but_never_past_the_cap() {
        let now = Timestamp(0);
        let at = |hint: u64| match after_failure(
            1,
            64,
            Some(Duration::from_secs(hint)),
            now,
            String::new(),
        ) {
            DeliveryOutcome::Retry { at, .. } => at.0 / 1000,
            other => panic!("{other:?}"),
        };
        assert_eq!(at(0), 1);
        assert_eq!(at(30), 30);
        assert_eq!(at(3600), 300);
    }
}

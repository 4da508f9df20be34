//! What a probe's answer means: one pure function, table-tested, so the rule that lets
//! flow settle an in-doubt call without a human is written in one place.
//!
//! | the answer | when | verdict |
//! |---|---|---|
//! | found | any time | succeed with the probe's output (no re-send) |
//! | not found | before `after` (measured from the latest send) | not trusted: probe again when `after` has passed |
//! | not found | trusted, re-sends left, run not finished | re-send with the **same** key |
//! | not found | trusted, `max_resends` spent | a human decides (`tool_call.needs_operator`) |
//! | not found | trusted, the run is finished (cancelled, failed) | a human decides: nothing is re-sent for a finished run |
//! | unknown (error, timeout, neither or both verdicts) | probes left | probe again, backing off |
//! | unknown | last probe | a human decides (`tool_call.needs_operator`) |
//!
//! No answer ever makes a call `failed`: "not there yet" and "cannot tell" are not
//! "did not happen", and only the downstream or a human may say it did not. And no
//! answer re-sends without a budget: a downstream whose status endpoint lags its effect
//! endpoint says `not_found` about effects it has, so every re-send may be executed;
//! `max_resends` (counted in the ledger) bounds them.

use std::time::Duration;

use flow_ledger::{ProbeDecision, ProbeObserved, Timestamp};
use serde_json::Value as Json;

/// The longest wait between two probes of a call.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(60);

/// What a probe's answer said, after its verdict expressions were evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `found` was true (and `not_found` false): the node's output.
    Found(Json),
    /// `not_found` was true (and `found` false).
    NotFound,
    /// Neither, both, an error or a timeout: why.
    Unknown(String),
}

impl Answer {
    /// The ledger's name of the observation.
    pub fn observed(&self) -> ProbeObserved {
        match self {
            Self::Found(_) => ProbeObserved::Found,
            Self::NotFound => ProbeObserved::NotFound,
            Self::Unknown(_) => ProbeObserved::Unknown,
        }
    }
}

/// When the probe was made, relative to the request it asks about and the probe budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Now.
    pub now: Timestamp,
    /// When the effect attempt's request was marked outbound (`None`: never recorded,
    /// which the ledger does not produce for an in-doubt call; treated as long ago).
    pub outbound_at: Option<Timestamp>,
    /// `reconcile.after`.
    pub after: Duration,
    /// This probe's number, 1-based.
    pub probe: u32,
    /// `reconcile.max_probes`.
    pub max_probes: u32,
    /// Re-sends reconciliation already decided for this call (the ledger's count).
    pub resends: u32,
    /// `reconcile.max_resends`.
    pub max_resends: u32,
    /// Whether the call's run can still send (false once it is finished: a cancelled
    /// run's call is settled, never re-sent).
    pub run_live: bool,
    /// `reconcile.interval`: the wait after probe 1; doubling, at most a minute.
    pub interval: Duration,
}

/// What to do with the call.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Settle it as succeeded with this output.
    Succeed(Json),
    /// Settle it for a re-send with the same key.
    Resend,
    /// Leave it in doubt; probe again at this time.
    ProbeAgain {
        /// When.
        at: Timestamp,
    },
    /// Leave it in doubt; a human decides.
    NeedsOperator,
}

impl Verdict {
    /// The ledger's name of the decision.
    pub fn decision(&self) -> ProbeDecision {
        match self {
            Self::Succeed(_) => ProbeDecision::Succeed,
            Self::Resend => ProbeDecision::Resend,
            Self::ProbeAgain { .. } => ProbeDecision::ProbeAgain,
            Self::NeedsOperator => ProbeDecision::NeedsOperator,
        }
    }
}

/// The verdict on one probe's answer (see the module's table).
pub fn verdict(answer: &Answer, t: &Timing) -> Verdict {
    match answer {
        Answer::Found(output) => Verdict::Succeed(output.clone()),
        Answer::NotFound => {
            let trusted_from = t
                .outbound_at
                .map_or(Timestamp(i64::MIN), |at| plus(at, t.after));
            if t.now < trusted_from {
                // Too early to believe: the request may still be on its way. One probe
                // at the moment it can be believed, whatever the budget says: this
                // answer is not a failure to answer.
                Verdict::ProbeAgain { at: trusted_from }
            } else if t.run_live && t.resends < t.max_resends {
                Verdict::Resend
            } else {
                Verdict::NeedsOperator
            }
        }
        Answer::Unknown(_) if t.probe >= t.max_probes => Verdict::NeedsOperator,
        Answer::Unknown(_) => Verdict::ProbeAgain {
            at: plus(t.now, backoff(t.interval, t.probe)),
        },
    }
}

/// The wait after probe `n` (1-based): `interval`, doubling per probe, at most a minute.
pub fn backoff(interval: Duration, n: u32) -> Duration {
    crate::backoff::Backoff::doubling(interval, MAX_PROBE_INTERVAL).exact(n)
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    Timestamp(t.0.saturating_add(crate::duration_text::whole_millis(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const S: i64 = 1_000;

    fn timing(now: i64, probe: u32) -> Timing {
        Timing {
            now: Timestamp(now),
            outbound_at: Some(Timestamp(0)),
            after: Duration::from_secs(10),
            probe,
            max_probes: 3,
            resends: 0,
            max_resends: 1,
            run_live: true,
            interval: Duration::from_secs(2),
        }
    }

    fn resent(t: Timing, resends: u32) -> Timing {
        Timing { resends, ..t }
    }

    #[test]
    fn the_decision_table_for_found() {
        let rows: Vec<(&str, Answer, Timing, Verdict)> = vec![
            (
                "found early",
                Answer::Found(json!({"id": 1})),
                timing(S, 1),
                Verdict::Succeed(json!({"id": 1})),
            ),
            (
                "found on the last probe",
                Answer::Found(json!(7)),
                timing(99 * S, 3),
                Verdict::Succeed(json!(7)),
            ),
        ];
        for (what, answer, t, want) in rows {
            assert_eq!(verdict(&answer, &t), want, "{what}");
        }
    }

    #[test]
    fn the_decision_table_for_not_found_and_unknown() {
        let unknown = Answer::Unknown("HTTP 500".into());
        let rows: Vec<(&str, Answer, Timing, Verdict)> = vec![
            (
                "not found after `after`",
                Answer::NotFound,
                timing(10 * S, 1),
                Verdict::Resend,
            ),
            (
                "not found long after",
                Answer::NotFound,
                timing(500 * S, 3),
                Verdict::Resend,
            ),
            (
                "not found, the re-send budget spent",
                Answer::NotFound,
                resent(timing(10 * S, 1), 1),
                Verdict::NeedsOperator,
            ),
            (
                "not found, past the re-send budget",
                Answer::NotFound,
                resent(timing(500 * S, 2), 7),
                Verdict::NeedsOperator,
            ),
            (
                "not found, no re-sends allowed",
                Answer::NotFound,
                Timing {
                    max_resends: 0,
                    ..timing(10 * S, 1)
                },
                Verdict::NeedsOperator,
            ),
            (
                "not found, budget of three, two used",
                Answer::NotFound,
                Timing {
                    max_resends: 3,
                    ..resent(timing(10 * S, 1), 2)
                },
                Verdict::Resend,
            ),
            (
                "not found, the run is finished",
                Answer::NotFound,
                Timing {
                    run_live: false,
                    ..timing(10 * S, 1)
                },
                Verdict::NeedsOperator,
            ),
            (
                "found, the run is finished",
                Answer::Found(json!(1)),
                Timing {
                    run_live: false,
                    ..timing(10 * S, 1)
                },
                Verdict::Succeed(json!(1)),
            ),
            (
                "not found too early, re-send budget spent",
                Answer::NotFound,
                resent(timing(3 * S, 1), 1),
                Verdict::ProbeAgain {
                    at: Timestamp(10 * S),
                },
            ),
            (
                "not found too early",
                Answer::NotFound,
                timing(3 * S, 1),
                Verdict::ProbeAgain {
                    at: Timestamp(10 * S),
                },
            ),
            (
                "not found too early, budget spent",
                Answer::NotFound,
                timing(3 * S, 3),
                Verdict::ProbeAgain {
                    at: Timestamp(10 * S),
                },
            ),
            (
                "unknown, first",
                unknown.clone(),
                timing(20 * S, 1),
                Verdict::ProbeAgain {
                    at: Timestamp(22 * S),
                },
            ),
            (
                "unknown, second backs off",
                unknown.clone(),
                timing(20 * S, 2),
                Verdict::ProbeAgain {
                    at: Timestamp(24 * S),
                },
            ),
            (
                "unknown, last",
                unknown.clone(),
                timing(20 * S, 3),
                Verdict::NeedsOperator,
            ),
            (
                "unknown, past the budget",
                unknown,
                timing(20 * S, 4),
                Verdict::NeedsOperator,
            ),
        ];
        for (what, answer, t, want) in rows {
            assert_eq!(verdict(&answer, &t), want, "{what}");
        }
    }

    #[test]
    fn only_the_downstream_settles() {
        // An unknown answer never settles a call, and not_found never makes it succeed,
        // whatever the probe's number or time.
        for probe in 1..=5 {
            for now in [0, 5 * S, 50 * S] {
                let t = timing(now, probe);
                let v = verdict(&Answer::Unknown("x".into()), &t);
                assert!(
                    matches!(v, Verdict::ProbeAgain { .. } | Verdict::NeedsOperator),
                    "unknown at {now} probe {probe} gave {v:?}"
                );
                let v = verdict(&Answer::NotFound, &t);
                assert!(
                    matches!(v, Verdict::Resend | Verdict::ProbeAgain { .. }),
                    "not_found at {now} probe {probe} gave {v:?}"
                );
                // Whatever the timing, a spent budget or a finished run never re-sends.
                for t in [
                    resent(t, 1),
                    Timing {
                        run_live: false,
                        ..t
                    },
                ] {
                    let v = verdict(&Answer::NotFound, &t);
                    assert_ne!(
                        v,
                        Verdict::Resend,
                        "not_found at {now} probe {probe}: {t:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let i = Duration::from_secs(2);
        assert_eq!(backoff(i, 1), Duration::from_secs(2));
        assert_eq!(backoff(i, 2), Duration::from_secs(4));
        assert_eq!(backoff(i, 5), Duration::from_secs(32));
        assert_eq!(backoff(i, 6), MAX_PROBE_INTERVAL);
        assert_eq!(backoff(i, 1000), MAX_PROBE_INTERVAL);
    }

    #[test]
    fn a_call_never_marked_outbound_trusts_not_found_at_once() {
        let t = Timing {
            outbound_at: None,
            ..timing(0, 1)
        };
        assert_eq!(verdict(&Answer::NotFound, &t), Verdict::Resend);
    }
}

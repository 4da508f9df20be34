//! The one rule for what follows a tool call's result: re-send the same key, start a new
//! effect attempt (a new key, through the node's retry policy), go in doubt, or fail.
//!
//! Every place that used to decide this on its own (the gateway's same-key re-send loop,
//! the in-doubt check before completing, the retryable test behind node retries, and the
//! automatic resolution of a call found in doubt after a crash) asks [`disposition`].
//!
//! The rule that shapes the table: **a request that has left once can never become "not
//! sent" again.** Once an effect attempt's outcome is unknown, a later failure to reach
//! the downstream (connection refused, 503) says nothing about the earlier send, so the
//! attempt stays unknown: a tool that dedupes on its key (`idempotency: header`) is sent
//! the *same* key again while the node's budget lasts, then the call goes in doubt. A new
//! key would let a downstream that honours keys perform the effect twice.

use flow_adapters::{FailureKind, SideEffect};

/// What the adapter reported for one send of the current effect attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The call succeeded.
    Succeeded,
    /// Refused for good (4xx, non-zero exit, MCP `isError`, …).
    Permanent,
    /// The downstream answered "not now" (408/425/429/5xx): this request had no effect.
    Transient,
    /// Provably never left the process (connect refused, DNS, spawn failure).
    NotSent,
    /// May have been processed: timeout or lost connection after the request was written.
    Unknown,
    /// No result at all: the call was found `outbound` or `in_doubt` after the process
    /// that sent it died (a crash between the outbound mark and the outcome).
    FoundInDoubt,
}

impl Observed {
    /// The observation an adapter result amounts to.
    pub fn of<T>(result: &Result<T, flow_adapters::Error>) -> Self {
        match result {
            Ok(_) => Self::Succeeded,
            Err(e) => match e.kind {
                FailureKind::Permanent => Self::Permanent,
                FailureKind::Transient { .. } => Self::Transient,
                FailureKind::NotSent => Self::NotSent,
                FailureKind::Unknown => Self::Unknown,
            },
        }
    }
}

/// What happened earlier in the current effect attempt (same key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct History {
    /// An earlier send of this attempt ended with its outcome unknown (in this process,
    /// or before a crash or an automatic resolution).
    pub unknown_before: bool,
    /// Same-key re-sends still allowed for this attempt (the node's retry budget less
    /// the re-sends already made).
    pub resends_left: u32,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Record the success.
    Succeed,
    /// Send again with the same key: the same effect attempt, deduplicated downstream.
    ResendSameKey,
    /// Fail this attempt as retryable: the node's retry policy may start a new effect
    /// attempt (`<node>_retry<n>`, a new key) — only when no earlier send can have had
    /// an effect, or when a repeated effect is harmless (read-only).
    NewAttempt,
    /// The outcome is unknown and may not be re-sent: pause the run for resolution.
    InDoubt,
    /// Fail the attempt for good; no retry can help.
    Fail,
}

/// The rule, as a pure function of the observation, the tool's side-effect class and
/// the attempt's history. The table test below is its specification.
pub fn disposition(observed: Observed, class: SideEffect, history: History) -> Disposition {
    use Disposition::*;
    let resend_or_doubt = if history.resends_left > 0 {
        ResendSameKey
    } else {
        InDoubt
    };
    match (observed, class) {
        (Observed::Succeeded, _) => Succeed,
        // Reads repeat harmlessly: a fresh attempt is always fine, except a crash's
        // leftover, which re-sends its own key like a header-idempotent call.
        (Observed::FoundInDoubt, SideEffect::ReadOnly | SideEffect::IdempotentHeader) => {
            resend_or_doubt
        }
        (Observed::FoundInDoubt, SideEffect::NotIdempotent) => InDoubt,
        (Observed::Permanent, SideEffect::ReadOnly | SideEffect::NotIdempotent) => Fail,
        // An error answer to a re-send does not say the earlier send had no effect (a
        // downstream may answer 409 "still processing" for its key).
        (Observed::Permanent, SideEffect::IdempotentHeader) if history.unknown_before => InDoubt,
        (Observed::Permanent, SideEffect::IdempotentHeader) => Fail,
        (Observed::Transient | Observed::NotSent | Observed::Unknown, SideEffect::ReadOnly) => {
            NewAttempt
        }
        (Observed::Unknown, SideEffect::NotIdempotent) => InDoubt,
        // A side-effecting tool re-sent at all was re-sent on an operator's `retry`
        // resolution: the operator vouched that the earlier send had no effect.
        (Observed::Transient | Observed::NotSent, SideEffect::NotIdempotent) => NewAttempt,
        (Observed::Unknown, SideEffect::IdempotentHeader) => resend_or_doubt,
        (Observed::Transient | Observed::NotSent, SideEffect::IdempotentHeader)
            if history.unknown_before =>
        {
            resend_or_doubt
        }
        (Observed::Transient | Observed::NotSent, SideEffect::IdempotentHeader) => NewAttempt,
    }
}

#[cfg(test)]
mod tests {
    use super::Disposition::*;
    use super::*;

    const H: SideEffect = SideEffect::IdempotentHeader;
    const R: SideEffect = SideEffect::ReadOnly;
    const N: SideEffect = SideEffect::NotIdempotent;

    /// Every observation × class × (unknown before?, budget left?), spelled out.
    #[test]
    fn the_table() {
        use Observed::*;
        #[rustfmt::skip]
        let table: &[(Observed, SideEffect, bool, u32, Disposition)] = &[
            // observed       class  unknown_before  resends_left  → disposition
            (Succeeded,       H, false, 2, Succeed),
            (Succeeded,       H, true,  0, Succeed),
            (Succeeded,       N, true,  0, Succeed),
            (Succeeded,       R, false, 0, Succeed),
            (Permanent,       H, false, 2, Fail),
            (Permanent,       H, true,  2, InDoubt),
            (Permanent,       N, false, 2, Fail),
            (Permanent,       N, true,  2, Fail),
            (Permanent,       R, true,  2, Fail),
            (Transient,       H, false, 2, NewAttempt),
            (Transient,       H, true,  2, ResendSameKey),
            (Transient,       H, true,  0, InDoubt),
            (Transient,       N, false, 2, NewAttempt),
            (Transient,       R, true,  0, NewAttempt),
            (NotSent,         H, false, 2, NewAttempt),
            (NotSent,         H, false, 0, NewAttempt),
            // The reported defect: reset (unknown), then connection refused.
            (NotSent,         H, true,  2, ResendSameKey),
            (NotSent,         H, true,  0, InDoubt),
            (NotSent,         N, false, 2, NewAttempt),
            (NotSent,         N, true,  2, NewAttempt),
            (NotSent,         R, true,  2, NewAttempt),
            (Unknown,         H, false, 2, ResendSameKey),
            (Unknown,         H, true,  1, ResendSameKey),
            (Unknown,         H, false, 0, InDoubt),
            (Unknown,         N, false, 2, InDoubt),
            (Unknown,         N, true,  2, InDoubt),
            (Unknown,         R, false, 0, NewAttempt),
            (FoundInDoubt,    H, true,  1, ResendSameKey),
            (FoundInDoubt,    H, true,  0, InDoubt),
            (FoundInDoubt,    R, true,  1, ResendSameKey),
            (FoundInDoubt,    R, true,  0, InDoubt),
            (FoundInDoubt,    N, true,  5, InDoubt),
        ];
        for &(observed, class, unknown_before, resends_left, want) in table {
            let history = History {
                unknown_before,
                resends_left,
            };
            assert_eq!(
                disposition(observed, class, history),
                want,
                "{observed:?} × {class:?} × {history:?}"
            );
        }
    }

    /// The invariant behind the table, checked over every input: once an attempt's
    /// outcome was unknown, a side-effecting or header-idempotent call never gets a new
    /// key unless an operator vouched (class `None` re-sent only after `retry`).
    #[test]
    fn after_an_unknown_outcome_a_keyed_effect_never_gets_a_new_key() {
        use Observed::*;
        for observed in [
            Succeeded,
            Permanent,
            Transient,
            NotSent,
            Unknown,
            FoundInDoubt,
        ] {
            for resends_left in 0..3 {
                let history = History {
                    unknown_before: true,
                    resends_left,
                };
                let d = disposition(observed, H, history);
                assert_ne!(d, NewAttempt, "{observed:?} {history:?}");
                assert_ne!(d, Fail, "{observed:?} {history:?}");
                if resends_left == 0 {
                    assert_ne!(d, ResendSameKey, "budget spent: {observed:?}");
                }
                assert_ne!(
                    disposition(observed, N, history),
                    ResendSameKey,
                    "a side-effecting tool is never re-sent by flow"
                );
            }
        }
    }
}

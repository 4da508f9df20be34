//! The persisted states and their legal transitions.
//!
//! These rules live here once, as pure functions, so that both backends only perform
//! conditional updates (`... WHERE status = 'claimed' AND lease_token = $n`) of transitions
//! that Rust has already decided are legal. Every enum maps to database text in exactly
//! one place (`as_str` / `FromStr`).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::Error;

/// Generates `as_str`, `FromStr`, `Display` and serde-as-text for a state enum, so the
/// database text of each variant is written once.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order (used by tables and counters).
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text stored in the database and shown to users.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(Error::Corrupt {
                        what: format!("unknown {} {other:?}", stringify!($name)),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use text_enum;

text_enum! {
    /// Where a run is in its life. `queued` runs wait in the queue; `running` runs are
    /// held by a worker's lease; `paused` runs wait for an operator (an in-doubt call).
    RunStatus {
        /// Waiting to be claimed by a worker.
        Queued => "queued",
        /// Held by a worker under a lease.
        Running => "running",
        /// Finished successfully (terminal).
        Succeeded => "succeeded",
        /// Finished with a failure (terminal).
        Failed => "failed",
        /// Waiting for an operator decision; `flow resume` re-queues it.
        Paused => "paused",
        /// Cancelled by request (terminal).
        Cancelled => "cancelled",
    }
}

impl RunStatus {
    /// Terminal runs never change again; every write to them is refused.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// A named transition of the run state machine: every write that changes a run's status
/// names its edge, and [`check_run_transition`] is the one table of legal edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunTransition {
    /// queued → running (a worker's claim), paused → running (`flow resume` takes the
    /// run itself), or running → running (a claim of a run whose holder's lease ended or
    /// who is provably dead: the token moves on).
    Claim,
    /// running → succeeded | failed | cancelled (`finish_run`, fenced by the lease).
    Finish,
    /// running → paused (a call in doubt; `pause_run`, fenced).
    Pause,
    /// running → queued (`release_run`: the worker stops and gives the run back).
    Release,
    /// paused → queued, or running (holder gone) → queued (`requeue_run`: resume by a
    /// daemon).
    Requeue,
    /// queued | paused | running (holder gone) → cancelled (`request_cancel`).
    Cancel,
    /// failed → queued (`redrive_run`: an operator sends a failed run round again).
    Redrive,
}

impl RunTransition {
    /// The states this transition may start from, and the states it may end in.
    pub fn edge(self) -> (&'static [RunStatus], &'static [RunStatus]) {
        use RunStatus::*;
        match self {
            Self::Claim => (&[Queued, Paused, Running], &[Running]),
            Self::Finish => (&[Running], &[Succeeded, Failed, Cancelled]),
            Self::Pause => (&[Running], &[Paused]),
            Self::Release => (&[Running], &[Queued]),
            Self::Requeue => (&[Paused, Running], &[Queued]),
            Self::Cancel => (&[Queued, Paused, Running], &[Cancelled]),
            Self::Redrive => (&[Failed], &[Queued]),
        }
    }

    /// `Ok(to)`, the status the write binds, if this transition may move a run from
    /// `from` to `to`, else `InvalidTransition` naming both (a finished run is
    /// `Terminal`).
    pub fn check(self, from: RunStatus, to: RunStatus) -> Result<RunStatus, Error> {
        let (froms, tos) = self.edge();
        if froms.contains(&from) && tos.contains(&to) {
            return Ok(to);
        }
        if from.is_terminal() {
            return Err(Error::Terminal { status: from });
        }
        Err(Error::InvalidTransition {
            what: "run",
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        })
    }
}

text_enum! {
    /// Where an approval stands (`approval:` on a node). `pending` moves by one
    /// compare-and-set to exactly one of the others: approve, deny, the deadline and a
    /// cancel race there and the loser changes nothing. A changed request puts the row
    /// back to `pending` under its new digest.
    ApprovalStatus {
        /// Waiting for approvers (or for more of them: `min`).
        Pending => "pending",
        /// Approved for the request whose digest the row holds.
        Approved => "approved",
        /// Denied: the node fails with the approver's reason.
        Denied => "denied",
        /// Nobody decided before the deadline: `on_timeout` applies (never approves).
        TimedOut => "timed_out",
        /// The run was cancelled or finished while it waited.
        Cancelled => "cancelled",
    }
}

impl ApprovalStatus {
    /// Whether the decision is made (nothing moves it again but a changed request,
    /// which only an `approved` row can see).
    pub fn is_decided(self) -> bool {
        self != Self::Pending
    }
}

text_enum! {
    /// Where a wait stands (a `wait:` node, or a node with `callback:` after its call).
    /// `pending` moves by one compare-and-set to exactly one of the others: an event, a
    /// callback, the deadline and a cancel race there and the loser changes nothing.
    WaitStatus {
        /// Waiting for its event or callback.
        Pending => "pending",
        /// An event matched, or the callback said `ok: true`: the node has its output.
        Completed => "completed",
        /// The callback said `ok: false`: the node fails with its error.
        Failed => "failed",
        /// Nothing came before the deadline (or a heartbeat was missed).
        TimedOut => "timed_out",
        /// The run finished while it waited.
        Cancelled => "cancelled",
    }
}

text_enum! {
    /// What a wait waits for.
    WaitKind {
        /// A published event its `match` accepts (`wait:`).
        Event => "event",
        /// A callback to its token (`callback:` on a node with a tool).
        Callback => "callback",
    }
}

text_enum! {
    /// Where one step (one attempt of a node) is.
    StepStatus {
        /// Created, waiting for its durable `not_before` (retry backoff) or to be started.
        Pending => "pending",
        /// Being executed by the run's worker.
        Running => "running",
        /// Finished successfully (terminal).
        Succeeded => "succeeded",
        /// Finished with a failure (terminal).
        Failed => "failed",
        /// Not executed because its condition was false (terminal).
        Skipped => "skipped",
        /// Its tool call is in doubt; waits for a resolution.
        Paused => "paused",
        /// Stopped because the run was cancelled (terminal).
        Cancelled => "cancelled",
    }
}

impl StepStatus {
    /// Terminal steps never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Skipped | Self::Cancelled
        )
    }

    /// What claiming its call does to a step: a step that holds a claim is executing, so
    /// `pending` and `paused` (re-claimed after an operator's `retry`) become `running`;
    /// any other state stays. `tie_step` applies it to a row it does not read (reading it
    /// would cost every claim a statement), binding [`StepStatus::MOVED_BY_CLAIM`] and
    /// `Running`.
    pub fn on_claim(self) -> StepStatus {
        if Self::MOVED_BY_CLAIM.contains(&self) {
            StepStatus::Running
        } else {
            self
        }
    }

    /// The states [`StepStatus::on_claim`] moves to `running`.
    pub const MOVED_BY_CLAIM: [StepStatus; 2] = [StepStatus::Pending, StepStatus::Paused];

    /// The legal step transitions. Finishing a step with the status it already has is
    /// idempotent (a worker that crashed after the commit may repeat it).
    pub fn check_transition(self, to: StepStatus) -> Result<(), Error> {
        use StepStatus::*;
        let ok = match (self, to) {
            (a, b) if a == b && a.is_terminal() => true,
            (Pending, Running | Succeeded | Failed | Skipped | Cancelled | Paused) => true,
            (Running, Succeeded | Failed | Skipped | Cancelled | Paused) => true,
            (Paused, Succeeded | Failed | Pending | Running | Cancelled) => true,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidTransition {
                what: "step",
                from: self.as_str().to_owned(),
                to: to.as_str().to_owned(),
            })
        }
    }
}

text_enum! {
    /// The tool-call states. `outbound` is the durable mark written before
    /// any byte of a request may leave the process.
    CallStatus {
        /// Held by a step under a lease; nothing has been sent for the current attempt.
        Claimed => "claimed",
        /// A request may have left; the outcome is not yet recorded.
        Outbound => "outbound",
        /// Terminal success; replayed on later claims.
        Succeeded => "succeeded",
        /// Terminal failure; replayed unless a retry asks for a new effect attempt.
        Failed => "failed",
        /// Sent, outcome unknown: never re-sent blindly; waits for a resolution.
        InDoubt => "in_doubt",
    }
}

impl CallStatus {
    /// Terminal calls are replayed instead of executed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A named transition of the tool-call state machine, so the legality table reads like
/// the crate docs and every write names which edge it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallTransition {
    /// claimed → outbound (`mark_outbound`).
    MarkOutbound,
    /// outbound → succeeded | failed (`complete_call`).
    Complete,
    /// outbound → in_doubt (the worker reports an unknown outcome, or a takeover).
    ToInDoubt,
    /// in_doubt → succeeded | failed (operator resolution).
    ResolveTerminal,
    /// in_doubt → claimed (operator: re-send with the same key and attempt).
    ResolveRetry,
    /// failed → claimed (`retry_failed`: a new effect attempt with a new key).
    RetryFailed,
    /// claimed → claimed (takeover of an expired, dead or fenced-out holder).
    Takeover,
    /// claimed → claimed with no holder and an expired lease (`release_call`).
    Release,
    /// outbound → outbound, for a call whose remote task is recorded: a new holder
    /// takes it over to collect the task, or its holder lets it go while the task
    /// still works (`release_task`). The request is never sent again on this edge.
    Collect,
    /// outbound → claimed with no holder (`give_back_unsent`), on the holder's own word
    /// that the marked request never left: its fence closed before the send (a pause or
    /// a ledger outage outlived the lease by its own clock), or the mark's acknowledgement
    /// was lost. Only the holder knows this; a new holder finding `outbound` cannot.
    GiveBack,
}

impl CallTransition {
    /// The state this transition leaves from, and the states it may end in.
    pub fn edge(self) -> (CallStatus, &'static [CallStatus]) {
        use CallStatus::*;
        match self {
            Self::MarkOutbound => (Claimed, &[Outbound]),
            Self::Complete => (Outbound, &[Succeeded, Failed]),
            Self::ToInDoubt => (Outbound, &[InDoubt]),
            Self::ResolveTerminal => (InDoubt, &[Succeeded, Failed]),
            Self::ResolveRetry => (InDoubt, &[Claimed]),
            Self::RetryFailed => (Failed, &[Claimed]),
            Self::Takeover => (Claimed, &[Claimed]),
            Self::Release => (Claimed, &[Claimed]),
            Self::Collect => (Outbound, &[Outbound]),
            Self::GiveBack => (Outbound, &[Claimed]),
        }
    }

    /// The `(from, to)` a write taking this edge to `to` binds (`from.as_str()` in its
    /// `WHERE`, `to.as_str()` in its `SET`), so no call write spells a state itself;
    /// `InvalidTransition` if this edge cannot end in `to`.
    pub fn to(self, to: CallStatus) -> Result<(CallStatus, CallStatus), Error> {
        let (from, ends) = self.edge();
        if ends.contains(&to) {
            Ok((from, to))
        } else {
            Err(Error::InvalidTransition {
                what: "tool call",
                from: from.as_str().to_owned(),
                to: to.as_str().to_owned(),
            })
        }
    }

    /// [`CallTransition::to`] for the edges that end in one state (all but `Complete`
    /// and `ResolveTerminal`, which end in the outcome).
    pub fn states(self) -> (CallStatus, CallStatus) {
        let (from, ends) = self.edge();
        (from, ends[0])
    }
}

/// Checks a tool-call transition (`to` matters only for terminal outcomes, which may be
/// `succeeded` or `failed`).
pub fn check_call_transition(from: CallStatus, to: CallStatus) -> Result<CallTransition, Error> {
    use CallStatus::*;
    let t = match (from, to) {
        (Claimed, Outbound) => CallTransition::MarkOutbound,
        (Outbound, Succeeded | Failed) => CallTransition::Complete,
        (Outbound, InDoubt) => CallTransition::ToInDoubt,
        (InDoubt, Succeeded | Failed) => CallTransition::ResolveTerminal,
        (InDoubt, Claimed) => CallTransition::ResolveRetry,
        (Failed, Claimed) => CallTransition::RetryFailed,
        (Claimed, Claimed) => CallTransition::Takeover,
        (Outbound, Outbound) => CallTransition::Collect,
        (Outbound, Claimed) => CallTransition::GiveBack,
        _ => {
            return Err(Error::InvalidTransition {
                what: "tool call",
                from: from.as_str().to_owned(),
                to: to.as_str().to_owned(),
            });
        }
    };
    Ok(t)
}

text_enum! {
    /// The kind of an error, stored beside its message so that the executor can act on
    /// it after a restart exactly as it would have before (the retry decision is a pure function of it).
    ErrorKind {
        /// Will fail again: configuration, validation, 4xx.
        Permanent => "permanent",
        /// May succeed later: 429, 5xx, rate limited.
        Transient => "transient",
        /// Provably never left the process (connect refused, DNS).
        NotSent => "not_sent",
        /// Timeout or lost connection after outbound: the outcome is unknown.
        Unknown => "unknown",
        /// Identity reuse with different input.
        Conflict => "conflict",
        /// Someone else holds the lease.
        Busy => "busy",
        /// Stopped by a cancel request.
        Cancelled => "cancelled",
        /// The node's `deadline` (whole node including retries) passed.
        Timeout => "timeout",
    }
}

/// Who holds a lease, as far as a claim decision needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The holder's worker id (`None` after a release or an operator retry).
    pub holder: Option<String>,
    /// When the lease ends (`None` = no lease).
    pub expires_at: Option<Timestamp>,
    /// The run lease token the holder claimed under.
    pub run_token: i64,
}

/// The facts about an existing call row that decide a claim.
#[derive(Debug, Clone)]
pub struct CallFacts {
    /// Current state.
    pub status: CallStatus,
    /// The call's lease.
    pub lease: LeaseView,
    /// When it became in doubt (for `InDoubt { since }`).
    pub in_doubt_at: Option<Timestamp>,
    /// Whether the downstream started a remote task for the current attempt (its id
    /// is recorded): an abandoned `outbound` call is then collected, not in doubt.
    pub remote_task: bool,
}

/// What a claim must do with an existing row of *this* run's call (same tool_call_id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Terminal: return the stored outcome.
    Replay,
    /// failed + retry_failed: start effect attempt n+1 with key `<base>:<n+1>`.
    NewAttempt,
    /// claimed by an expired / dead / fenced-out holder: take it over, same attempt.
    Takeover,
    /// outbound by an expired / dead / fenced-out holder: becomes in doubt.
    ToInDoubt,
    /// outbound by an expired / dead / fenced-out holder, with a remote task recorded:
    /// take it over, still outbound, to ask for the task's result (nothing is re-sent).
    Collect,
    /// Already in doubt since the given time.
    InDoubt(Option<Timestamp>),
    /// A live lease held by someone else (never two senders).
    Busy {
        /// Holder worker id.
        holder: String,
        /// Lease end.
        until: Timestamp,
    },
}

/// Decides what a claim does with an existing row of the caller's own call.
/// `holder_dead` says whether the holder is provably dead (checked by the caller, since
/// it reads `/proc`); `caller_run_token` is the caller's run lease token: a row claimed
/// under an older token belongs to a worker that lost the run and is fenced out.
pub fn decide_claim(
    facts: &CallFacts,
    retry_failed: bool,
    caller_run_token: i64,
    holder_dead: bool,
    now: Timestamp,
) -> ClaimDecision {
    let lease = &facts.lease;
    let abandoned = lease.holder.is_none()
        || lease.expires_at.is_none_or(|t| t <= now)
        || holder_dead
        || lease.run_token < caller_run_token;
    match facts.status {
        CallStatus::Succeeded => ClaimDecision::Replay,
        CallStatus::Failed if retry_failed => ClaimDecision::NewAttempt,
        CallStatus::Failed => ClaimDecision::Replay,
        CallStatus::InDoubt => ClaimDecision::InDoubt(facts.in_doubt_at),
        CallStatus::Claimed if abandoned => ClaimDecision::Takeover,
        CallStatus::Outbound if abandoned && facts.remote_task => ClaimDecision::Collect,
        CallStatus::Outbound if abandoned => ClaimDecision::ToInDoubt,
        CallStatus::Claimed | CallStatus::Outbound => ClaimDecision::Busy {
            holder: lease.holder.clone().unwrap_or_default(),
            until: lease.expires_at.unwrap_or(now),
        },
    }
}

/// What a claim does with another run's call that already uses the same idempotency key
/// and the same request hash: that call *is* this one (an idempotent API across runs).
/// Its open states are never taken over from another run: only its own run may do that.
pub fn decide_foreign_claim(facts: &CallFacts, now: Timestamp) -> ClaimDecision {
    match facts.status {
        CallStatus::Succeeded | CallStatus::Failed => ClaimDecision::Replay,
        CallStatus::InDoubt => ClaimDecision::InDoubt(facts.in_doubt_at),
        CallStatus::Claimed | CallStatus::Outbound => ClaimDecision::Busy {
            holder: facts.lease.holder.clone().unwrap_or_default(),
            until: facts.lease.expires_at.unwrap_or(now),
        },
    }
}

/// The key sent for effect attempt `attempt` of a call whose base key is `base`
/// (`<key>:<n>`, as the README's "Idempotency keys" says).
pub fn attempt_key(base: &str, attempt: u32) -> String {
    format!("{base}:{attempt}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (from, to) pair of run states against every named transition: exactly the
    /// edges the enum documents are legal, and nothing leaves a terminal state.
    #[test]
    fn run_transitions_table() {
        use RunStatus::*;
        use RunTransition as T;
        #[rustfmt::skip]
        let legal: &[(T, RunStatus, RunStatus)] = &[
            (T::Claim, Queued, Running), (T::Claim, Paused, Running),
            (T::Claim, Running, Running),
            (T::Finish, Running, Succeeded), (T::Finish, Running, Failed),
            (T::Finish, Running, Cancelled),
            (T::Pause, Running, Paused),
            (T::Release, Running, Queued),
            (T::Requeue, Paused, Queued), (T::Requeue, Running, Queued),
            (T::Cancel, Queued, Cancelled), (T::Cancel, Paused, Cancelled),
            (T::Cancel, Running, Cancelled),
        ];
        for t in [
            T::Claim,
            T::Finish,
            T::Pause,
            T::Release,
            T::Requeue,
            T::Cancel,
        ] {
            for &from in RunStatus::ALL {
                for &to in RunStatus::ALL {
                    let want = legal.contains(&(t, from, to));
                    let got = t.check(from, to);
                    assert_eq!(got.is_ok(), want, "{t:?} {from} -> {to}: {got:?}");
                    if from.is_terminal() {
                        assert!(
                            matches!(got, Err(Error::Terminal { .. })),
                            "{t:?} from terminal {from}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn text_round_trips() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>().ok(), Some(*s));
        }
        for s in StepStatus::ALL {
            assert_eq!(s.as_str().parse::<StepStatus>().ok(), Some(*s));
        }
        for s in CallStatus::ALL {
            assert_eq!(s.as_str().parse::<CallStatus>().ok(), Some(*s));
        }
        for s in ErrorKind::ALL {
            assert_eq!(s.as_str().parse::<ErrorKind>().ok(), Some(*s));
        }
        assert!("bogus".parse::<CallStatus>().is_err());
        assert_eq!(CallStatus::InDoubt.as_str(), "in_doubt");
        assert_eq!(ErrorKind::NotSent.as_str(), "not_sent");
    }

    #[test]
    fn call_transitions_are_exactly_the_documented_edges() {
        use CallStatus::*;
        let legal = [
            (Claimed, Outbound),
            (Outbound, Succeeded),
            (Outbound, Failed),
            (Outbound, InDoubt),
            (InDoubt, Succeeded),
            (InDoubt, Failed),
            (InDoubt, Claimed),
            (Failed, Claimed),
            (Claimed, Claimed),
            (Outbound, Outbound),
            (Outbound, Claimed),
        ];
        for from in CallStatus::ALL {
            for to in CallStatus::ALL {
                let want = legal.contains(&(*from, *to));
                let got = check_call_transition(*from, *to).is_ok();
                assert_eq!(got, want, "{from} -> {to}");
            }
        }
        // Each named edge: exactly its ends are accepted, and each is a legal pair.
        use CallTransition as T;
        #[rustfmt::skip]
        let named: &[(T, CallStatus, CallStatus)] = &[
            (T::MarkOutbound, Claimed, Outbound),
            (T::Complete, Outbound, Succeeded), (T::Complete, Outbound, Failed),
            (T::ToInDoubt, Outbound, InDoubt),
            (T::ResolveTerminal, InDoubt, Succeeded), (T::ResolveTerminal, InDoubt, Failed),
            (T::ResolveRetry, InDoubt, Claimed),
            (T::RetryFailed, Failed, Claimed),
            (T::Takeover, Claimed, Claimed),
            (T::Release, Claimed, Claimed),
            (T::Collect, Outbound, Outbound),
            (T::GiveBack, Outbound, Claimed),
        ];
        for t in [
            T::MarkOutbound,
            T::Complete,
            T::ToInDoubt,
            T::ResolveTerminal,
            T::ResolveRetry,
            T::RetryFailed,
            T::Takeover,
            T::Release,
            T::Collect,
            T::GiveBack,
        ] {
            for &to in CallStatus::ALL {
                let want = named.iter().find(|(n, _, end)| *n == t && *end == to);
                match (t.to(to), want) {
                    (Ok(pair), Some(&(_, from, end))) => {
                        assert_eq!(pair, (from, end), "{t:?}");
                        assert!(check_call_transition(from, end).is_ok(), "{t:?}");
                    }
                    (Err(Error::InvalidTransition { .. }), None) => {}
                    (got, want) => panic!("{t:?} -> {to}: {got:?}, want {want:?}"),
                }
            }
            let (from, to) = t.states();
            assert!(named.contains(&(t, from, to)), "{t:?} states");
        }
    }

    #[test]
    fn step_transitions() {
        use StepStatus::*;
        let cases = [
            (Pending, Running, true),
            (Pending, Skipped, true),
            (Running, Succeeded, true),
            (Running, Paused, true),
            (Paused, Succeeded, true),
            (Paused, Pending, true),
            (Succeeded, Succeeded, true),
            (Succeeded, Failed, false),
            (Failed, Running, false),
            (Skipped, Running, false),
            (Cancelled, Running, false),
            (Pending, Paused, true),
            (Paused, Skipped, false),
        ];
        for (from, to, want) in cases {
            assert_eq!(from.check_transition(to).is_ok(), want, "{from} -> {to}");
        }
    }

    /// A claim moves exactly `pending` and `paused` steps, to `running`, along legal edges.
    #[test]
    fn a_claim_runs_its_step() {
        use StepStatus::*;
        for &s in StepStatus::ALL {
            let want = match s {
                Pending | Paused => Running,
                other => other,
            };
            assert_eq!(s.on_claim(), want, "{s}");
            if want != s {
                assert!(s.check_transition(want).is_ok(), "{s} -> {want}");
            }
        }
    }

    fn facts(status: CallStatus, holder: Option<&str>, exp: Option<i64>, tok: i64) -> CallFacts {
        CallFacts {
            status,
            lease: LeaseView {
                holder: holder.map(str::to_owned),
                expires_at: exp.map(Timestamp),
                run_token: tok,
            },
            in_doubt_at: Some(Timestamp(5)),
            remote_task: false,
        }
    }

    /// An abandoned outbound call whose remote task is recorded is collected, never put
    /// in doubt; a live holder still makes it busy, and a task changes nothing else.
    #[test]
    fn a_recorded_task_is_collected_not_doubted() {
        let now = Timestamp(100);
        let with_task = |status, holder: Option<&str>, exp| CallFacts {
            remote_task: true,
            ..facts(status, holder, exp, 1)
        };
        let abandoned = [
            (Some("w"), Some(99), false, 1),
            (Some("w"), Some(200), true, 1),
            (Some("w"), Some(200), false, 2),
            (None, None, false, 1),
        ];
        for (holder, exp, dead, caller) in abandoned {
            let f = with_task(CallStatus::Outbound, holder, exp);
            assert_eq!(
                decide_claim(&f, false, caller, dead, now),
                ClaimDecision::Collect,
                "{holder:?} {exp:?} dead={dead} caller={caller}"
            );
        }
        let live = with_task(CallStatus::Outbound, Some("w"), Some(200));
        assert!(matches!(
            decide_claim(&live, false, 1, false, now),
            ClaimDecision::Busy { .. }
        ));
        for status in [
            CallStatus::Succeeded,
            CallStatus::InDoubt,
            CallStatus::Claimed,
        ] {
            let f = with_task(status, None, None);
            let plain = facts(status, None, None, 1);
            assert_eq!(
                decide_claim(&f, false, 1, false, now),
                decide_claim(&plain, false, 1, false, now),
                "{status}"
            );
        }
    }

    #[test]
    fn claim_decisions() {
        use CallStatus::*;
        let now = Timestamp(100);
        let busy = ClaimDecision::Busy {
            holder: "w".into(),
            until: Timestamp(200),
        };
        // (status, holder, expiry, row run token, retry_failed, caller token, dead, want)
        #[rustfmt::skip]
        let cases = [
            (Succeeded, None, None, 1, false, 1, false, ClaimDecision::Replay),
            (Succeeded, None, None, 1, true, 1, false, ClaimDecision::Replay),
            (Failed, None, None, 1, false, 1, false, ClaimDecision::Replay),
            (Failed, None, None, 1, true, 1, false, ClaimDecision::NewAttempt),
            (Claimed, Some("w"), Some(200), 1, false, 1, false, busy.clone()),
            (Claimed, Some("w"), Some(100), 1, false, 1, false, ClaimDecision::Takeover),
            (Claimed, Some("w"), Some(200), 1, false, 1, true, ClaimDecision::Takeover),
            (Claimed, Some("w"), Some(200), 1, false, 2, false, ClaimDecision::Takeover),
            (Claimed, None, Some(100), 1, false, 1, false, ClaimDecision::Takeover),
            (Outbound, Some("w"), Some(200), 1, false, 1, false, busy),
            (Outbound, Some("w"), Some(99), 1, false, 1, false, ClaimDecision::ToInDoubt),
            (Outbound, Some("w"), Some(200), 1, false, 1, true, ClaimDecision::ToInDoubt),
            (Outbound, Some("w"), Some(200), 1, false, 3, false, ClaimDecision::ToInDoubt),
            (InDoubt, None, None, 1, true, 1, false, ClaimDecision::InDoubt(Some(Timestamp(5)))),
        ];
        for (status, holder, exp, tok, retry, caller, dead, want) in cases {
            let f = facts(status, holder, exp, tok);
            assert_eq!(
                decide_claim(&f, retry, caller, dead, now),
                want,
                "{status} {holder:?} {exp:?} tok={tok} retry={retry} caller={caller} dead={dead}"
            );
        }
    }

    #[test]
    fn foreign_claims_never_take_over() {
        let now = Timestamp(100);
        let f = facts(CallStatus::Claimed, Some("w"), Some(1), 1);
        assert!(matches!(
            decide_foreign_claim(&f, now),
            ClaimDecision::Busy { .. }
        ));
        let f = facts(CallStatus::Outbound, Some("w"), Some(1), 1);
        assert!(matches!(
            decide_foreign_claim(&f, now),
            ClaimDecision::Busy { .. }
        ));
        let f = facts(CallStatus::Failed, None, None, 1);
        assert_eq!(decide_foreign_claim(&f, now), ClaimDecision::Replay);
        let f = facts(CallStatus::InDoubt, None, None, 1);
        assert!(matches!(
            decide_foreign_claim(&f, now),
            ClaimDecision::InDoubt(_)
        ));
    }

    #[test]
    fn attempt_keys() {
        assert_eq!(attempt_key("refund-42", 1), "refund-42:1");
        assert_eq!(attempt_key("run_x:pay", 2), "run_x:pay:2");
    }
}

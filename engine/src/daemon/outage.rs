//! Whether the database answers, as seen by the whole daemon: the claim loop and every
//! run task report what their ledger calls found, and each change of state is logged
//! once, by whichever noticed it first.
//!
//! A busy daemon (every slot taken) does not claim, so the claim loop alone never saw
//! an outage that its runs were living through; an idle one logged it. Reports carry
//! when their call *started*: a call that began before the last change of state says
//! nothing about the state now (a failure from before a recovery, or a success from
//! before an outage), so it changes nothing and no line flaps.

use std::sync::Mutex;
use std::time::Instant;

/// The daemon's view of the database's reachability.
#[derive(Debug)]
pub(crate) struct Outage {
    url: String,
    state: Mutex<State>,
    /// Set once a ledger call found the ledger unusable by this process
    /// (`flow_ledger::Error::Unusable`): the daemon stops.
    unusable: Mutex<Option<String>>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    down: bool,
    /// When `down` last changed (or the daemon started).
    since: Instant,
}

/// Whether a ledger error means "the database does not answer" rather than a refusal
/// of the operation (lease lost, conflict, not found: the database answered those).
pub(crate) fn is_outage(e: &flow_ledger::Error) -> bool {
    matches!(
        e,
        flow_ledger::Error::Backend { .. } | flow_ledger::Error::Unavailable { .. }
    )
}

impl Outage {
    /// Up, as of now, for the database at `url` (redacted).
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            state: Mutex::new(State {
                down: false,
                since: Instant::now(),
            }),
            unusable: Mutex::new(None),
        }
    }

    /// Why this process may not write the ledger any more, once a call found so.
    pub fn unusable(&self) -> Option<String> {
        self.unusable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the database is currently taken to be unreachable.
    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// A ledger call started at `started` by `who` failed with `e`. Returns whether this
    /// report marked the database unreachable (and logged it).
    pub fn failed(&self, started: Instant, who: &str, e: &flow_ledger::Error) -> bool {
        if let flow_ledger::Error::Unusable { reason } = e {
            *self.unusable.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
            return false;
        }
        if !is_outage(e) {
            return false;
        }
        let mut state = self.lock();
        if state.down || started < state.since {
            return false;
        }
        *state = State {
            down: true,
            since: Instant::now(),
        };
        drop(state);
        tracing::warn!(
            db = %self.url,
            error = %e,
            noticed_by = who,
            "database unreachable: not claiming; runs in flight stop at their next write and go back to the queue; retrying with backoff"
        );
        true
    }

    /// A ledger call started at `started` succeeded. Returns whether this report marked
    /// the database reachable again (and logged it).
    pub fn ok(&self, started: Instant) -> bool {
        let mut state = self.lock();
        if !state.down || started < state.since {
            return false;
        }
        let down_for = state.since.elapsed();
        *state = State {
            down: false,
            since: Instant::now(),
        };
        drop(state);
        tracing::warn!(
            down_for_ms = u64::try_from(down_for.as_millis()).unwrap_or(u64::MAX),
            "database reachable again; claiming runs"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> flow_ledger::Error {
        flow_ledger::Error::Backend {
            message: "connection refused".into(),
            retryable: true,
        }
    }

    #[test]
    fn each_change_is_reported_once_and_stale_reports_change_nothing() {
        let o = Outage::new("postgres://db/flow");
        let before = Instant::now();
        assert!(!o.failed(before, "run", &flow_ledger::Error::LeaseLost));
        assert!(!o.is_down(), "a refusal is not an outage");
        assert!(o.failed(Instant::now(), "run", &backend()));
        assert!(o.is_down());
        assert!(!o.failed(Instant::now(), "claim loop", &backend()), "once");
        assert!(
            !o.ok(before),
            "a success from before the outage says nothing"
        );
        assert!(o.is_down());
        let later = Instant::now();
        assert!(o.ok(later));
        assert!(!o.ok(Instant::now()), "once");
        assert!(
            !o.failed(later, "run", &backend()),
            "a failure of a call from before the recovery says nothing"
        );
        assert!(!o.is_down());
        assert!(o.failed(Instant::now(), "run", &backend()));
    }
}

//! Until when a request may still leave the process: the engine's leases as this
//! process's own monotonic clock sees them.
//!
//! The engine marks a call outbound under a lease that another worker may take over once
//! it expires. A worker that was paused (GC, SIGSTOP, a frozen VM) or cut off from the
//! ledger cannot learn in time that its lease is gone — asking needs a round trip it may
//! not get. What it can know without asking is how long ago its lease was last confirmed,
//! by a clock no wall-clock step moves: a [`Window`] holds that deadline (last confirmed
//! renewal + lease − a margin) and is closed outright when a renewal is refused. A
//! [`Fence`] is the windows a call's request depends on (its run's and its own), and every
//! adapter asks it immediately before a request is handed to the transport — and before
//! any reconnect or re-send: a closed fence means the request does not leave
//! ([`Fence::check`]), and a request still being connected when the fence closes is
//! dropped ([`Fence::closed`]).
//!
//! What is left: the moment between the check and the bytes reaching the wire (a process
//! paused exactly there sends once it wakes). Only a downstream that honours the
//! idempotency key closes that window; ARCHITECTURE.md ("Fencing") says so.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

/// Where one lease stands, as this process knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Confirmed until this instant (already less a margin for clock-rate drift and
    /// the other workers' judgement of expiry).
    Until(Instant),
    /// A renewal was refused: another worker holds it, or it was given up.
    Lost,
}

/// One lease's local deadline; cheap to clone, every clone sees the same lease. The
/// engine confirms it after each successful renewal and closes it when one is refused.
#[derive(Debug, Clone)]
pub struct Window(Arc<watch::Sender<Held>>);

impl Window {
    /// A window open until `deadline`.
    pub fn until(deadline: Instant) -> Self {
        Window(Arc::new(watch::Sender::new(Held::Until(deadline))))
    }

    /// A renewal that was sent at `sent_at` succeeded: open until `deadline` (never
    /// moved back, and never reopened once lost).
    pub fn confirm(&self, deadline: Instant) {
        self.0.send_if_modified(|held| match *held {
            Held::Until(d) if d < deadline => {
                *held = Held::Until(deadline);
                true
            }
            _ => false,
        });
    }

    /// A renewal was refused (`LeaseLost`): nothing may leave under this lease again.
    pub fn lose(&self) {
        self.0.send_replace(Held::Lost);
    }

    /// The deadline, or `None` once lost.
    pub fn deadline(&self) -> Option<Instant> {
        match *self.0.borrow() {
            Held::Until(d) => Some(d),
            Held::Lost => None,
        }
    }
}

/// Why a fence no longer lets a request leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    /// The lease's local deadline passed: it was not confirmed in time (the ledger was
    /// unreachable, or this process was paused), so another worker may hold it now.
    #[error("the lease was not confirmed in time (paused or cut off from the ledger)")]
    Lapsed,
    /// A renewal was refused: another worker holds the lease.
    #[error("the lease was lost to another worker")]
    Lost,
}

/// The windows a call's request depends on; with none it is always open (a call made
/// outside the engine, a test). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    windows: Vec<Window>,
}

impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        self.windows.len() == other.windows.len()
            && self
                .windows
                .iter()
                .zip(&other.windows)
                .all(|(a, b)| Arc::ptr_eq(&a.0, &b.0))
    }
}

impl Fence {
    /// A fence that never closes.
    pub fn open() -> Self {
        Fence::default()
    }

    /// A fence open while every one of `windows` is.
    pub fn of(windows: impl IntoIterator<Item = Window>) -> Self {
        Fence {
            windows: windows.into_iter().collect(),
        }
    }

    /// Ok while every window is open; called immediately before a request is handed to
    /// the transport.
    pub fn check(&self) -> Result<(), Closed> {
        let now = Instant::now();
        for w in &self.windows {
            match *w.0.borrow() {
                Held::Lost => return Err(Closed::Lost),
                Held::Until(d) if now >= d => return Err(Closed::Lapsed),
                Held::Until(_) => {}
            }
        }
        Ok(())
    }

    /// Resolves when the fence closes (pending forever for an open fence). Race a
    /// request against it with the fence first (`biased`), so that a process woken after
    /// a pause drops the request before it polls the connection again: every poll reads
    /// the monotonic clock before anything else, so whichever wake-up comes first after
    /// a pause (the socket's or the timer's), a lapsed fence wins.
    pub fn closed(&self) -> impl Future<Output = Closed> + Send + '_ {
        let mut waiting = Box::pin(self.wait_closed());
        std::future::poll_fn(move |cx| {
            if let Err(why) = self.check() {
                return std::task::Poll::Ready(why);
            }
            waiting.as_mut().poll(cx)
        })
    }

    /// Runs `work` unless the fence closes first (checked before each poll of `work`).
    pub async fn race<F: Future>(&self, work: F) -> Result<F::Output, Closed> {
        tokio::select! {
            biased;
            why = self.closed() => Err(why),
            out = work => Ok(out),
        }
    }

    /// Waits for a deadline or a change of any window; see [`Fence::closed`].
    async fn wait_closed(&self) -> Closed {
        if self.windows.is_empty() {
            return std::future::pending().await;
        }
        let mut receivers: Vec<_> = self.windows.iter().map(|w| w.0.subscribe()).collect();
        loop {
            if let Err(why) = self.check() {
                return why;
            }
            let earliest = self
                .windows
                .iter()
                .filter_map(Window::deadline)
                .min()
                .unwrap_or_else(Instant::now);
            let changed =
                futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(earliest)) => {}
                _ = changed => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_open_fence_holds_until_its_earliest_window() {
        let far = Window::until(Instant::now() + Duration::from_secs(60));
        let near = Window::until(Instant::now() + Duration::from_millis(30));
        let fence = Fence::of([far.clone(), near.clone()]);
        assert_eq!(fence.check(), Ok(()));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(fence.check(), Err(Closed::Lapsed));
        near.confirm(Instant::now() + Duration::from_secs(60));
        assert_eq!(
            fence.check(),
            Ok(()),
            "a confirmed renewal reopens a lapsed window"
        );
        far.lose();
        assert_eq!(fence.check(), Err(Closed::Lost));
        far.confirm(Instant::now() + Duration::from_secs(600));
        assert_eq!(fence.check(), Err(Closed::Lost), "a lost lease stays lost");
        assert_eq!(Fence::open().check(), Ok(()));
    }

    #[test]
    fn a_confirmation_never_moves_the_deadline_back() {
        let w = Window::until(Instant::now() + Duration::from_secs(60));
        w.confirm(Instant::now() + Duration::from_millis(1));
        assert_eq!(Fence::of([w]).check(), Ok(()));
    }

    #[tokio::test]
    async fn closed_wakes_at_the_deadline_and_on_loss() {
        let w = Window::until(Instant::now() + Duration::from_millis(50));
        let started = Instant::now();
        assert_eq!(Fence::of([w]).closed().await, Closed::Lapsed);
        assert!(started.elapsed() >= Duration::from_millis(45));

        let w = Window::until(Instant::now() + Duration::from_secs(60));
        let fence = Fence::of([w.clone()]);
        let waiter = tokio::spawn(async move { fence.closed().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        w.lose();
        let why = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(why, Ok(Ok(Closed::Lost))), "{why:?}");
    }
}

//! The heartbeat of a run this worker executes: a task that renews the run lease and
//! notices cancellation requests while the run loop works.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flow_ledger::RunLease;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use flow_adapters::Window;

use crate::gateway::Gateway;

/// Starts the heartbeat of `lease`. It stops when the returned handle is dropped,
/// however the run loop ends, a panic included: a detached heartbeat would keep
/// renewing the lease of a run nobody executes. A lost lease is reported on `lost`.
pub(super) fn start(
    ledger: flow_ledger::Ledger,
    lease: RunLease,
    gateway: Gateway,
    cancel: Arc<AtomicBool>,
    window: Window,
    lost: watch::Sender<bool>,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(heartbeat(
        ledger, lease, gateway, cancel, window, lost,
    )))
}

/// Renews the run lease every third of its length and polls for a cancellation request
/// every second, or every quarter of a shorter lease (a read; the renewal is a write, so
/// it runs less often). Each renewal
/// confirms `window` from the moment it was asked (the lease cannot end earlier than
/// that plus its length); a refused one closes it, so no call of the run sends again.
async fn heartbeat(
    ledger: flow_ledger::Ledger,
    lease: RunLease,
    gateway: Gateway,
    cancel: Arc<AtomicBool>,
    window: Window,
    lost: watch::Sender<bool>,
) {
    const CANCEL_POLL: Duration = Duration::from_secs(1);
    // A short lease (`FLOW_LEASE`) is renewed often enough that its window never
    // lapses between two renewals: ticks of a quarter of it at the most.
    let mut tick = tokio::time::interval(CANCEL_POLL.min(crate::lease::length() / 4));
    tick.tick().await;
    let mut last_renewal = Instant::now();
    let mut failures = 0u32;
    loop {
        tick.tick().await;
        if last_renewal.elapsed() >= crate::lease::length() / 3 {
            let asked = Instant::now();
            match ledger
                .heartbeat(&lease, crate::lease::length(), gateway.now())
                .await
            {
                Ok(ack) => {
                    failures = 0;
                    last_renewal = Instant::now();
                    window.confirm(crate::lease::confirmed_until(asked));
                    if ack.cancel_requested {
                        cancel.store(true, Ordering::Relaxed);
                    }
                }
                Err(flow_ledger::Error::LeaseLost) => {
                    window.lose();
                    tracing::error!(
                        run = lease.run_id,
                        "run lease lost: another worker took the run over; stopping here"
                    );
                    let _ = lost.send(true);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!(run = lease.run_id, error = %e, "heartbeat failed; retrying");
                    }
                }
            }
        } else if let Ok(true) = ledger.cancel_requested(&lease.run_id).await {
            cancel.store(true, Ordering::Relaxed);
        }
    }
}

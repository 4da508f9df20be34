//! Stopping a daemon: the [`Handle`] and the signals that drive it.
//!
//! Two levels, as operators expect from a service manager: the first SIGTERM or SIGINT
//! is a graceful stop (no new claims, calls in flight finish within the grace period,
//! leases released); a second one is an immediate stop (leases then expire on their own,
//! or at once for workers on the same host, which can prove this process is gone).

use tokio_util::sync::CancellationToken;

/// Asks a running [`super::Service`] to stop. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Handle {
    graceful: CancellationToken,
    immediate: CancellationToken,
}

impl Handle {
    /// A handle that has not been triggered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops claiming; lets the calls in flight finish (within the grace period), then
    /// releases the runs to the queue and ends the service.
    pub fn shutdown(&self) {
        self.graceful.cancel();
    }

    /// Ends the service at once, without waiting or releasing.
    pub fn abort(&self) {
        self.graceful.cancel();
        self.immediate.cancel();
    }

    /// Whether a stop (of either kind) was asked for.
    pub fn is_stopping(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Fires on the first stop request: what executions watch to start nothing new.
    pub fn graceful(&self) -> &CancellationToken {
        &self.graceful
    }

    /// Fires on an immediate stop request.
    pub fn immediate(&self) -> &CancellationToken {
        &self.immediate
    }
}

/// The signal that stopped the daemon at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (service managers, `kill`).
    Terminate,
}

impl Signal {
    /// The exit status a shell reports for a process ended by this signal (128 + n).
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }

    /// The signal's name, as logs and messages say it.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        }
    }
}

/// The two stop signals, listened to together: `flow daemon`, `flow serve`, `flow run`
/// and `flow resume` all take them from here, so a service manager's SIGTERM (systemd,
/// Kubernetes, `timeout`) stops each exactly as a terminal's Ctrl-C does. Once installed,
/// neither signal kills the process any more: whoever holds this decides what it means.
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (SIGTERM and SIGINT on Unix, Ctrl-C elsewhere).
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// Waits for the next SIGTERM or SIGINT; `None` when no more can arrive (the
    /// runtime is shutting down, or Ctrl-C cannot be listened to).
    pub async fn next(&mut self) -> Option<Signal> {
        #[cfg(unix)]
        {
            tokio::select! {
                got = self.term.recv() => got.map(|()| Signal::Terminate),
                got = self.int.recv() => got.map(|()| Signal::Interrupt),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c()
                .await
                .ok()
                .map(|()| Signal::Interrupt)
        }
    }
}

/// Feeds SIGTERM/SIGINT into `handle`: the first asks for a graceful stop, the second
/// for an immediate one, which this returns. Returns `None` if the signal handlers
/// cannot be installed (the daemon then runs until it is killed or idle) or no second
/// signal can arrive.
pub async fn on_signals(handle: Handle) -> Option<Signal> {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install signal handlers");
            return None;
        }
    };
    let first = signals.next().await?;
    tracing::warn!(
        signal = first.name(),
        "stopping: no new runs; calls in flight finish within the grace period (signal again to stop at once)"
    );
    handle.shutdown();
    let second = signals.next().await?;
    tracing::warn!(
        signal = second.name(),
        "stopping at once: leases are left to expire"
    );
    handle.abort();
    Some(second)
}

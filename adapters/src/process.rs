//! Process groups: how flow makes sure a command or MCP server leaves nothing behind.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A child's process group (the child's pid, since it leads the group). Dropping it
/// kills the whole group with `SIGKILL`, synchronously: a call future dropped by the
/// engine, a session dropped at shutdown or a start that timed out must not leave
/// processes behind, and a `tokio::spawn`ed kill may never run once the runtime stops.
pub(crate) struct Group(Option<Pid>);

impl Group {
    /// The group led by `pid`; `None` (no pid) makes a guard that does nothing.
    pub(crate) fn of(pid: Option<u32>) -> Self {
        Group(pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw))
    }

    /// Sends `SIGKILL` to every process in the group; a group already gone is fine.
    pub(crate) fn kill(&self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

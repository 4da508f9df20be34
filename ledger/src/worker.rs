//! Worker identity: `host:pid:start`.
//!
//! A lease names its holder. Because the id carries the process start time, a worker on
//! the same host can *prove* that a holder is dead (no such pid, or the pid was reused by
//! a process that started at another time) and take its leases over at once instead of
//! waiting for them to expire. A holder on another host is never declared dead: only its
//! lease expiry may free its work.

use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, SystemClock};

/// The id of one worker process: `host:pid:start`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(String);

impl WorkerId {
    /// The id of this process. Computed once: the start time does not change.
    pub fn current() -> WorkerId {
        static CURRENT: OnceLock<WorkerId> = OnceLock::new();
        CURRENT
            .get_or_init(|| {
                let pid = std::process::id();
                let start = process_start(pid).unwrap_or_else(|| {
                    // Not Linux (or /proc hidden): any stable unique value will do; such
                    // ids are simply never provably dead.
                    format!("t{}", SystemClock.now().as_millis())
                });
                WorkerId::new(&this_host(), pid, &start)
            })
            .clone()
    }

    /// Builds an id from its parts (tests use made-up hosts to model remote workers).
    pub fn new(host: &str, pid: u32, start: &str) -> WorkerId {
        WorkerId(format!("{host}:{pid}:{start}"))
    }

    /// Wraps an id read back from the database or from the command line.
    pub fn from_string(s: impl Into<String>) -> WorkerId {
        WorkerId(s.into())
    }

    /// The id text, as stored in lease columns.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `(host, pid, start)` if the id has that shape.
    pub fn parts(&self) -> Option<(&str, u32, &str)> {
        let mut it = self.0.rsplitn(3, ':');
        let start = it.next()?;
        let pid = it.next()?.parse().ok()?;
        let host = it.next()?;
        Some((host, pid, start))
    }

    /// True only when this id names a process on *this* host that no longer exists (no
    /// such pid, or the pid now belongs to a process with another start time). Never true
    /// for other hosts or for ids of an unknown shape: being wrong here would let two
    /// workers send the same request, so only proof counts.
    pub fn is_provably_dead(&self) -> bool {
        let Some((host, pid, start)) = self.parts() else {
            return false;
        };
        if host != this_host() {
            return false;
        }
        // Only ids written by `current()` on Linux can be checked, and only from the same
        // PID namespace (containers sharing a hostname see different pids), and only where
        // /proc shows every process (`hidepid` would make a live one look gone).
        let Some(ns) = start.rsplit_once(".n").map(|(_, ns)| ns) else {
            return false;
        };
        if !start.starts_with('b') || Some(ns) != pid_namespace().as_deref() || proc_hides_pids() {
            return false;
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        match process_start(pid) {
            Some(actual) => actual != start,
            // It exists but cannot be read: no proof.
            None => false,
        }
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn this_host() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().replace(':', "_"))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned())
    })
    .clone()
}

/// `b<boot time>.<start ticks>.n<pid namespace>`: field 22 of `/proc/<pid>/stat` (clock
/// ticks since boot) qualified by the boot time, so it is unique across reboots without
/// needing `sysconf`, and by the PID namespace the pid belongs to.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) is in parentheses and may contain spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3; field 22 is the 20th from there.
    let ticks = rest.split_whitespace().nth(19)?;
    Some(format!("b{}.{ticks}.n{}", boot_time()?, pid_namespace()?))
}

/// The inode of this process's PID namespace (`pid:[4026531836]` → `4026531836`).
fn pid_namespace() -> Option<String> {
    static NS: OnceLock<Option<String>> = OnceLock::new();
    NS.get_or_init(|| {
        let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let text = link.to_string_lossy();
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        (!digits.is_empty()).then_some(digits)
    })
    .clone()
}

/// Whether /proc is mounted with `hidepid` (other users' processes invisible).
fn proc_hides_pids() -> bool {
    static HIDES: OnceLock<bool> = OnceLock::new();
    *HIDES.get_or_init(|| {
        let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
            return true;
        };
        mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[1] == "/proc"
                && f[2] == "proc"
                && f[3].split(',').any(|o| {
                    o.strip_prefix("hidepid=")
                        .is_some_and(|v| !matches!(v, "0" | "off"))
                })
        })
    })
}

fn boot_time() -> Option<u64> {
    static BTIME: OnceLock<Option<u64>> = OnceLock::new();
    *BTIME.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_alive_and_well_formed() {
        let me = WorkerId::current();
        let (host, pid, _start) = me.parts().expect("shape");
        assert_eq!(host, this_host());
        assert_eq!(pid, std::process::id());
        assert!(!me.is_provably_dead());
    }

    /// Whether `start` has the shape `process_start` writes on Linux:
    /// `b<boot time>.<start ticks>.n<pid namespace>`, all three decimal.
    fn linux_start_shape(start: &str) -> bool {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let Some(rest) = start.strip_prefix('b') else {
            return false;
        };
        let parts: Vec<&str> = rest.split('.').collect();
        matches!(parts.as_slice(), [boot, ticks, ns]
            if digits(boot) && digits(ticks) && ns.strip_prefix('n').is_some_and(digits))
    }

    #[test]
    fn linux_start_shape_is_checked() {
        assert!(linux_start_shape("b1700000000.123.n4026531836"));
        for bad in [
            "t1700000000",
            "b1.2",
            "b1.2.3",
            "b.2.n3",
            "b1.x.n3",
            "b1.2.n",
            "",
        ] {
            assert!(!linux_start_shape(bad), "{bad}");
        }
    }

    /// On Linux the id must carry a `/proc` start time: a broken parse falls back to
    /// the `t…` form, which is never provably dead, and would switch the proofs below
    /// off without a word. Elsewhere there is no `/proc` and nothing to prove.
    #[test]
    fn dead_only_with_proof() {
        let me = WorkerId::current();
        let (host, pid, start) = me.parts().expect("shape");
        #[cfg(target_os = "linux")]
        assert!(
            linux_start_shape(start),
            "on Linux the worker id must carry /proc's start time: {me}"
        );
        if cfg!(target_os = "linux") {
            let ns = pid_namespace().expect("pid namespace");
            // Same pid, other start time: the pid was reused, the holder is gone.
            let reused = format!("b1.1.n{ns}");
            assert!(WorkerId::new(host, pid, &reused).is_provably_dead());
            // A pid that cannot exist on Linux (above pid_max).
            assert!(WorkerId::new(host, 4_294_000_000, &reused).is_provably_dead());
            // Another PID namespace (a container with the same hostname): no proof.
            assert!(!WorkerId::new(host, 4_294_000_000, "b1.1.n1").is_provably_dead());
            // An id without a namespace: no proof.
            assert!(!WorkerId::new(host, 4_294_000_000, "b1.1").is_provably_dead());
        }
        // Other hosts are never provably dead.
        assert!(!WorkerId::new("elsewhere", 4_294_000_000, "b1.1").is_provably_dead());
        // Unknown shapes are never provably dead.
        assert!(!WorkerId::from_string("garbage").is_provably_dead());
    }
}

//! Fault injection for crash tests (a testing hook, documented as such).
//!
//! `FLOW_FAULT=<point>:<node>` aborts the process — as if killed — when the gateway
//! reaches `point` for `node` (for a `for_each` node: its first item to get there, or
//! one item named `node[<key>]`): `after_claim` (claimed, not marked outbound),
//! `after_outbound` (outbound committed, request not sent), `after_response` (response
//! arrived, outcome not recorded), `after_complete` (outcome recorded). The crash tests
//! use it to prove each window is safe; in production the variable is simply unset.
//!
//! Release builds read it too (the crash tests run the real binary), so a stray value in
//! a daemon's environment would abort it at that node on every run that reaches it.
//! Every command that runs workflows (`run`, `resume`, `daemon`, `serve`) therefore says
//! so on stderr at start ([`start_warning`]): a `warning:` line naming the point and the
//! node, or that the value was ignored.

/// The points where the gateway may be stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The node's approval is recorded as approved; nothing is claimed yet.
    AfterApproval,
    /// The call is claimed, not marked outbound.
    AfterClaim,
    /// The outbound mark is committed; the request is not sent yet.
    AfterOutbound,
    /// The response has arrived; the outcome is not recorded yet.
    AfterResponse,
    /// The outcome is recorded.
    AfterComplete,
}

impl Point {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "after_approval" => Self::AfterApproval,
            "after_claim" => Self::AfterClaim,
            "after_outbound" => Self::AfterOutbound,
            "after_response" => Self::AfterResponse,
            "after_complete" => Self::AfterComplete,
            _ => return None,
        })
    }

    /// The point as `FLOW_FAULT` spells it, for the start warning.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterApproval => "after_approval",
            Self::AfterClaim => "after_claim",
            Self::AfterOutbound => "after_outbound",
            Self::AfterResponse => "after_response",
            Self::AfterComplete => "after_complete",
        }
    }
}

/// Why a `FLOW_FAULT` value configures no fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not `<point>:<node>` with a known point and a non-empty node.
    #[error(
        "ignoring FLOW_FAULT={spec:?} (expected <after_approval|after_claim|after_outbound|after_response|after_complete>:<node>)"
    )]
    Unparsable {
        /// The value as set.
        spec: String,
    },
}

/// The configured fault, read once from `FLOW_FAULT`.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    fault: Option<(Point, String)>,
}

impl Faults {
    /// Reads `FLOW_FAULT` (unset or empty: no fault). An unparsable value configures no
    /// fault; [`start_warning`] is what reports it, once per command.
    pub fn from_env() -> Self {
        match std::env::var("FLOW_FAULT") {
            Ok(spec) if !spec.is_empty() => Self::parse(&spec).unwrap_or_default(),
            _ => Self::default(),
        }
    }

    /// `<point>:<node>` → the fault.
    pub fn parse(spec: &str) -> Result<Self, Error> {
        spec.split_once(':')
            .filter(|(_, node)| !node.is_empty())
            .and_then(|(p, node)| Point::parse(p).map(|p| (p, node.to_string())))
            .map(|fault| Self { fault: Some(fault) })
            .ok_or_else(|| Error::Unparsable {
                spec: spec.to_string(),
            })
    }

    /// Aborts the process if the fault for `node` at `point` is configured — or, with
    /// `FLOW_FAULT_ACTION=stop`, stops it (SIGSTOP, as a GC pause, a debugger or a frozen
    /// VM would) the first time, and goes on when it is continued: the fencing tests
    /// pause a worker right after its outbound mark this way.
    pub fn hit(&self, point: Point, node: &str) {
        if let Some((p, n)) = &self.fault
            && *p == point
            && (n == node || crate::item_id::is_item_of(n, node))
        {
            if std::env::var("FLOW_FAULT_ACTION").as_deref() == Ok("stop") {
                static STOPPED: std::sync::Once = std::sync::Once::new();
                STOPPED.call_once(|| {
                    eprintln!("flow: FLOW_FAULT {point:?} at node {node}: stopping (SIGSTOP)");
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                    eprintln!("flow: FLOW_FAULT {point:?} at node {node}: continued");
                });
                return;
            }
            eprintln!("flow: FLOW_FAULT {point:?} at node {node}: aborting");
            std::process::abort();
        }
    }
}

/// The line a command that runs workflows prints on stderr at start when `FLOW_FAULT`
/// is set and not empty: a stray value would otherwise abort a daemon at that node
/// again and again without a word of why. `None` when it is unset.
pub fn start_warning() -> Option<String> {
    notice(std::env::var("FLOW_FAULT").ok().as_deref())
}

fn notice(spec: Option<&str>) -> Option<String> {
    let spec = spec.filter(|s| !s.is_empty())?;
    Some(match Faults::parse(spec) {
        Ok(Faults {
            fault: Some((point, node)),
        }) => format!(
            "warning: FLOW_FAULT={spec} is set: this process aborts when node `{node}` reaches {} (a crash-test hook; unset FLOW_FAULT outside tests)",
            point.as_str()
        ),
        Ok(Faults { fault: None }) => return None,
        Err(e) => format!("warning: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_warning_names_the_point_and_the_node() {
        assert_eq!(notice(None), None);
        assert_eq!(notice(Some("")), None);
        let set = notice(Some("after_outbound:charge")).expect("a warning");
        assert!(
            set.starts_with("warning: FLOW_FAULT=after_outbound:charge is set"),
            "{set}"
        );
        assert!(
            set.contains("node `charge` reaches after_outbound"),
            "{set}"
        );
        for bad in ["bogus", "after_claim", "after_claim:", "before_claim:x"] {
            let said = notice(Some(bad)).expect("a warning");
            assert!(said.starts_with("warning: ignoring FLOW_FAULT="), "{said}");
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
        for point in [
            "after_claim",
            "after_outbound",
            "after_response",
            "after_complete",
        ] {
            let parsed = Faults::parse(&format!("{point}:n")).expect("parses");
            assert_eq!(parsed.fault.map(|(p, _)| p.as_str()), Some(point));
        }
    }
}

//! Fault injection for crash tests (a testing hook, documented as such).
//!
//! `FLOW_FAULT=<point>:<node>` aborts the process — as if killed — when the gateway
//! reaches `point` for `node`: `after_claim` (claimed, not marked outbound),
//! `after_outbound` (outbound committed, request not sent), `after_response` (response
//! arrived, outcome not recorded), `after_complete` (outcome recorded). The crash tests
//! use it to prove each window is safe; in production the variable is simply unset.

/// The points where the gateway may be stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
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
            "after_claim" => Self::AfterClaim,
            "after_outbound" => Self::AfterOutbound,
            "after_response" => Self::AfterResponse,
            "after_complete" => Self::AfterComplete,
            _ => return None,
        })
    }
}

/// The configured fault, read once from `FLOW_FAULT`.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    fault: Option<(Point, String)>,
}

impl Faults {
    /// Reads `FLOW_FAULT`; an unparsable value is reported on stderr and ignored.
    pub fn from_env() -> Self {
        let Ok(spec) = std::env::var("FLOW_FAULT") else {
            return Self::default();
        };
        match spec
            .split_once(':')
            .and_then(|(p, node)| Point::parse(p).map(|p| (p, node.to_string())))
        {
            Some(fault) => Self { fault: Some(fault) },
            None => {
                eprintln!(
                    "flow: ignoring FLOW_FAULT={spec:?} (expected <after_claim|after_outbound|after_response|after_complete>:<node>)"
                );
                Self::default()
            }
        }
    }

    /// Aborts the process if the fault for `node` at `point` is configured.
    pub fn hit(&self, point: Point, node: &str) {
        if let Some((p, n)) = &self.fault
            && *p == point
            && n == node
        {
            eprintln!("flow: FLOW_FAULT {point:?} at node {node}: aborting");
            std::process::abort();
        }
    }
}

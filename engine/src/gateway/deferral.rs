//! Why a step's call waits with nothing sent: the reasons a call is let go unsent and
//! its step deferred (a downstream's hold-off, a rate limit, a concurrency slot, a
//! fence), in the words `flow run`, the logs and `ToolCall::waiting` use.

/// Why a step's call was put off with nothing sent ([`StepResult::Deferred`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferral {
    /// The tool's rate limit or daily quota has no room now.
    RateLimited,
    /// The downstream answered `429`/`503` with `Retry-After`: the request had no
    /// effect, and the call (and, for a tool under flow control, every worker's call of
    /// the tool) waits until then — not a failure, not an attempt.
    HeldOff,
    /// Every slot of the tool's `concurrency:` limit is taken (calls in flight or in
    /// doubt, or older calls waiting first): the call waits in line.
    Concurrency {
        /// The tool's limit.
        limit: u32,
        /// Calls holding a slot (outbound or in doubt).
        in_use: u32,
        /// Calls waiting ahead of this one.
        ahead: u32,
    },
    /// The worker's fence closed before the request left, or its outbound mark may not
    /// have been written: the call was given back unsent, to be claimed again.
    GivenBack,
}

impl std::fmt::Display for Deferral {
    /// Why the call waits, as `flow run` and the logs say it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Deferral::RateLimited => f.write_str("rate limited"),
            Deferral::HeldOff => {
                f.write_str("the downstream asked to wait (Retry-After); nothing was processed")
            }
            Deferral::Concurrency {
                limit,
                in_use,
                ahead,
            } => write!(
                f,
                "waiting for a slot of the tool's concurrency limit ({in_use} of {limit} \
                 in flight or in doubt, {ahead} waiting ahead)"
            ),
            Deferral::GivenBack => {
                f.write_str("not sent (its lease or outbound mark was not confirmed); given back")
            }
        }
    }
}

//! The contract between the engine and every adapter.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::Error;

/// A boxed, sendable future, so that [`Tool`] stays dyn-compatible (the engine holds
/// `Box<dyn Tool>` built from a workflow's tool spec).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One call of a tool, fully rendered: the engine has already substituted every
/// `${{ }}` expression and secret, so adapters never see templates.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The node's rendered `with`.
    pub args: Value,
    /// The key of this effect attempt (`<base>:<attempt>`), sent as `Idempotency-Key`
    /// by HTTP tools so a deduplicating downstream can recognise a re-send.
    pub idempotency_key: String,
    /// Per-attempt timeout. Always set: no request leaves without one.
    pub timeout: Duration,
}

impl Call {
    /// A call with these arguments, key and per-attempt timeout.
    pub fn new(args: Value, idempotency_key: impl Into<String>, timeout: Duration) -> Self {
        Call {
            args,
            idempotency_key: idempotency_key.into(),
            timeout,
        }
    }
}

/// What a call produced, and how many requests it sent to get there.
///
/// `requests_sent` is what the ledger's `outbound_requests` and the usage rows count
/// (and rate limits and quotas): requests that actually left the process, including the MCP re-auth
/// re-send and excluding an HTTP connect attempt that was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The tool's JSON output, or the classified failure.
    pub result: Result<Value, Error>,
    /// Requests that left the process during this call.
    pub requests_sent: u32,
}

impl Outcome {
    /// A successful outcome.
    pub fn ok(value: Value, requests_sent: u32) -> Self {
        Outcome {
            result: Ok(value),
            requests_sent,
        }
    }

    /// A failed outcome.
    pub fn err(error: Error, requests_sent: u32) -> Self {
        Outcome {
            result: Err(error),
            requests_sent,
        }
    }
}

/// How safe it is to repeat a tool's call whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SideEffect {
    /// Repeating may repeat the effect: an unknown outcome goes `in_doubt`. (Named for
    /// what it is, not "no side-effect guarantee": it is the class that *has* effects.)
    NotIdempotent,
    /// The downstream deduplicates on the `Idempotency-Key`: re-send with the same key.
    IdempotentHeader,
    /// Reading only (GET, MCP `readOnlyHint`/`idempotentHint`, pure functions):
    /// re-sending is harmless.
    ReadOnly,
}

/// One callable tool, built per call by the engine from a rendered spec plus a shared
/// client or pool. Implementations classify every failure; none turns an error into a
/// success value.
pub trait Tool: Send + Sync {
    /// Performs the call under `call.timeout`.
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome>;

    /// The side-effect class, which decides how an unknown outcome is resolved.
    fn side_effect(&self) -> SideEffect;
}

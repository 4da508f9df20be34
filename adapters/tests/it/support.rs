//! Small helpers shared by the test modules.

use std::time::Duration;

use flow_adapters::{Call, Error, FailureKind, Outcome};
use serde_json::Value;

/// A call with a 10 s timeout and key `k-1`.
pub fn call(args: Value) -> Call {
    Call::new(args, "k-1", Duration::from_secs(10))
}

/// A call with this timeout.
pub fn call_within(args: Value, timeout: Duration) -> Call {
    Call::new(args, "k-1", timeout)
}

/// The output of a successful outcome, or a panic naming the error.
pub fn ok(outcome: &Outcome) -> &Value {
    match &outcome.result {
        Ok(value) => value,
        Err(error) => panic!("expected success, got {error}"),
    }
}

/// The error of a failed outcome, or a panic naming the output.
pub fn err(outcome: &Outcome) -> &Error {
    match &outcome.result {
        Ok(value) => panic!("expected an error, got output {value}"),
        Err(error) => error,
    }
}

/// Asserts the error's kind (ignoring `retry_after`) and that the message contains `text`.
#[track_caller]
pub fn assert_kind(outcome: &Outcome, kind: FailureKind, text: &str) {
    let error = err(outcome);
    let same = std::mem::discriminant(&error.kind) == std::mem::discriminant(&kind);
    assert!(same, "expected {kind:?}, got {error}");
    assert!(
        error.message.contains(text),
        "expected the message to contain {text:?}: {error}"
    );
}

/// `Transient` with any retry hint.
pub const TRANSIENT: FailureKind = FailureKind::Transient { retry_after: None };

//! The function registry and the `core.*` built-ins.

use std::time::Duration;

use flow_adapters::function::{FunctionSpec, RegisterError, Registry};
use flow_adapters::{Error, FailureKind, SideEffect, Tool};
use serde_json::{Value, json};

use crate::support::{TRANSIENT, assert_kind, call, call_within, ok};

async fn run(name: &str, args: Value) -> flow_adapters::Outcome {
    let registry = Registry::with_builtins();
    let tool = registry
        .get(name)
        .unwrap_or_else(|| panic!("{name} is not registered"));
    tool.call(call(args)).await
}

#[tokio::test]
async fn builtins_are_listed_and_pure() {
    let registry = Registry::with_builtins();
    let names = registry.names();
    for name in [
        "core.echo",
        "core.sleep",
        "core.fail",
        "core.merge",
        "core.template",
        "core.format",
        "core.sum",
        "core.pick",
        "core.get",
        "core.json_parse",
    ] {
        assert!(
            names.contains(&name.to_string()),
            "{name} missing from {names:?}"
        );
        assert!(registry.is_pure(name), "{name} should be pure");
    }
    let echo = registry
        .get("core.echo")
        .unwrap_or_else(|| panic!("core.echo"));
    assert_eq!(echo.side_effect(), SideEffect::ReadOnly);
}

#[tokio::test]
async fn echo_returns_its_args_and_sends_nothing() {
    let outcome = run("core.echo", json!({"a": [1, 2], "b": "x"})).await;
    assert_eq!(ok(&outcome), &json!({"a": [1, 2], "b": "x"}));
    assert_eq!(outcome.requests_sent, 0, "pure functions send nothing");
}

#[tokio::test]
async fn sleep_accepts_duration_or_ms() {
    let outcome = run("core.sleep", json!({"duration": "20ms"})).await;
    assert_eq!(ok(&outcome), &json!({"slept_ms": 20}));
    let outcome = run("core.sleep", json!({"ms": 5})).await;
    assert_eq!(ok(&outcome), &json!({"slept_ms": 5}));
    let outcome = run("core.sleep", json!({"duration": "soon"})).await;
    assert_kind(&outcome, FailureKind::Permanent, "bad `duration`");
    let outcome = run("core.sleep", json!({"seconds": 1})).await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "unknown argument(s) `seconds`",
    );
}

#[tokio::test]
async fn sleep_past_the_timeout_is_transient() {
    let registry = Registry::with_builtins();
    let tool = registry
        .get("core.sleep")
        .unwrap_or_else(|| panic!("core.sleep"));
    let outcome = tool
        .call(call_within(
            json!({"duration": "5s"}),
            Duration::from_millis(50),
        ))
        .await;
    assert_kind(&outcome, TRANSIENT, "timed out");
}

#[tokio::test]
async fn fail_fails_with_each_kind() {
    let outcome = run("core.fail", json!({"message": "nope"})).await;
    assert_eq!(outcome.result, Err(Error::permanent("nope")));
    let outcome = run(
        "core.fail",
        json!({"kind": "transient", "retry_after_ms": 1500}),
    )
    .await;
    assert_eq!(
        outcome.result.map_err(|e| e.kind),
        Err(FailureKind::Transient {
            retry_after: Some(Duration::from_millis(1500))
        })
    );
    let outcome = run("core.fail", json!({"kind": "unknown"})).await;
    assert_kind(&outcome, FailureKind::Unknown, "core.fail");
    let outcome = run("core.fail", json!({"kind": "not_sent"})).await;
    assert_kind(&outcome, FailureKind::NotSent, "core.fail");
    let outcome = run("core.fail", json!({"kind": "weird"})).await;
    assert_kind(&outcome, FailureKind::Permanent, "`kind` must be one of");
}

#[tokio::test]
async fn merge_is_shallow_and_later_wins() {
    let outcome = run(
        "core.merge",
        json!({"objects": [{"a": 1, "n": {"x": 1}}, {"b": 2, "n": {"y": 2}}, null]}),
    )
    .await;
    assert_eq!(ok(&outcome), &json!({"a": 1, "b": 2, "n": {"y": 2}}));
    let outcome = run(
        "core.merge",
        json!({"first": {"a": 1}, "second": {"a": 2, "c": 3}}),
    )
    .await;
    assert_eq!(ok(&outcome), &json!({"a": 2, "c": 3}));
    let outcome = run("core.merge", json!({"objects": [{"a": 1}, 5]})).await;
    assert_kind(&outcome, FailureKind::Permanent, "item 1 is a number");
}

#[tokio::test]
async fn template_and_format_return_the_text() {
    for name in ["core.template", "core.format"] {
        let outcome = run(name, json!({"text": "refund 42 done"})).await;
        assert_eq!(ok(&outcome), &json!("refund 42 done"));
        let outcome = run(name, json!({"txt": "typo"})).await;
        assert_kind(
            &outcome,
            FailureKind::Permanent,
            "unknown argument(s) `txt`",
        );
    }
}

#[tokio::test]
async fn sum_adds_integers_and_floats() {
    assert_eq!(
        ok(&run("core.sum", json!({"values": [1, 2, 3]})).await),
        &json!(6)
    );
    assert_eq!(
        ok(&run("core.sum", json!({"values": [1, 2.5]})).await),
        &json!(3.5)
    );
    assert_eq!(ok(&run("core.sum", json!({"values": []})).await), &json!(0));
    let outcome = run("core.sum", json!({"values": [1, "2"]})).await;
    assert_kind(&outcome, FailureKind::Permanent, "values[1] is a string");
}

#[tokio::test]
async fn pick_get_and_json_parse() {
    let outcome = run(
        "core.pick",
        json!({"object": {"a": 1, "b": 2, "c": 3}, "keys": ["a", "c", "z"]}),
    )
    .await;
    assert_eq!(ok(&outcome), &json!({"a": 1, "c": 3}));
    let outcome = run(
        "core.get",
        json!({"value": {"a": {"b": [10, 20]}}, "path": "a.b.1"}),
    )
    .await;
    assert_eq!(ok(&outcome), &json!(20));
    let outcome = run("core.get", json!({"value": {"a": 1}, "path": "a.missing"})).await;
    assert_eq!(ok(&outcome), &Value::Null);
    let outcome = run("core.json_parse", json!({"text": "{\"n\": [1]}"})).await;
    assert_eq!(ok(&outcome), &json!({"n": [1]}));
    let outcome = run("core.json_parse", json!({"text": "{nope"})).await;
    assert_kind(&outcome, FailureKind::Permanent, "not valid JSON");
}

async fn greet(args: Value) -> Result<Value, Error> {
    let name = args["name"]
        .as_str()
        .ok_or_else(|| Error::permanent("greet: `name` must be a string"))?;
    Ok(json!({ "greeting": format!("hello, {name}") }))
}

#[tokio::test]
async fn custom_async_fn_registers_and_runs() {
    let registry = Registry::with_builtins();
    registry
        .register("acme.greet", FunctionSpec::pure("Greets."), greet)
        .unwrap_or_else(|e| panic!("{e}"));
    let tool = registry
        .get("acme.greet")
        .unwrap_or_else(|| panic!("acme.greet"));
    assert_eq!(
        ok(&tool.call(call(json!({"name": "ada"}))).await),
        &json!({"greeting": "hello, ada"})
    );
    let outcome = tool.call(call(json!({"name": 1}))).await;
    assert_kind(&outcome, FailureKind::Permanent, "`name` must be a string");

    assert_eq!(
        registry.register("acme.greet", FunctionSpec::pure("again"), greet),
        Err(RegisterError::Duplicate("acme.greet".to_string()))
    );
    assert_eq!(
        registry.register("bad name", FunctionSpec::pure("x"), greet),
        Err(RegisterError::InvalidName("bad name".to_string()))
    );
}

#[tokio::test]
async fn effectful_functions_count_a_request_and_time_out_unknown() {
    let registry = Registry::new();
    registry
        .register(
            "acme.send",
            FunctionSpec::effectful("Sends."),
            |_args: Value| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(Value::Null)
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!registry.is_pure("acme.send"));
    let tool = registry
        .get("acme.send")
        .unwrap_or_else(|| panic!("acme.send"));
    assert_eq!(tool.side_effect(), SideEffect::NotIdempotent);
    let outcome = tool
        .call(call_within(Value::Null, Duration::from_millis(30)))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "timed out");
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn a_panicking_function_is_an_error_not_a_crash() {
    let registry = Registry::new();
    registry
        .register(
            "acme.boom",
            FunctionSpec::pure("Panics."),
            |_args: Value| async {
                if true {
                    panic!("boom");
                }
                Ok(Value::Null)
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let tool = registry
        .get("acme.boom")
        .unwrap_or_else(|| panic!("acme.boom"));
    let outcome = tool.call(call(Value::Null)).await;
    assert_kind(&outcome, FailureKind::Permanent, "panicked: boom");
}

#[tokio::test]
async fn unknown_function_is_absent() {
    let registry = Registry::with_builtins();
    assert!(registry.get("core.nope").is_none());
    assert!(!registry.is_pure("core.nope"));
}

//! The command adapter against real programs and shell scripts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use flow_adapters::command::{CommandTool, DEFAULT_ENV_ALLOW, Spec};
use flow_adapters::{FailureKind, SideEffect, Tool};
use serde_json::{Value, json};

use crate::support::{assert_kind, call, call_within, ok};

fn sh(script: &str) -> Spec {
    Spec::new(["sh", "-c", script])
}

#[tokio::test]
async fn json_stdout_is_parsed() {
    let tool = CommandTool::new(sh(r#"echo '{"total": 42, "ok": true}'"#));
    let outcome = tool.call(call(Value::Null)).await;
    assert_eq!(ok(&outcome), &json!({"total": 42, "ok": true}));
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(tool.side_effect(), SideEffect::NotIdempotent);
}

#[tokio::test]
async fn text_stdout_is_a_trimmed_string() {
    let tool = CommandTool::new(sh("printf '  hello world \\n\\n'"));
    assert_eq!(
        ok(&tool.call(call(Value::Null)).await),
        &json!("hello world")
    );
}

#[tokio::test]
async fn stdin_receives_with_as_json_then_eof() {
    // `cat` only ends when stdin is closed, so this also checks the close.
    let tool = CommandTool::new(Spec::new(["cat"]));
    let args = json!({"order": "A-1", "amount": 12.5, "tags": ["x"]});
    assert_eq!(ok(&tool.call(call(args.clone())).await), &args);
}

#[tokio::test]
async fn nonzero_exit_is_permanent_with_the_stderr_tail() {
    let tool = CommandTool::new(sh("echo 'bad input' >&2; exit 3"));
    let outcome = tool.call(call(Value::Null)).await;
    assert_kind(&outcome, FailureKind::Permanent, "exited with code 3");
    assert_kind(&outcome, FailureKind::Permanent, "bad input");
    assert_eq!(outcome.requests_sent, 1);

    // A long stderr is cut to its end.
    let tool = CommandTool::new(sh(
        "i=0; while [ $i -lt 400 ]; do echo 'noise noise noise noise' >&2; i=$((i+1)); done; echo 'THE END' >&2; exit 1",
    ));
    let outcome = tool.call(call(Value::Null)).await;
    assert_kind(&outcome, FailureKind::Permanent, "THE END");
    let message = &crate::support::err(&outcome).message;
    assert!(
        message.len() < 2600,
        "stderr tail not bounded: {} bytes",
        message.len()
    );
}

/// Whether `pid` is gone (or a zombie nobody reaped yet, which runs nothing).
fn is_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pid_file = dir.path().join("grandchild.pid");
    let script = format!(
        "sleep 30 & echo $! > {}; cat >/dev/null; wait",
        pid_file.display()
    );
    let tool = CommandTool::new(sh(&script));
    let started = Instant::now();
    let outcome = tool
        .call(call_within(json!({"x": 1}), Duration::from_millis(500)))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "timed out after 500ms");
    assert_eq!(outcome.requests_sent, 1);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the kill took too long"
    );

    let pid = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{e}"));
    let pid = pid.trim();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !is_gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(is_gone(pid), "grandchild {pid} survived the timeout");
}

#[tokio::test]
async fn background_children_do_not_hold_the_call_open() {
    let tool = CommandTool::new(sh("sleep 30 & echo done"));
    let started = Instant::now();
    let outcome = tool
        .call(call_within(Value::Null, Duration::from_secs(20)))
        .await;
    assert_eq!(ok(&outcome), &json!("done"));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn environment_is_cleared_except_the_allow_list_and_declared_env() {
    // Some variable of this test process that is not on the default allow-list.
    let (outside_name, outside_value) = std::env::vars()
        .find(|(name, value)| {
            !DEFAULT_ENV_ALLOW.contains(&name.as_str())
                && !value.is_empty()
                && !value.contains('\n')
        })
        .unwrap_or_else(|| panic!("the test process has no environment variable to check with"));

    let mut spec = Spec::new(["env"]);
    spec.env = vec![("FLOW_DECLARED".to_string(), "yes".to_string())];
    let outcome = CommandTool::new(spec.clone()).call(call(Value::Null)).await;
    let text = ok(&outcome)
        .as_str()
        .unwrap_or_else(|| panic!("env output is text"))
        .to_string();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n))
        .collect();
    assert!(text.lines().any(|l| l == "FLOW_DECLARED=yes"), "{text}");
    assert!(names.contains(&"PATH"), "PATH is allowed: {text}");
    assert!(
        !names.contains(&outside_name.as_str()),
        "{outside_name} leaked: {text}"
    );
    for name in &names {
        assert!(
            DEFAULT_ENV_ALLOW.contains(name) || *name == "FLOW_DECLARED" || *name == "PWD",
            "unexpected variable {name}"
        );
    }

    spec.env_allow.push(outside_name.clone());
    let outcome = CommandTool::new(spec).call(call(Value::Null)).await;
    let text = ok(&outcome).as_str().unwrap_or_default().to_string();
    assert!(
        text.lines()
            .any(|l| l == format!("{outside_name}={outside_value}")),
        "{text}"
    );
}

#[tokio::test]
async fn missing_or_unexecutable_program_is_not_sent() {
    let tool = CommandTool::new(Spec::new(["/nonexistent/flow-test-program"]));
    let outcome = tool.call(call(Value::Null)).await;
    assert_kind(
        &outcome,
        FailureKind::NotSent,
        "cannot start `/nonexistent/flow-test-program`",
    );
    assert_eq!(outcome.requests_sent, 0);

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    let tool = CommandTool::new(Spec::new([script.to_string_lossy().to_string()]));
    let outcome = tool.call(call(Value::Null)).await;
    assert_kind(&outcome, FailureKind::NotSent, "ermission denied");
    assert_eq!(outcome.requests_sent, 0);

    let tool = CommandTool::new(Spec::new(Vec::<String>::new()));
    assert_kind(
        &tool.call(call(Value::Null)).await,
        FailureKind::Permanent,
        "empty",
    );
}

#[tokio::test]
async fn cwd_is_honoured() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut spec = Spec::new(["pwd"]);
    spec.cwd = Some(dir.path().to_path_buf());
    let outcome = CommandTool::new(spec).call(call(Value::Null)).await;
    let shown = ok(&outcome).as_str().unwrap_or_default().to_string();
    let expected = std::fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Path::new(&shown), expected);
}

#[tokio::test]
async fn stdout_over_the_cap_is_permanent_and_named() {
    let mut spec = sh(
        "i=0; while [ $i -lt 2000 ]; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done",
    );
    spec.max_output_bytes = 1000;
    let outcome = CommandTool::new(spec).call(call(Value::Null)).await;
    assert_kind(&outcome, FailureKind::Permanent, "1000-byte stdout cap");
}

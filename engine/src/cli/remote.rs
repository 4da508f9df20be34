//! Client mode: `flow submit`, `flow runs`, `flow show` and `flow resume` with `--server URL` talk to a
//! `flow serve` over its JSON API instead of opening the database, so an operator's
//! laptop needs a token, not database credentials.
//!
//! The token is read from the environment variable `--token-env` names (`FLOW_TOKEN` by
//! default), never from a flag: flags end up in shell history and `ps`. The server's
//! errors (`application/problem+json`) are printed as `error: <title>: <detail>`; a
//! refused request (4xx: bad input, unknown run, a `--run-id` taken, a bad or
//! too-weak token) exits 2, an unreachable or failing server (5xx, 408, 429) exits 5.

use std::io::Write;

use serde_json::{Value as Json, json};

use flow_adapters::api_client::{self, ApiClient};

use super::run::ResumeArgs;
use super::show::{RunsArgs, ShowArgs};
use super::submit::SubmitArgs;
use super::table::{table, terminal_width};
use super::{Cli, Error, Remote, exit};

/// The client `--server` and `--token-env` describe (exit 2 for a URL that is not
/// http(s)).
pub(crate) fn client(server: &str, remote: &Remote) -> Result<ApiClient, Error> {
    let token = std::env::var(&remote.token_env)
        .ok()
        .filter(|t| !t.trim().is_empty());
    ApiClient::new(server, token).map_err(|e| failed(&e, false))
}

/// The CLI error for a failed request: the server's problem as `<title>: <detail>`
/// ([`Error::Remote`]), a bad URL exit 2, no answer exit 5.
pub(crate) fn failed(e: &api_client::Error, has_token: bool) -> Error {
    match e {
        api_client::Error::BadUrl(_) => Error::invalid(format!("--server {e}")),
        api_client::Error::BadSegment(_) => Error::invalid(e.to_string()),
        api_client::Error::Unreachable { .. } => Error::unavailable(e.to_string()),
        api_client::Error::Problem {
            status,
            title,
            detail,
        } => {
            let mut detail = detail.clone();
            if *status == 401 && !has_token {
                detail.push_str(" (no token was sent: set the variable --token-env names)");
            }
            Error::Remote {
                status: *status,
                title: title.clone(),
                detail,
            }
        }
    }
}

/// `flow submit --server`: checks the file and inputs here as `flow submit` does, then
/// posts the run; prints its id.
pub(crate) async fn submit(
    server: &str,
    args: &SubmitArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let client = client(server, &args.remote)?;
    let (wf, new) = super::run::check_new_run(
        &args.file,
        &args.inputs,
        args.inputs_file.as_deref(),
        args.run_id.as_deref(),
    )?;
    let body = json!({"workflow": new.workflow_text, "inputs": new.inputs, "run_id": new.id});
    let answer = client
        .post(&["runs"], &body)
        .await
        .map_err(|e| failed(&e, client.has_token()))?;
    let id = answer["id"].as_str().unwrap_or(&new.id);
    let _ = writeln!(stdout, "{id}");
    if answer["created"] == json!(true) {
        let _ = writeln!(stderr, "run {id} queued ({}) on {}", wf.name, client.base());
    } else {
        let status = answer["status"].as_str().unwrap_or("?");
        let _ = writeln!(
            stderr,
            "run {id} exists with the same workflow and inputs ({status})"
        );
    }
    Ok(exit::OK)
}

/// `flow resume --server`: settles the call `--resolve` names (the server re-queues the
/// run once nothing of it is in doubt) or, without `--resolve`, re-queues the run; the
/// server's daemons continue it, so this is always `--detach`. Prints the run id (or,
/// with `--json`, the run object after the change).
pub(crate) async fn resume(
    server: &str,
    args: &ResumeArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    args.who.check_remote()?;
    let client = client(server, &args.remote)?;
    let answer = match &args.resolve {
        Some(spec) => {
            let mut body = resolve_body(spec, args)?;
            if let Some(why) = &args.who.reason {
                body["reason"] = json!(why);
            }
            let v = client
                .post(&["runs", &args.run, "resolve"], &body)
                .await
                .map_err(|e| failed(&e, client.has_token()))?;
            let _ = writeln!(
                stderr,
                "resolved {} as {} on {}",
                body["node"].as_str().unwrap_or("?"),
                body["outcome"].as_str().unwrap_or("?"),
                client.base()
            );
            v
        }
        None => {
            if args.output.is_some() || args.error.is_some() {
                return Err(Error::invalid(
                    "--output and --error only go with --resolve",
                ));
            }
            let v = client
                .post(
                    &["runs", &args.run, "resume"],
                    &json!({ "reason": args.who.reason }),
                )
                .await
                .map_err(|e| failed(&e, client.has_token()))?;
            let _ = writeln!(
                stderr,
                "run {} queued for the daemons of {}",
                args.run,
                client.base()
            );
            v
        }
    };
    if args.json {
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&answer).unwrap_or_default()
        );
    } else {
        let _ = writeln!(stdout, "{}", args.run);
    }
    Ok(exit::OK)
}

/// The API's resolve body for `--resolve NODE=succeeded|failed|retry` with `--output` /
/// `--error` (the same rules as a local resume; the server checks the node).
fn resolve_body(spec: &str, args: &ResumeArgs) -> Result<Json, Error> {
    let (node, how) = spec.split_once('=').ok_or_else(|| {
        Error::invalid(format!(
            "--resolve `{spec}`: expected NODE=succeeded|failed|retry"
        ))
    })?;
    let mut body = json!({ "node": node, "outcome": how });
    match how {
        "succeeded" => {
            let text = args.output.as_deref().ok_or_else(|| {
                Error::invalid("--resolve NODE=succeeded needs --output JSON (the call's output)")
            })?;
            let output: Json = serde_json::from_str(text)
                .map_err(|e| Error::invalid(format!("--output is not valid JSON: {e}")))?;
            body["output"] = output;
        }
        "failed" => {
            if let Some(error) = &args.error {
                body["error"] = json!(error);
            }
        }
        "retry" => {}
        other => {
            return Err(Error::invalid(format!(
                "--resolve: unknown resolution `{other}`; use succeeded, failed or retry"
            )));
        }
    }
    if how != "succeeded" && args.output.is_some() {
        return Err(Error::invalid("--output goes with NODE=succeeded only"));
    }
    if how != "failed" && args.error.is_some() {
        return Err(Error::invalid("--error goes with NODE=failed only"));
    }
    Ok(body)
}

/// `flow runs --server`: one page of the API's listing; the command for the next page
/// (with the server's cursor) on stderr.
pub(crate) async fn runs(
    cli: &Cli,
    server: &str,
    args: &RunsArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let client = client(server, &args.remote)?;
    let pairs = super::show::input_pairs(&args.inputs)?;
    let names: Vec<String> = pairs.iter().map(|(n, _)| format!("input.{n}")).collect();
    let mut query = vec![("limit", args.limit.min(1_000).to_string())];
    for (name, value) in [
        ("status", &args.status),
        ("workflow", &args.workflow),
        ("since", &args.since),
        ("until", &args.until),
        ("prefix", &args.prefix),
        ("parent", &args.parent),
        ("cursor", &args.cursor),
    ] {
        if let Some(v) = value {
            query.push((name, v.clone()));
        }
    }
    for (name, (_, value)) in names.iter().zip(&pairs) {
        query.push((name.as_str(), value.clone()));
    }
    let page = client
        .get(&["runs"], &query)
        .await
        .map_err(|e| failed(&e, client.has_token()))?;
    let list = page["runs"].as_array().cloned().unwrap_or_default();
    if args.json {
        let text = serde_json::to_string_pretty(&list).unwrap_or_default();
        let _ = writeln!(stdout, "{text}");
    } else {
        let cell = |r: &Json, k: &str| r[k].as_str().unwrap_or("-").to_string();
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|r| {
                ["id", "status", "workflow", "created_at", "finished_at"]
                    .map(|k| cell(r, k))
                    .to_vec()
            })
            .collect();
        let header = ["RUN", "STATUS", "WORKFLOW", "CREATED", "FINISHED"];
        let _ = stdout.write_all(table(&header, &rows, terminal_width()).as_bytes());
    }
    if let Some(cursor) = page["next_cursor"].as_str() {
        let mut prefix = format!(
            "{} runs --server {}",
            super::flow_command(cli),
            super::shell_quote(server)
        );
        if args.remote.token_env != "FLOW_TOKEN" {
            prefix.push_str(&format!(" --token-env {}", args.remote.token_env));
        }
        let next = super::show::next_page(prefix, args);
        let _ = writeln!(stderr, "more runs: {next} --cursor {cursor}");
    }
    Ok(exit::OK)
}

/// `flow show --server`: the API's run object (`--json`: exactly `flow show --json`'s),
/// or a summary of it.
pub(crate) async fn show(
    server: &str,
    args: &ShowArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let client = client(server, &args.remote)?;
    let v = client
        .get(&["runs", &args.run], &[])
        .await
        .map_err(|e| failed(&e, client.has_token()))?;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
    } else {
        summary(&v, client.base())
    };
    let _ = stdout.write_all(text.as_bytes());
    Ok(exit::OK)
}

/// The human view of a run object: the run, then one line per call and per step.
fn summary(v: &Json, base: &str) -> String {
    use std::fmt::Write as _;
    let s = |x: &Json| x.as_str().unwrap_or("-").to_string();
    let run = &v["run"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}  {}  workflow {}",
        s(&run["id"]),
        s(&run["status"]),
        s(&run["workflow"])
    );
    let _ = writeln!(
        out,
        "  created {}  started {}  finished {}",
        s(&run["created_at"]),
        s(&run["started_at"]),
        s(&run["finished_at"])
    );
    let _ = writeln!(out, "  inputs {}", run["inputs"]);
    if !run["output"].is_null() {
        let _ = writeln!(out, "  output {}", run["output"]);
    }
    if let Some(e) = run["error"].as_str() {
        let _ = writeln!(out, "  {e}");
    }
    let _ = writeln!(out);
    for step in v["steps"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{}  step {}  {}",
            s(&step["node_id"]),
            s(&step["step_id"]),
            s(&step["status"])
        );
    }
    let mut in_doubt = false;
    for c in v["tool_calls"].as_array().into_iter().flatten() {
        in_doubt |= c["status"] == "in_doubt";
        let _ = writeln!(
            out,
            "{}  call {}  tool {}  attempts {}  requests sent {}  key {}",
            s(&c["tool_call_id"]),
            s(&c["status"]),
            s(&c["tool"]),
            c["attempt_count"],
            requests_sent(c),
            s(&c["current_key"])
        );
    }
    if in_doubt {
        let inbox = format!("{}/ui/in-doubt", base.trim_end_matches('/'));
        let _ = writeln!(out, "\nIn doubt: resolve in the console's inbox at {inbox}");
    }
    out
}

/// A call's requests sent as `flow show` prints them locally (a lower bound when a
/// send's count is unknown), from the API's fields.
fn requests_sent(c: &Json) -> flow_ledger::RequestsSent {
    let n = |v: &Json| v.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    flow_ledger::RequestsSent {
        known: n(&c["outbound_requests_known"]).max(n(&c["outbound_requests"])),
        uncounted_sends: n(&c["uncounted_sends"]),
    }
}

/// `flow cancel --server URL`: `POST /api/v1/runs/{id}/cancel` (the token's name and
/// `--reason` are recorded); prints `RUN STATUS` as the local cancel does.
pub(crate) async fn cancel(
    server: &str,
    args: &super::show::CancelArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    args.who.check_remote()?;
    let client = client(server, &args.remote)?;
    let v = client
        .post(
            &["runs", &args.run, "cancel"],
            &json!({ "reason": args.who.reason }),
        )
        .await
        .map_err(|e| failed(&e, client.has_token()))?;
    let _ = writeln!(
        stdout,
        "{} {}",
        v["run"]["id"].as_str().unwrap_or(&args.run),
        v["run"]["status"].as_str().unwrap_or("?")
    );
    Ok(exit::OK)
}

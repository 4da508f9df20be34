//! Client mode: `flow submit`, `flow runs` and `flow show` with `--server URL` talk to a
//! `flow serve` over its JSON API instead of opening the database, so an operator's
//! laptop needs a token, not database credentials.
//!
//! The token is read from the environment variable `--token-env` names (`FLOW_TOKEN` by
//! default), never from a flag: flags end up in shell history and `ps`. The server's
//! errors (`application/problem+json`) are printed as `error: <title>: <detail>`; a
//! refused request (4xx: bad input, unknown run, a `--run-id` taken, a bad or
//! too-weak token) exits 2, an unreachable or failing server (5xx, 408, 429) exits 5.

use std::io::Write;

use clap::Args;
use serde_json::{Value as Json, json};

use super::show::{RunsArgs, ShowArgs};
use super::submit::SubmitArgs;
use super::table::{table, terminal_width};
use super::{Cli, CliError, exit};

/// Where the operator API is, for the commands that can use it instead of `--db`.
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// Talk to the `flow serve` at this URL (http://host:port) instead of opening --db.
    #[arg(long, env = "FLOW_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// With --server: the environment variable that holds the API token.
    #[arg(long, value_name = "VAR", default_value = "FLOW_TOKEN")]
    pub token_env: String,
}

/// An API client for one command.
struct Client {
    http: reqwest::Client,
    base: url::Url,
    token: Option<String>,
}

impl Client {
    /// The client `remote` describes (exit 2 for a URL that is not http(s)).
    fn new(server: &str, remote: &Remote) -> Result<Self, CliError> {
        let base = url::Url::parse(server)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                CliError::invalid(format!(
                    "--server `{server}` is not an http:// or https:// URL"
                ))
            })?;
        let token = std::env::var(&remote.token_env)
            .ok()
            .filter(|t| !t.trim().is_empty());
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| CliError::unavailable(format!("cannot set up an HTTP client: {e}")))?;
        Ok(Self { http, base, token })
    }

    /// The URL of API path `segments` (each escaped) with `query`.
    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> url::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// Sends `req`; a success's JSON body, or the server's problem as the error.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, Json), CliError> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t.trim()),
            None => req,
        };
        let resp = req.send().await.map_err(|e| {
            CliError::unavailable(format!("cannot reach the server at {}: {e}", self.base))
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| {
            CliError::unavailable(format!("the server at {} broke off: {e}", self.base))
        })?;
        let body: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        if status.is_success() {
            return Ok((status.as_u16(), body));
        }
        let title = body["title"]
            .as_str()
            .or(status.canonical_reason())
            .unwrap_or("Error");
        let mut detail = body["detail"]
            .as_str()
            .unwrap_or("no detail given")
            .to_string();
        if status.as_u16() == 401 && self.token.is_none() {
            detail.push_str(" (no token was sent: set the variable --token-env names)");
        }
        Err(CliError::Remote {
            status: status.as_u16(),
            title: title.to_string(),
            detail,
        })
    }
}

/// `flow submit --server`: checks the file and inputs here as `flow submit` does, then
/// posts the run; prints its id.
pub(crate) async fn submit(
    server: &str,
    args: &SubmitArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, CliError> {
    let client = Client::new(server, &args.remote)?;
    let (wf, new) = super::run::check_new_run(
        &args.file,
        &args.inputs,
        args.inputs_file.as_deref(),
        args.run_id.as_deref(),
    )?;
    let body = json!({"workflow": new.workflow_text, "inputs": new.inputs, "run_id": new.id});
    let req = client.http.post(client.url(&["runs"], &[])).json(&body);
    let (_, answer) = client.send(req).await?;
    let id = answer["id"].as_str().unwrap_or(&new.id);
    let _ = writeln!(stdout, "{id}");
    if answer["created"] == json!(true) {
        let _ = writeln!(stderr, "run {id} queued ({}) on {}", wf.name, client.base);
    } else {
        let status = answer["status"].as_str().unwrap_or("?");
        let _ = writeln!(
            stderr,
            "run {id} exists with the same workflow and inputs ({status})"
        );
    }
    Ok(exit::OK)
}

/// `flow runs --server`: one page of the API's listing; the command for the next page
/// (with the server's cursor) on stderr.
pub(crate) async fn runs(
    cli: &Cli,
    server: &str,
    args: &RunsArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, CliError> {
    if args.until.is_some() {
        return Err(CliError::invalid(
            "--until is not available with --server (the API filters by --since only)",
        ));
    }
    let client = Client::new(server, &args.remote)?;
    let mut query = vec![("limit", args.limit.min(1_000).to_string())];
    for (name, value) in [
        ("status", &args.status),
        ("workflow", &args.workflow),
        ("since", &args.since),
        ("cursor", &args.cursor),
    ] {
        if let Some(v) = value {
            query.push((name, v.clone()));
        }
    }
    let (_, page) = client
        .send(client.http.get(client.url(&["runs"], &query)))
        .await?;
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
) -> Result<u8, CliError> {
    let client = Client::new(server, &args.remote)?;
    let (_, v) = client
        .send(client.http.get(client.url(&["runs", &args.run], &[])))
        .await?;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
    } else {
        summary(&v, &client.base)
    };
    let _ = stdout.write_all(text.as_bytes());
    Ok(exit::OK)
}

/// The human view of a run object: the run, then one line per call and per step.
fn summary(v: &Json, base: &url::Url) -> String {
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
            c["outbound_requests"],
            s(&c["current_key"])
        );
    }
    if in_doubt {
        let inbox = base
            .join("ui/in-doubt")
            .map_or_else(|_| String::new(), |u| u.to_string());
        let _ = writeln!(out, "\nIn doubt: resolve in the console's inbox at {inbox}");
    }
    out
}

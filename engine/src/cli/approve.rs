//! `flow approvals`, `flow approve RUN NODE`, `flow deny RUN NODE`: the approvals
//! waiting, and a person's decision on one (locally against `--db`, or through a
//! `flow serve` with `--server`, where the token's name and role decide).

use std::io::Write;

use clap::Args;
use flow_ledger::{ApprovalFilter, ApprovalStatus, Decided};
use serde_json::{Map, Value as Json, json};

use super::who::Who;
use super::{Cli, Error, LedgerContext, exit, open_ledger};
use crate::approval::{self, Decider, Decision, Refusal};
use crate::view::ApprovalView;

/// Arguments of `flow approvals`.
#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Only this run's approvals.
    #[arg(long, value_name = "RUN")]
    pub run: Option<String>,
    /// Every approval, decided ones included (default: pending only).
    #[arg(long)]
    pub all: bool,
    /// Print JSON (a list of approvals) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Client mode: list through a `flow serve`.
    #[command(flatten)]
    pub remote: super::Remote,
}

/// Arguments of `flow approve`.
#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The run.
    pub run: String,
    /// The node awaiting approval.
    pub node: String,
    /// An input the approval declares, `NAME=VALUE` (repeatable).
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// The request digest you reviewed (`flow approvals` shows it): refused if the
    /// request changed since.
    #[arg(long, value_name = "SHA256")]
    pub digest: Option<String>,
    /// Who and why.
    #[command(flatten)]
    pub who: Who,
    /// Client mode: decide through a `flow serve` (the token's name is recorded).
    #[command(flatten)]
    pub remote: super::Remote,
}

/// Arguments of `flow deny`.
#[derive(Debug, Args)]
pub struct DenyArgs {
    /// The run.
    pub run: String,
    /// The node awaiting approval.
    pub node: String,
    /// Who and why (`--reason` is required: the node fails with it).
    #[command(flatten)]
    pub who: Who,
    /// Client mode: decide through a `flow serve`.
    #[command(flatten)]
    pub remote: super::Remote,
}

/// `flow approvals` against `--db`.
pub(crate) async fn approvals(
    cli: &Cli,
    args: &ApprovalsArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    let filter = ApprovalFilter {
        run_id: args.run.clone(),
        status: (!args.all).then_some(ApprovalStatus::Pending),
        limit: 1000,
        as_of: Some(flow_ledger::Clock::now(&flow_ledger::SystemClock)),
    };
    let list = ledger
        .list_approvals(filter)
        .await
        .doing(|| "cannot list approvals".into())?;
    let views: Vec<ApprovalView> = list.iter().map(ApprovalView::of).collect();
    print_approvals(&views, args.json, stdout);
    Ok(exit::OK)
}

/// The list as JSON or as a table with what each approval still needs.
fn print_approvals(views: &[ApprovalView], json: bool, stdout: &mut dyn Write) {
    if json {
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(views).unwrap_or_default()
        );
        return;
    }
    if views.is_empty() {
        let _ = writeln!(stdout, "no approvals waiting");
        return;
    }
    for v in views {
        let _ = writeln!(
            stdout,
            "{} {} ({}) {}: {}/{} approved{}; deadline {}",
            v.run,
            v.node,
            v.tool,
            v.status,
            v.approved_by.len(),
            v.min,
            if v.approved_by.is_empty() {
                String::new()
            } else {
                format!(" by {}", v.approved_by.join(", "))
            },
            v.deadline.to_rfc3339()
        );
        if let Some(m) = &v.message {
            let _ = writeln!(stdout, "  message: {m}");
        }
        let _ = writeln!(stdout, "  request: {}", v.request);
        let _ = writeln!(stdout, "  digest:  {}", v.digest);
    }
}

/// The decider of `flow approve` / `flow deny` against `--db`: the operator, as `admin`,
/// under `--by` (or `$USER@host`) — the CLI holds the database itself.
fn local_decider(who: &Who) -> Result<Decider, Error> {
    Ok(Decider {
        name: who.name()?,
        role: "admin".into(),
    })
}

/// `flow deny` needs a reason (the node fails with it), locally and through a server.
fn deny_reason(who: &Who) -> Result<(), Error> {
    if who.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(Error::invalid(
            "flow deny needs --reason TEXT: the node fails with it",
        ));
    }
    Ok(())
}

/// `flow approve` / `flow deny` against `--db`, through the same rule and compare-and-set
/// as the API.
async fn decide(
    cli: &Cli,
    ledger: &flow_ledger::Ledger,
    decider: Decider,
    d: Decision,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let (run, node) = (d.run.clone(), d.node.clone());
    let decided = crate::approval::decide(ledger, &decider, d, now)
        .await
        .map_err(refused)?;
    let (status, note) = match &decided {
        Decided::Approved(_) => (
            "approved",
            format!(
                "the run is queued again; continue with `{} resume {run}` or let a daemon take it",
                super::flow_command(cli)
            ),
        ),
        Decided::Denied(_) => (
            "denied",
            format!("node `{node}` fails with the reason when the run goes on"),
        ),
        Decided::Voted { needed, .. } => (
            "voted",
            format!("{needed} more approver(s) needed before anything is sent"),
        ),
    };
    let _ = writeln!(stdout, "{run} {node} {status}");
    let _ = writeln!(stderr, "{note}");
    Ok(exit::OK)
}

/// A refused decision as the command line reports it (exit 2 for the user's, 5 for
/// the ledger's trouble).
fn refused(e: approval::Error) -> Error {
    use flow_ledger::Error as E;
    match e {
        e @ (approval::Error::NotFound { .. } | approval::Error::Refused(_)) => {
            Error::invalid(e.to_string())
        }
        approval::Error::Ledger(E::Terminal { status }) => Error::invalid(format!(
            "the run is {status}: its approvals can no longer be decided"
        )),
        approval::Error::Ledger(e @ E::Stale { .. }) => Error::invalid(e.to_string()),
        approval::Error::Ledger(source) => Error::LedgerWhile {
            doing: "cannot decide".into(),
            source,
        },
    }
}

/// `flow approve` from its arguments (inputs typed by the stored declaration).
pub(crate) async fn approve(
    cli: &Cli,
    args: &ApproveArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let decider = local_decider(&args.who)?;
    let ledger = open_ledger(cli).await?;
    let inputs = approve_inputs(&ledger, args).await?;
    let d = Decision {
        run: args.run.clone(),
        node: args.node.clone(),
        approve: true,
        inputs,
        reason: args.who.reason.clone(),
        digest: args.digest.clone(),
    };
    decide(cli, &ledger, decider, d, stdout, stderr).await
}

/// `--input` pairs typed by the approval's declaration (read from the ledger).
async fn approve_inputs(
    ledger: &flow_ledger::Ledger,
    args: &ApproveArgs,
) -> Result<Map<String, Json>, Error> {
    if args.inputs.is_empty() {
        return Ok(Map::new());
    }
    let approval = ledger
        .get_approval(&args.run, &args.node)
        .await
        .doing(|| "cannot read the approval".into())?
        .ok_or_else(|| {
            Error::invalid(format!(
                "run {} has no approval for node `{}`",
                args.run, args.node
            ))
        })?;
    let decls = crate::approval::rule_inputs(&approval.rule);
    crate::inputs::pairs_to_json(&decls, &args.inputs)
        .map_err(|e| Error::invalid(Refusal::BadInputs(e.to_string()).to_string()))
}

/// `flow deny` from its arguments.
pub(crate) async fn deny(
    cli: &Cli,
    args: &DenyArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    deny_reason(&args.who)?;
    let decider = local_decider(&args.who)?;
    let ledger = open_ledger(cli).await?;
    let d = Decision {
        run: args.run.clone(),
        node: args.node.clone(),
        approve: false,
        inputs: Map::new(),
        reason: args.who.reason.clone(),
        digest: None,
    };
    decide(cli, &ledger, decider, d, stdout, stderr).await
}

/// `flow approvals --server`: `GET /api/v1/approvals`.
pub(crate) async fn remote_list(
    server: &str,
    args: &ApprovalsArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let client = super::remote::client(server, &args.remote)?;
    let mut query = Vec::new();
    if let Some(run) = &args.run {
        query.push(("run", run.clone()));
    }
    if args.all {
        query.push(("all", "true".to_owned()));
    }
    let v = client
        .get(&["approvals"], &query)
        .await
        .map_err(|e| super::remote::failed(&e, client.has_token()))?;
    let items: Vec<ApprovalViewWire> =
        serde_json::from_value(v["items"].clone()).unwrap_or_default();
    if args.json {
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&v["items"]).unwrap_or_default()
        );
    } else if items.is_empty() {
        let _ = writeln!(stdout, "no approvals waiting");
    } else {
        for i in items {
            let _ = writeln!(
                stdout,
                "{} {} ({}) {}: {}/{} approved; digest {}",
                i.run,
                i.node,
                i.tool,
                i.status,
                i.approved_by.len(),
                i.min,
                i.digest
            );
        }
    }
    Ok(exit::OK)
}

/// The fields `flow approvals --server` prints from the API's items.
#[derive(Debug, serde::Deserialize)]
struct ApprovalViewWire {
    run: String,
    node: String,
    tool: String,
    status: String,
    approved_by: Vec<String>,
    min: u32,
    digest: String,
}

/// `flow approve --server`: the approval's declared inputs are read first (`GET
/// /api/v1/approvals?run=…`) so `--input` pairs are typed as locally, then
/// `POST /api/v1/runs/{id}/approvals/{node}`.
pub(crate) async fn remote_approve(
    server: &str,
    args: &ApproveArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    args.who.check_remote()?;
    let client = super::remote::client(server, &args.remote)?;
    let failed =
        |e: &flow_adapters::api_client::Error| super::remote::failed(e, client.has_token());
    let mut inputs = Map::new();
    if !args.inputs.is_empty() {
        let query = [("run", args.run.clone()), ("all", "true".to_owned())];
        let v = client
            .get(&["approvals"], &query)
            .await
            .map_err(|e| failed(&e))?;
        let declared = v["items"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["node"] == args.node.as_str()))
            .map(|i| i["inputs"].clone())
            .unwrap_or(Json::Null);
        let decls = crate::approval::rule_inputs(&json!({ "inputs": declared }));
        inputs = crate::inputs::pairs_to_json(&decls, &args.inputs)
            .map_err(|e| Error::invalid(Refusal::BadInputs(e.to_string()).to_string()))?;
    }
    let body = json!({
        "decision": "approve", "inputs": inputs, "reason": args.who.reason,
        "digest": args.digest,
    });
    let v = client
        .post(&["runs", &args.run, "approvals", &args.node], &body)
        .await
        .map_err(|e| failed(&e))?;
    let _ = writeln!(
        stdout,
        "{} {} {}",
        args.run,
        args.node,
        v["outcome"].as_str().unwrap_or("?")
    );
    Ok(exit::OK)
}

/// `flow deny --server`: `POST /api/v1/runs/{id}/approvals/{node}`.
pub(crate) async fn remote_deny(
    server: &str,
    args: &DenyArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    args.who.check_remote()?;
    deny_reason(&args.who)?;
    let client = super::remote::client(server, &args.remote)?;
    let body = json!({ "decision": "deny", "reason": args.who.reason });
    let v = client
        .post(&["runs", &args.run, "approvals", &args.node], &body)
        .await
        .map_err(|e| super::remote::failed(&e, client.has_token()))?;
    let _ = writeln!(
        stdout,
        "{} {} {}",
        args.run,
        args.node,
        v["outcome"].as_str().unwrap_or("?")
    );
    Ok(exit::OK)
}

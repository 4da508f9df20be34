//! `flow submit`: validate a workflow and its inputs, put a run on the queue for the
//! daemons, print its id.
//!
//! Everything about the input is checked before the database is touched (bad input
//! never enqueues anything). With `--run-id` the submit is idempotent: the same file and
//! inputs return the existing run, anything else is refused (exit 2).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use flow_ledger::{NewRun, SystemClock};

use super::run::workflow_hash;
use super::{Cli, exit, logging, open_ledger, validate_options};
use crate::secrets::Secrets;
use crate::workflow::load_file;

/// Arguments of `flow submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Workflow file.
    pub file: PathBuf,
    /// An input, `NAME=VALUE`, typed by the workflow's declaration. Repeatable.
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// A JSON or YAML file holding a mapping of inputs (`--input` wins).
    #[arg(long)]
    pub inputs_file: Option<PathBuf>,
    /// Run id, making the submit idempotent: the same file and inputs return that run.
    #[arg(long)]
    pub run_id: Option<String>,
}

/// The rule `flow run --run-id` applies too: ids end up in keys, logs and file names.
fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `flow submit`.
pub(crate) async fn submit(
    cli: &Cli,
    args: &SubmitArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    logging::init(cli.log_format, &Secrets::default());
    let (wf, source) = match load_file(&args.file, &validate_options()) {
        Ok(loaded) => loaded,
        Err(diags) => {
            let _ = write!(stderr, "{diags}");
            return exit::INVALID;
        }
    };
    let inputs = match crate::inputs::resolve(&wf, &args.inputs, args.inputs_file.as_deref()) {
        Ok(inputs) => inputs,
        Err(e) => {
            let _ = writeln!(stderr, "error: {e}");
            return exit::INVALID;
        }
    };
    let run_id = match &args.run_id {
        Some(id) if valid_run_id(id) => id.clone(),
        Some(id) => {
            let _ = writeln!(
                stderr,
                "error: invalid --run-id `{id}`: use up to 128 letters, digits, `_`, `-` and `.`"
            );
            return exit::INVALID;
        }
        None => format!("run_{}", ulid::Ulid::generate()),
    };
    let ledger = match open_ledger(cli, stderr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let new = NewRun {
        id: run_id.clone(),
        workflow_name: wf.name.clone(),
        workflow_hash: workflow_hash(&source.text),
        workflow_text: source.text,
        inputs,
        priority: 0,
        not_before: None,
    };
    let now = flow_ledger::Clock::now(&SystemClock);
    let code = match ledger.enqueue(new, now).await {
        Ok(enq) => {
            let _ = writeln!(stdout, "{run_id}");
            if enq.created {
                let _ = writeln!(stderr, "run {run_id} queued ({})", wf.name);
            } else {
                let _ = writeln!(
                    stderr,
                    "run {run_id} exists with the same workflow and inputs ({})",
                    enq.run.status
                );
            }
            exit::OK
        }
        Err(flow_ledger::Error::Conflict { reason, .. }) => {
            let _ = writeln!(
                stderr,
                "error: run {run_id} already exists with a different workflow or inputs: {reason}"
            );
            exit::INVALID
        }
        Err(e) => {
            let _ = writeln!(stderr, "error: cannot queue run {run_id}: {e}");
            exit::UNAVAILABLE
        }
    };
    ledger.close().await;
    code
}

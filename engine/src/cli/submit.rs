//! `flow submit`: validate a workflow and its inputs, put a run on the queue for the
//! daemons, print its id.
//!
//! Everything about the input is checked before the database is touched (bad input
//! never enqueues anything). With `--run-id` the submit is idempotent: the same file and
//! inputs return the existing run, anything else is refused (exit 2).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use flow_ledger::SystemClock;

use super::run::check_new_run;
use super::{Cli, Error, exit, logging, open_ledger};
use crate::secrets::Secrets;

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
    /// Client mode: submit through a `flow serve` instead of the database.
    #[command(flatten)]
    pub remote: super::Remote,
}

/// `flow submit`.
pub(crate) async fn submit(
    cli: &Cli,
    args: &SubmitArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    logging::init(
        cli.log_format,
        &Secrets::default(),
        &crate::telemetry::TelemetryConfig::default(),
        crate::telemetry::Process::Command,
    );
    let (wf, new) = check_new_run(
        &args.file,
        &args.inputs,
        args.inputs_file.as_deref(),
        args.run_id.as_deref(),
    )?;
    let run_id = new.id.clone();
    let ledger = open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&SystemClock);
    let starter = super::run::started_by(&super::who::Who::default());
    let result = match ledger.enqueue_as(new, starter, now).await {
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
            Ok(exit::OK)
        }
        Err(e) => Err(super::run::refused_start(&run_id, "queue", e)),
    };
    ledger.close().await;
    result
}

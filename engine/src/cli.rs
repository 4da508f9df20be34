//! The command line: argument parsing and the commands, callable from tests.
//!
//! `main.rs` only calls [`main`]; tests call [`run`] with their own argument list and
//! buffers. Data goes to `stdout`, diagnostics and progress to `stderr`.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::plan::Plan;
use crate::render::{GraphFormat, render};
use crate::workflow::{ValidateOptions, load_file};

/// Exit codes of the `flow` binary (DESIGN §10); scripts and tests rely on them.
pub mod exit {
    /// The run succeeded / the command did what was asked.
    pub const OK: u8 = 0;
    /// The run failed.
    pub const FAILED: u8 = 1;
    /// Invalid input: a bad workflow file, bad arguments, ill-typed inputs.
    pub const INVALID: u8 = 2;
    /// The run is paused: a tool call is in doubt and needs resolving.
    pub const PAUSED: u8 = 3;
    /// The run was cancelled.
    pub const CANCELLED: u8 = 4;
    /// Could not run: database unreachable, bad configuration.
    pub const UNAVAILABLE: u8 = 5;
}

/// flow — durable workflows whose side-effecting tool calls run at most once.
#[derive(Debug, Parser)]
#[command(name = "flow", version, about, long_about = None, propagate_version = true)]
#[command(
    after_help = "Examples:\n  flow validate workflows/*.yaml\n  flow graph workflows/fan_out_fan_in.yaml --format mermaid"
)]
pub struct Cli {
    /// Ledger database URL (sqlite://PATH or postgres://…).
    #[arg(
        long,
        global = true,
        env = "FLOW_DATABASE_URL",
        default_value = "sqlite://.flow/flow.db"
    )]
    pub db: String,
    /// Tenant that owns the runs (every ledger row carries it).
    #[arg(long, global = true, env = "FLOW_TENANT", default_value = "default")]
    pub tenant: String,
    /// Workspace within the tenant.
    #[arg(long, global = true, env = "FLOW_WORKSPACE", default_value = "default")]
    pub workspace: String,
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow files; print every problem as FILE:LINE:COL (exit 0 valid, 2 invalid).
    #[command(after_help = "Example:\n  flow validate workflows/hello.yaml workflows/http.yaml")]
    Validate {
        /// Workflow files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Draw a workflow's DAG as Mermaid or Graphviz DOT on stdout.
    #[command(
        after_help = "Examples:\n  flow graph workflows/fan_out_fan_in.yaml\n  flow graph workflows/fan_out_fan_in.yaml --format dot | dot -Tsvg > dag.svg"
    )]
    Graph {
        /// Workflow file.
        file: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "mermaid")]
        format: GraphFormat,
    },
    /// Print the JSON Schema of workflow files (for editor completion).
    #[command(after_help = "Example:\n  flow schema > workflow.schema.json")]
    Schema,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    run(std::env::args_os().collect(), &mut stdout, &mut stderr)
}

/// Parses `args` (including the program name) and runs the command.
pub fn run(args: Vec<OsString>, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::INVALID
            } else {
                exit::OK
            };
            let text = e.render().ansi().to_string();
            let _ = if e.use_stderr() {
                stderr.write_all(text.as_bytes())
            } else {
                stdout.write_all(text.as_bytes())
            };
            return ExitCode::from(code);
        }
    };
    ExitCode::from(dispatch(cli, stdout, stderr))
}

fn dispatch(cli: Cli, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    match cli.command {
        Command::Validate { files } => validate(&files, stdout, stderr),
        Command::Graph { file, format } => graph(&file, format, stdout, stderr),
        Command::Schema => {
            let _ = stdout.write_all(crate::schema::workflow_schema_text().as_bytes());
            exit::OK
        }
    }
}

/// The validation options of this binary: function names are the built-in registry's.
pub fn validate_options() -> ValidateOptions {
    ValidateOptions::default()
}

fn validate(files: &[PathBuf], stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    let opts = validate_options();
    let mut code = exit::OK;
    for file in files {
        match load_file(file, &opts) {
            Ok((wf, _)) => {
                let _ = writeln!(
                    stdout,
                    "{}: ok ({} nodes, {} tools)",
                    file.display(),
                    wf.nodes.len(),
                    wf.tools.len()
                );
            }
            Err(diags) => {
                let _ = write!(stderr, "{diags}");
                code = exit::INVALID;
            }
        }
    }
    code
}

fn graph(
    file: &PathBuf,
    format: GraphFormat,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let wf = match load_file(file, &validate_options()) {
        Ok((wf, _)) => wf,
        Err(diags) => {
            let _ = write!(stderr, "{diags}");
            return exit::INVALID;
        }
    };
    match Plan::new(&wf) {
        Ok(plan) => {
            let _ = stdout.write_all(render(&wf, &plan, format).as_bytes());
            exit::OK
        }
        Err(_) => exit::INVALID,
    }
}

//! The command line: argument parsing and the commands, callable from tests.
//!
//! `main.rs` only calls [`main`]; tests call [`run`] with their own argument list and
//! buffers. Data goes to `stdout`; diagnostics, progress and logs to `stderr`.

mod approve;
pub mod color;
mod command_kinds;
mod connections;
mod daemon;
mod error;
mod events;
mod follow_up;
mod gc;
mod logging;
mod mcp;
mod meta;
mod publish;
mod reconcile;
mod redrive;
mod remote;
mod run;
mod schedules;
mod serve;
pub(crate) mod show;
mod slots;
mod submit;
mod table;
mod who;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) use error::{Error, LedgerContext};
pub(crate) use follow_up::{prefix as flow_command, quote as shell_quote};
pub(crate) use show::print_json;

use crate::diagram::{GraphFormat, draw};
use crate::snapshot::validate_options;
use crate::workflow::load_file;

/// Exit codes of the `flow` binary (the README's table); scripts and tests rely on them.
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
    /// Interrupted (Ctrl-C or SIGTERM, alike): the run was released, or is left for
    /// `resume`.
    pub const INTERRUPTED: u8 = 130;
}

/// The ledger when `--db` / `FLOW_DATABASE_URL` is not given.
pub(crate) const DEFAULT_DB: &str = "sqlite://.flow/flow.db";

/// flow — durable workflows whose side-effecting tool calls run at most once.
#[derive(Debug, Parser)]
#[command(name = "flow", version = meta::VERSION, about, long_about = None, propagate_version = true)]
#[command(
    after_help = "Examples:\n  flow run workflows/hello.yaml --input name=Ada\n  flow runs --status paused\n  flow show run_01J... \n  flow resume run_01J... --resolve charge=succeeded --output '{\"id\": \"re_1\"}'"
)]
pub struct Cli {
    /// Ledger database URL (sqlite://PATH or postgres://…).
    #[arg(
        long,
        global = true, help_heading = "Global options",
        env = "FLOW_DATABASE_URL",
        default_value = DEFAULT_DB
    )]
    pub db: String,
    /// Tenant that owns the runs (every ledger row carries it).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "FLOW_TENANT",
        default_value = "default"
    )]
    pub tenant: String,
    /// Workspace within the tenant.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "FLOW_WORKSPACE",
        default_value = "default"
    )]
    pub workspace: String,
    /// Log line format on stderr (`RUST_LOG` sets the level).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_enum,
        env = "FLOW_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Colour help and errors: auto (a terminal, unless NO_COLOR is set or
    /// CLICOLOR_FORCE forces it), always or never.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_enum,
        env = "FLOW_COLOR",
        default_value = "auto"
    )]
    pub color: color::ColorWhen,
    /// Configuration file (egress allow-list); default ./flow.toml if present.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "FLOW_CONFIG"
    )]
    pub config: Option<PathBuf>,
    /// Dotenv file with secret values (`NAME=value`); `FLOW_SECRET_<NAME>` variables win.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "FLOW_SECRETS_FILE"
    )]
    pub secrets_file: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where the operator API is, for the commands that can use it instead of `--db`.
#[derive(Debug, Clone, clap::Args)]
pub struct Remote {
    /// Talk to the `flow serve` at this URL (http://host:port) instead of opening --db.
    #[arg(long, env = "FLOW_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// With --server: the environment variable that holds the API token.
    #[arg(long, value_name = "VAR", default_value = "FLOW_TOKEN")]
    pub token_env: String,
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
        /// Workflow files; `-` reads standard input, a directory every `*.yaml` in it.
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
    /// Run a workflow now, in this process; print its output JSON on stdout.
    #[command(
        after_help = "Exit codes: 0 succeeded, 1 failed, 2 invalid input, 3 paused (in doubt), 4 cancelled, 5 could not run, 130 interrupted (a first Ctrl-C or SIGTERM: calls in flight finish and are recorded, the run is released; a second exits at once).\n\nExamples:\n  flow run workflows/hello.yaml --input name=Ada\n  flow run workflows/http.yaml --inputs-file order.yaml --run-id refund-42\n  flow run workflows/hello.yaml --json | jq .steps"
    )]
    Run(run::RunArgs),
    /// Put a run on the queue for `flow daemon` workers; print its id on stdout.
    #[command(
        after_help = "Exit codes: 0 queued (or already there with the same file and inputs), 2 invalid input or a --run-id used with other inputs (with --server: any request the server refused, 4xx), 5 could not reach the database (or the server).\n\nExamples:\n  flow submit workflows/hello.yaml --input name=Ada\n  flow submit workflows/http.yaml --inputs-file order.yaml --run-id refund-42\n  FLOW_TOKEN=... flow submit workflows/hello.yaml --server https://flow.internal:8080"
    )]
    Submit(submit::SubmitArgs),
    /// Execute queued runs: up to --concurrency at once, until stopped (SIGTERM/SIGINT).
    #[command(
        after_help = "A first SIGTERM/SIGINT stops claiming, lets calls in flight finish within --grace and releases the runs (exit 0); a second one exits at once.\n\nExamples:\n  flow --db postgres://flow@db.internal/flow daemon --concurrency 16 --metrics-addr 0.0.0.0:9464\n  flow daemon --exit-when-idle          # drain the queue, then exit 0"
    )]
    Daemon(daemon::DaemonArgs),
    /// Continue a paused or interrupted run here, optionally resolving an in-doubt call.
    #[command(
        after_help = "Examples:\n  flow resume run_01J...\n  flow resume run_01J... --resolve charge=succeeded --output '{\"id\": \"re_1\"}'\n  flow resume run_01J... --resolve charge=failed --error 'declined upstream'\n  flow resume run_01J... --resolve charge=retry    # re-send with the same idempotency key"
    )]
    Resume(run::ResumeArgs),
    /// Probe every in-doubt call of a paused run whose tool declares `reconcile:`, and say what each became.
    #[command(
        after_help = "Exit codes: 0 done (whatever the probes said), 2 invalid input, 5 could not reach the database.\n\nExamples:\n  flow reconcile\n  flow reconcile --run run_01J... --dry-run\n  flow reconcile --json | jq .outcome.decision"
    )]
    Reconcile(reconcile::ReconcileArgs),
    /// Show one run: its nodes, steps, tool calls, and how to resolve what is in doubt.
    #[command(
        after_help = "Examples:\n  flow show run_01J...\n  flow show run_01J... --json\n  FLOW_TOKEN=... flow show run_01J... --server https://flow.internal:8080"
    )]
    Show(show::ShowArgs),
    /// List runs, newest first.
    #[command(
        after_help = "Examples:\n  flow runs\n  flow runs --status paused --json\n  FLOW_TOKEN=... flow runs --server https://flow.internal:8080 --status paused"
    )]
    Runs(show::RunsArgs),
    /// Ask a run to stop: no new steps start; in-flight calls finish; the run ends cancelled.
    #[command(after_help = "Example:\n  flow cancel run_01J...")]
    Cancel(show::CancelArgs),
    /// Free the concurrency slot a call in doubt holds (it stays in doubt): when the downstream is known to have given up on it.
    #[command(
        name = "release-slot",
        after_help = "Exit codes: 0 released, 2 the call holds no slot, 5 could not reach the database.\n\nExample:\n  flow release-slot run_01J... send_sms --reason \"provider dropped the request\""
    )]
    ReleaseSlot(slots::ReleaseSlotArgs),
    /// Put a failed run back on the queue: its failed nodes run again as new attempts (new keys); succeeded nodes are replayed.
    #[command(
        after_help = "Examples:\n  flow redrive run_01J... --reason \"PSP outage over\"\n  flow redrive run_01J... --from charge"
    )]
    Redrive(redrive::RedriveArgs),
    /// List approvals waiting for a decision: the request as it will be sent, its digest, who approved so far.
    #[command(
        after_help = "Examples:\n  flow approvals\n  flow approvals --run run_01J... --json\n  FLOW_TOKEN=... flow approvals --server https://flow.internal:8080"
    )]
    Approvals(approve::ApprovalsArgs),
    /// Approve a node's call (a vote; sent once `min` distinct approvers approved exactly this request).
    #[command(
        after_help = "Exit codes: 0 recorded, 2 refused (not an approver, already decided, the request changed, bad inputs), 5 could not reach the database.\n\nExamples:\n  flow approve run_01J... refund --input reason=\"duplicate charge\"\n  flow approve run_01J... refund --digest 3f2a... --reason \"checked with the customer\""
    )]
    Approve(approve::ApproveArgs),
    /// Deny a node's call: nothing is sent and the node fails with the reason.
    #[command(
        after_help = "Example:\n  flow deny run_01J... refund --reason \"amount does not match the order\""
    )]
    Deny(approve::DenyArgs),
    /// Publish an event for `wait:` nodes (idempotent on `--id`): waits of its name whose `match` accepts its data complete with it.
    #[command(
        after_help = "Exit codes: 0 published (or already published), 2 bad input, 5 could not reach the database.\n\nExamples:\n  flow publish shipment.delivered --data '{\"order\": \"A-17\"}' --id carrier-8812\n  FLOW_TOKEN=... flow publish shipment.delivered --data '{\"order\": \"A-17\"}' --server https://flow.internal:8080"
    )]
    Publish(publish::PublishArgs),
    /// Schedules of flow.toml: next tick, last run, last skip; pause, resume, trigger, history.
    #[command(
        after_help = "Exit codes: 0 done, 2 bad input (an unknown schedule, a workflow that does not validate), 5 a flow.toml that does not check or an unreachable database.\n\nExamples:\n  flow --config flow.toml schedules\n  flow schedules pause nightly --by ada --reason 'bank holiday'\n  flow schedules trigger nightly\n  flow schedules history nightly --json"
    )]
    Schedules(schedules::SchedulesArgs),
    /// Sign in to an MCP server once, as a person (OAuth authorization code with PKCE): workers then use and refresh the stored tokens.
    #[command(
        after_help = "The connection is declared in flow.toml (`[[connections]] name, server`); its tokens are stored in the ledger sealed with AES-256-GCM under FLOW_SECRET_CONNECTIONS_KEY (`flow connections keygen` prints one). The sign-in URL is printed and opened with --browser; the browser comes back to a one-shot listener on 127.0.0.1.\n\nExit codes: 0 signed in, 2 bad input or a sign-in that came back refused (an error, a wrong state, none within --timeout), 5 no key, an unreachable server or database. Nothing is stored unless the sign-in completed.\n\nExamples:\n  flow connect tracker\n  flow connect tracker --browser firefox --by ada"
    )]
    Connect(connections::ConnectArgs),
    /// Connections: who signed in when, scopes, expiry, refresh state (never a token); revoke, keygen.
    #[command(
        after_help = "Exit codes: 0 done, 2 an unknown connection, 5 an unreachable database or a revocation the server did not take (the connection is deleted anyway).\n\nExamples:\n  flow connections\n  flow connections --json\n  flow connections revoke tracker\n  flow connections keygen"
    )]
    Connections(connections::ConnectionsArgs),
    /// Retention by hand: delete the finished runs, events and tombstones `[retention]` in flow.toml says are past their time.
    #[command(
        after_help = "A run is deleted whole in one transaction, and only when it finished before the horizon with no call open or in doubt and no unfinished child or parent; each key its calls used is left as a tombstone, and a later claim of that key is refused. Daemons do the same in the background at `rate` rows per second.\n\nExit codes: 0 done (also when retention is off), 5 a flow.toml that does not check or an unreachable database.\n\nExamples:\n  flow --config flow.toml gc --dry-run\n  flow gc --json"
    )]
    Gc(gc::GcArgs),
    /// Create or upgrade the ledger's tables (also done automatically on first use).
    #[command(after_help = "Example:\n  flow --db postgres://flow@db.internal/flow migrate")]
    Migrate,
    /// Serve the operator API (JSON under /api/v1), /metrics and /healthz over HTTP.
    #[command(
        after_help = "Tokens come from flow.toml ([[api.tokens]] name, role = viewer|operator|admin, secret = NAME whose value is FLOW_SECRET_<NAME> or a --secrets-file line).\n\nExit codes: 0 stopped by SIGTERM/SIGINT, 2 a refused flag or address, 5 bad configuration, missing token secret, unreachable database or address in use.\n\nExamples:\n  flow serve --addr 0.0.0.0:8080\n  flow serve --insecure-no-auth          # loopback only, no tokens"
    )]
    Serve(serve::ServeArgs),
    /// flow as an MCP server: the workflows `[mcp] workflows` names, as tools an agent calls.
    #[command(
        after_help = "An agent's config starts it as a child process:\n  {\"command\": \"flow\", \"args\": [\"--db\", \"sqlite:///var/lib/flow/flow.db\", \"--config\", \"/etc/flow/flow.toml\", \"mcp\", \"serve\"]}\n\nOver HTTP the same tools are at /mcp on `flow serve` and `flow daemon --serve` (Authorization: Bearer <operator token>)."
    )]
    Mcp(mcp::McpArgs),
    /// Events and their delivery to consumers: list, re-queue, follow, dispatch.
    #[command(
        after_help = "Examples:\n  flow events                      # deliveries, newest last\n  flow events --failed             # dead letters\n  flow events redeliver evt_01J... --consumer ops-webhook\n  flow events tail\n  flow events dispatch --once"
    )]
    Events(events::EventsArgs),
    /// Print a shell completion script on stdout.
    #[command(
        after_help = "Examples:\n  flow completions bash > ~/.local/share/bash-completion/completions/flow\n  flow completions zsh > ~/.zfunc/_flow        # with fpath+=~/.zfunc before compinit\n  flow completions fish > ~/.config/fish/completions/flow.fish\n  flow completions powershell >> $PROFILE"
    )]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) on stdout.
    #[command(after_help = "Example:\n  flow man > ~/.local/share/man/man1/flow.1 && man flow")]
    Man,
    /// Print the version, the git commit it was built from, and the ledger schema
    /// version this build expects and `--db` has (nothing is created or migrated).
    #[command(after_help = "Example:\n  flow --db postgres://flow@db.internal/flow version")]
    Version,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    // Not locked for the whole run: log lines and progress come from other threads.
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    run(std::env::args_os().collect(), &mut stdout, &mut stderr)
}

/// Parses `args` (including the program name) and runs the command.
pub fn run(args: Vec<OsString>, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let cli = match Cli::try_parse_from(args.iter()) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::INVALID
            } else {
                exit::OK
            };
            let rendered = e.render();
            let text = if color::for_stream(color::requested(&args), e.use_stderr()) {
                rendered.ansi().to_string()
            } else {
                rendered.to_string()
            };
            let _ = if e.use_stderr() {
                stderr.write_all(text.as_bytes())
            } else {
                stdout.write_all(text.as_bytes())
            };
            return ExitCode::from(code);
        }
    };
    if cli.log_format == LogFormat::Json {
        let mut lines = logging::JsonLines::new(stderr);
        return ExitCode::from(dispatch(cli, stdout, &mut lines));
    }
    ExitCode::from(dispatch(cli, stdout, stderr))
}

fn dispatch(cli: Cli, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    match &cli.command {
        Command::Validate { files } => validate(cli.config.as_deref(), files, stdout, stderr),
        Command::Graph { file, format } => graph(file, *format, stdout, stderr),
        Command::Schema => {
            let _ = stdout.write_all(crate::schema::workflow_schema_text().as_bytes());
            exit::OK
        }
        Command::Completions { shell } => meta::completions(*shell, stdout),
        Command::Man => error::finish(meta::man(stdout), stderr),
        _ => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let e = Error::unavailable(format!("cannot start the async runtime: {e}"));
                    return error::finish(Err(e), stderr);
                }
            };
            let code = runtime.block_on(async_command(&cli, stdout, stderr));
            // The last spans leave after the runtime's work, on the exporter's thread.
            crate::telemetry::finish();
            code
        }
    }
}

async fn async_command(cli: &Cli, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    let code = command(cli, stdout, stderr).await;
    close_opened().await;
    code
}

/// The ledgers this process opened (see [`open_ledger`]), closed before it exits.
static OPENED: std::sync::Mutex<Vec<flow_ledger::Ledger>> = std::sync::Mutex::new(Vec::new());

/// Work a command left running beside it (the planner-statistics check of `run` and
/// `resume`), finished before the ledgers close: its connection says goodbye too, and an
/// ANALYZE it started through the pool is not cut off by the pool's close.
static BESIDE: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

/// Runs `work` beside the command; the process waits for it (within the exit's bound)
/// before closing its ledgers.
pub(crate) fn spawn_beside(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let handle = tokio::spawn(work);
    BESIDE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(handle);
}

/// Closes every ledger this process opened: PostgreSQL then sees each session end with
/// a goodbye instead of logging "connection reset by peer" for every one, and SQLite's
/// writer finishes cleanly. Bounded: a database that went away must not hold up the
/// exit code.
async fn close_opened() {
    let beside = std::mem::take(&mut *BESIDE.lock().unwrap_or_else(|e| e.into_inner()));
    let opened = std::mem::take(&mut *OPENED.lock().unwrap_or_else(|e| e.into_inner()));
    let closing = async {
        futures::future::join_all(beside).await;
        futures::future::join_all(opened.iter().map(flow_ledger::Ledger::close)).await;
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), closing).await;
}

/// Checks an identifier a user names (`--run-id`, `--tenant`, `--workspace`, the `RUN`
/// of `flow show`/`cancel`/`resume`) against the one id grammar
/// ([`flow_ledger::ids::check_id`]): they end up in keys, log lines, metrics labels,
/// file names and URL paths. `what` names the flag or argument in the message (exit 2).
pub(crate) fn check_id(
    kind: flow_ledger::ids::IdKind,
    what: &str,
    value: &str,
) -> Result<(), Error> {
    flow_ledger::ids::check_id(kind, value)
        .map_err(|e| Error::invalid(format!("invalid {what}: {e}")))
}

/// The run id a command names as its `RUN` argument (show, cancel, resume), checked
/// before anything is opened or sent: in client mode a `..` would otherwise be
/// normalized out of the URL and ask the server for another resource.
fn check_run_arg(command: &Command) -> Result<(), Error> {
    let run = match command {
        Command::Show(a) => &a.run,
        Command::Cancel(a) => &a.run,
        Command::ReleaseSlot(a) => &a.run,
        Command::Resume(a) => &a.run,
        Command::Redrive(a) => &a.run,
        Command::Approve(a) => &a.run,
        Command::Deny(a) => &a.run,
        _ => return Ok(()),
    };
    check_id(flow_ledger::ids::IdKind::Run, "run id argument", run)
}

/// What every ledger command checks before it opens anything: the tenant and
/// workspace are well-formed names, a read-only `--db` is not asked to write, and a
/// command that reads does not create a missing SQLite ledger (exit 5).
fn check_ledger_args(cli: &Cli) -> Result<(), Error> {
    use flow_ledger::ids::IdKind;
    check_id(IdKind::Tenant, "--tenant", &cli.tenant)?;
    check_id(IdKind::Workspace, "--workspace", &cli.workspace)?;
    if flow_ledger::is_read_only_url(&cli.db)
        && let Some(name) = command_kinds::writing_command(&cli.command)
    {
        return Err(Error::invalid(format!(
            "--db {} is read-only (mode=ro) and `flow {name}` writes to the ledger; nothing was written (drop mode=ro to write)",
            flow_ledger::redact_url(&cli.db)
        )));
    }
    if command_kinds::needs_existing_ledger(&cli.command)
        && let Some(path) = flow_ledger::sqlite_path(&cli.db)
        && !path.starts_with(':')
        && !std::path::Path::new(path).exists()
    {
        return Err(Error::NoLedger {
            path: path.to_string(),
        });
    }
    Ok(())
}

async fn command(cli: &Cli, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    if let Err(e) = check_run_arg(&cli.command) {
        return error::finish(Err(e), stderr);
    }
    if let Some(result) = client_mode(cli, stdout, stderr).await {
        return error::finish(result, stderr);
    }
    if command_kinds::runs_workflows(&cli.command)
        && let Some(warning) = crate::fault::start_warning()
    {
        let _ = writeln!(stderr, "{warning}");
    }
    let checked = check_ledger_args(cli).and_then(|()| {
        // A lease length that cannot be read is refused before any lease is taken.
        if command_kinds::runs_workflows(&cli.command) {
            crate::lease::from_env().map_err(|e| Error::invalid(e.to_string()))?;
        }
        Ok(())
    });
    let result = match checked {
        Err(e) => Err(e),
        Ok(()) => match &cli.command {
            Command::Run(args) => run::run(cli, args, stdout, stderr).await,
            Command::Resume(args) => run::resume(cli, args, stdout, stderr).await,
            Command::Reconcile(args) => reconcile::reconcile(cli, args, stdout, stderr).await,
            Command::Submit(args) => submit::submit(cli, args, stdout, stderr).await,
            Command::Daemon(args) => daemon::daemon(cli, args, stdout, stderr).await,
            Command::Serve(args) => serve::serve(cli, args, stderr).await,
            Command::Mcp(args) => mcp::mcp(cli, args, stdout, stderr).await,
            Command::Show(args) => show::show(cli, args, stdout).await,
            Command::Runs(args) => show::runs(cli, args, stdout, stderr).await,
            Command::Cancel(args) => show::cancel(cli, args, stdout, stderr).await,
            Command::ReleaseSlot(args) => slots::release_slot(cli, args, stdout).await,
            Command::Redrive(args) => redrive::redrive(cli, args, stdout, stderr).await,
            Command::Approvals(args) => approve::approvals(cli, args, stdout).await,
            Command::Approve(args) => approve::approve(cli, args, stdout, stderr).await,
            Command::Deny(args) => approve::deny(cli, args, stdout, stderr).await,
            Command::Publish(args) => publish::publish(cli, args, stdout).await,
            Command::Events(args) => events::events(cli, args, stdout, stderr).await,
            Command::Schedules(args) => schedules::schedules(cli, args, stdout).await,
            Command::Gc(args) => gc::gc(cli, args, stdout).await,
            Command::Connect(args) => connections::connect(cli, args, stdout).await,
            Command::Connections(args) => connections::connections(cli, args, stdout).await,
            Command::Migrate => migrate(cli, stdout).await,
            Command::Version => Ok(meta::version(cli, stdout).await),
            Command::Validate { .. }
            | Command::Graph { .. }
            | Command::Schema
            | Command::Completions { .. }
            | Command::Man => Ok(exit::OK),
        },
    };
    crate::connections::store::drain().await;
    error::finish(result, stderr)
}

/// Client mode (`--server`): `submit`, `runs`, `show` and `resume` through the operator API; the
/// server holds the ledger, so nothing local is checked or opened. `None` otherwise.
async fn client_mode(
    cli: &Cli,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Option<Result<u8, Error>> {
    Some(match &cli.command {
        Command::Submit(a) => remote::submit(a.remote.server.as_deref()?, a, stdout, stderr).await,
        Command::Runs(a) => remote::runs(cli, a.remote.server.as_deref()?, a, stdout, stderr).await,
        Command::Show(a) => remote::show(a.remote.server.as_deref()?, a, stdout).await,
        Command::Resume(a) => remote::resume(a.remote.server.as_deref()?, a, stdout, stderr).await,
        Command::Cancel(a) => remote::cancel(a.remote.server.as_deref()?, a, stdout).await,
        Command::Redrive(a) => redrive::remote(a.remote.server.as_deref()?, a, stdout).await,
        Command::Approvals(a) => approve::remote_list(a.remote.server.as_deref()?, a, stdout).await,
        Command::Approve(a) => {
            approve::remote_approve(a.remote.server.as_deref()?, a, stdout).await
        }
        Command::Deny(a) => approve::remote_deny(a.remote.server.as_deref()?, a, stdout).await,
        Command::Publish(a) => publish::remote(a.remote.server.as_deref()?, a, stdout).await,
        _ => return None,
    })
}

/// `flow migrate`.
async fn migrate(cli: &Cli, stdout: &mut dyn Write) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    ledger
        .migrate()
        .await
        .doing(|| format!("migrating {}", ledger.url_redacted()))?;
    let _ = writeln!(stdout, "{}: migrations applied", ledger.url_redacted());
    Ok(exit::OK)
}

/// The PostgreSQL pool ceiling for this command (0, the backend default, on SQLite).
///
/// The pool opens one connection and grows only while operations overlap, but with a
/// ceiling above 1 an operation that starts right after another may still open a second
/// one (sqlx puts a connection back on a spawned task) — a TLS handshake for nothing.
/// Commands that do one thing after another therefore get exactly one. `flow run`,
/// `flow resume` and `flow events dispatch` overlap for real (the run lease heartbeat and
/// `max_parallel` branches beside the loop; deliveries beside scheduling): four keep them
/// moving without taking a large share of PostgreSQL's `max_connections` (100 by
/// default) from the daemons sharing the server.
fn postgres_connections(cli: &Cli) -> u32 {
    if cli.db.starts_with("sqlite:") {
        return 0;
    }
    match &cli.command {
        Command::Run(_) | Command::Resume(_) => 4,
        // Requests overlap; each holds a connection for one query or transaction.
        Command::Serve(_) => 8,
        Command::Events(args)
            if matches!(args.command, Some(events::EventsCommand::Dispatch(_))) =>
        {
            4
        }
        _ => 1,
    }
}

/// Opens the ledger named by `--db`, or says why not (exit 5).
pub(crate) async fn open_ledger(cli: &Cli) -> Result<flow_ledger::Ledger, Error> {
    let opts = flow_ledger::OpenOptions {
        scope: flow_ledger::Scope {
            tenant: cli.tenant.clone(),
            workspace: cli.workspace.clone(),
        },
        max_connections: postgres_connections(cli),
        ..flow_ledger::OpenOptions::default()
    };
    match flow_ledger::Ledger::open(&cli.db, opts).await {
        Ok(ledger) => {
            OPENED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ledger.clone());
            Ok(ledger)
        }
        Err(source) => Err(Error::OpenLedger {
            url: flow_ledger::redact_url(&cli.db),
            source,
        }),
    }
}

/// `1 node`, `2 nodes`.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `flow validate`: each argument is a file, `-` (standard input) or a directory (every
/// `*.yaml` / `*.yml` directly in it, in name order).
fn validate(
    config: Option<&std::path::Path>,
    files: &[PathBuf],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let opts = validate_options();
    // With `--config`, say which nodes its `[[policy.approvals]]` gates.
    let config = match config.map(|p| crate::config::Config::load(Some(p))) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            let _ = writeln!(stderr, "error: {e}");
            return exit::INVALID;
        }
    };
    let mut code = exit::OK;
    for arg in files {
        let targets: Vec<PathBuf> = if arg.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(arg)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| {
                            p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml")
                        })
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            if found.is_empty() {
                let _ = writeln!(
                    stderr,
                    "{}: error: no *.yaml or *.yml files in this directory",
                    arg.display()
                );
                code = exit::INVALID;
            }
            found
        } else {
            vec![arg.clone()]
        };
        for file in targets {
            let loaded = if file.as_os_str() == "-" {
                crate::workflow::load_stdin(&opts)
            } else {
                load_file(&file, &opts)
            };
            match loaded {
                Ok((wf, source)) => {
                    // With `--config`: what it cannot run (a callback without
                    // `[api] public_url`) is an error; what its policy gates is listed.
                    if let Some(why) = config.as_ref().and_then(|c| c.refuses(&wf)) {
                        let _ = writeln!(stderr, "{}: error: {why}", source.file);
                        code = exit::INVALID;
                        continue;
                    }
                    let _ = writeln!(
                        stdout,
                        "{}: ok ({}, {})",
                        source.file,
                        counted(wf.nodes.len(), "node"),
                        counted(wf.tools.len(), "tool")
                    );
                    if let Some(c) = &config {
                        print_gates(&c.policy, &wf, stdout);
                    }
                }
                Err(diags) => {
                    let _ = write!(stderr, "{diags}");
                    code = exit::INVALID;
                }
            }
        }
    }
    code
}

/// The nodes `policy` gates in `wf`, one line each under the file's `ok` line.
fn print_gates(
    policy: &crate::policy::Policy,
    wf: &crate::workflow::Workflow,
    out: &mut dyn Write,
) {
    for g in policy.gated_nodes(wf) {
        let how = match g.gates {
            crate::policy::Gates::Maybe => {
                "may need approval (decided at call time from the host or the MCP tool's annotations)"
            }
            _ => "needs approval",
        };
        let _ = writeln!(out, "  node `{}` {how}: policy `{}`", g.node, g.rule);
    }
}

fn graph(
    file: &std::path::Path,
    format: GraphFormat,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let wf = match load_file(file, &validate_options()) {
        Ok((wf, _)) => wf,
        Err(diags) => return error::finish(Err(Error::Diagnostics(diags.to_string())), stderr),
    };
    let _ = stdout.write_all(draw(&wf, wf.plan(), format).as_bytes());
    exit::OK
}

//! `flow daemon`: build a [`crate::daemon::Service`] from the command line, serve its
//! metrics, feed it the signals, and turn how it stopped into an exit code.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use flow_ledger::WorkerId;
use tokio_util::sync::CancellationToken;

use super::{Cli, Error, exit, logging};
use crate::config::Config;
use crate::daemon::metrics::{self, Metrics, Observer};
use crate::daemon::{Service, Settings, Stopped, shutdown};
use crate::executor::Executor;
use crate::runtime::api::{ApiAuth, Served};
use crate::runtime::{Runtime, RuntimeOptions};
use crate::secrets::Secrets;

/// Arguments of `flow daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Most runs executed at once by this process.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: u32,
    /// How often to look at the queue when no notification arrives (e.g. 250ms, 1s).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// Exit 0 once nothing is queued and nothing is in flight (batch jobs, tests).
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Serve Prometheus metrics at /metrics and a health check at /healthz (e.g.
    /// 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Also serve the operator API (as `flow serve`, same tokens) on this address.
    #[arg(long, value_name = "ADDR")]
    pub serve: Option<SocketAddr>,
    /// After SIGTERM/SIGINT, how long calls in flight may take before their runs are
    /// abandoned (those calls are then found in doubt, as after a crash).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Poll only; do not LISTEN for PostgreSQL queue notifications (e.g. behind a
    /// transaction-pooling PgBouncer, which cannot LISTEN).
    #[arg(long)]
    pub no_listen: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e} (e.g. 500ms, 2s, 1m)"))?;
    if d.is_zero() {
        return Err(format!("`{s}`: must be more than zero"));
    }
    Ok(d)
}

/// What the daemon opens once, flow.toml and the secrets read once: the executor the
/// claim loop runs, and what the services beside it are given.
struct Opened {
    executor: Executor,
    services: Services,
}

/// What the services beside the claim loop are started from ([`Beside::start`]).
struct Services {
    runtime: Runtime,
    /// The event consumers of flow.toml: this process delivers their events too.
    consumers: Vec<crate::events::Consumer>,
    /// `--serve`: the API's authentication.
    auth: Option<ApiAuth>,
    schedules: Scheduled,
    retention: crate::retention::Retention,
    connections: Vec<crate::connections::ConnectionConfig>,
    /// `[mcp]`: the tools `--serve` offers at `/mcp` (and `flow mcp serve` on stdio).
    mcp: Option<Arc<crate::mcp::Front>>,
}

/// The schedules of `flow.toml` and who stores their definitions (`config <path>`).
type Scheduled = crate::schedule::manage::Schedules;

/// Opens what the daemon needs (reading flow.toml and the secrets once), or says why
/// it cannot run.
async fn open(cli: &Cli, args: &DaemonArgs, metrics: Arc<Metrics>) -> Result<Opened, Error> {
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    let mut config = Config::load(cli.config.as_deref())?;
    logging::init(
        cli.log_format,
        &secrets,
        &config.telemetry,
        crate::telemetry::Process::Service,
    );
    let retention = config.retention.clone();
    let scheduled = crate::schedule::manage::Schedules::new(
        std::mem::take(&mut config.schedules),
        config.path.as_deref(),
    );
    // A schedule whose workflow cannot be used is refused now, not found at its tick.
    for s in &scheduled.list {
        s.load().map_err(Error::invalid)?;
    }
    // `--serve`: the tokens are checked before anything is opened.
    let auth = match args.serve {
        Some(addr) => Some(ApiAuth::from_config(&config.api, &secrets, addr, false)?),
        None => None,
    };
    // Runs hold a connection only for the length of one transaction, so a few serve many
    // runs; a connection per run would exhaust PostgreSQL's `max_connections` (100 by
    // default) with a handful of daemons, and refused connections cost far more than a
    // short wait for a pooled one. SQLite keeps its default: it has one writer anyway.
    let is_sqlite = cli.db.starts_with("sqlite:");
    let opts = flow_ledger::OpenOptions {
        scope: flow_ledger::Scope {
            tenant: cli.tenant.clone(),
            workspace: cli.workspace.clone(),
        },
        max_connections: if is_sqlite {
            0
        } else {
            (args.concurrency / 4 + 4).clamp(4, 16)
        },
        ..flow_ledger::OpenOptions::default()
    };
    // The event consumers of flow.toml: the daemon delivers their events too, so one
    // process per host is enough (`flow events dispatch` remains for dispatch alone).
    let consumers = crate::events::consumers(&config.consumers, &secrets)
        .map_err(|e| Error::unavailable(e.to_string()))?;
    let public_url = config.api.public_url.clone();
    let runtime = Runtime::open(RuntimeOptions {
        db: cli.db.clone(),
        ledger: opts,
        secrets,
        guards: crate::gateway::Guards {
            egress: config.egress,
            policy: config.policy,
        },
        public_url,
    })
    .await
    .map_err(Error::from)?;
    // A run that must wait (a slot, a rate limit, a retry's backoff) waits on the queue,
    // not in one of this daemon's slots.
    let executor = runtime.executor(Arc::new(Observer::new(metrics))).parking();
    let mcp = runtime
        .mcp_front(&config.mcp, config.path.as_deref())
        .await
        .map_err(|e| Error::unavailable(e.to_string()))?;
    Ok(Opened {
        executor,
        services: Services {
            runtime,
            consumers,
            auth,
            schedules: scheduled,
            retention,
            connections: std::mem::take(&mut config.connections),
            mcp,
        },
    })
}

/// `--metrics-addr ADDR`: `/metrics` and `/healthz` until `stop` fires; the bound address.
async fn serve_metrics(
    args: &DaemonArgs,
    metrics: &Arc<Metrics>,
    ledger: &flow_ledger::Ledger,
    stop: &CancellationToken,
) -> Result<Option<SocketAddr>, Error> {
    let Some(addr) = args.metrics_addr else {
        return Ok(None);
    };
    metrics::serve(addr, metrics.clone(), ledger.clone(), stop.clone())
        .await
        .map(Some)
        .map_err(|e| Error::unavailable(format!("cannot serve metrics on {addr}: {e}")))
}

/// `--serve ADDR`: the operator API beside the workers, until `stop` fires.
async fn serve_api(
    auth: ApiAuth,
    addr: SocketAddr,
    runtime: &Runtime,
    served: Served,
    stop: &CancellationToken,
    stderr: &mut dyn Write,
) -> Result<(), Error> {
    let (bound, _) = runtime
        .serve_api(auth, served, addr, stop.clone())
        .await
        .map_err(|e| Error::unavailable(format!("cannot serve the API on {addr}: {e}")))?;
    let _ = writeln!(stderr, "flow daemon: API at http://{bound}/api/v1");
    Ok(())
}

/// `flow.toml` read again for its schedules (the daemon watches it).
fn reload_schedules(path: &std::path::Path) -> Result<crate::schedule::manage::Schedules, String> {
    let mut config = Config::load(Some(path)).map_err(|e| e.to_string())?;
    Ok(crate::schedule::manage::Schedules::new(
        std::mem::take(&mut config.schedules),
        config.path.as_deref(),
    ))
}

/// The schedules of `flow.toml` and those workflow files carried (`flow schedules
/// apply`), fired beside the workers until `stop`.
fn spawn_scheduler(
    schedules: crate::schedule::manage::Schedules,
    ledger: &flow_ledger::Ledger,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    stderr: &mut dyn Write,
) -> tokio::task::JoinHandle<()> {
    let config_path = schedules.path.clone();
    if !schedules.list.is_empty() {
        let names: Vec<&str> = schedules.list.iter().map(|s| s.id.as_str()).collect();
        let _ = writeln!(stderr, "flow daemon: firing schedules {}", names.join(", "));
    }
    let s = crate::schedule::fire::Scheduler::new(ledger.clone(), schedules, metrics.clone());
    let watch = config_path.map(|path| crate::schedule::fire::Watch {
        reload: Box::new({
            let path = path.clone();
            move || reload_schedules(&path)
        }),
        path,
    });
    tokio::spawn(s.run(stop.clone(), watch))
}

/// `[retention]` of `flow.toml`, applied beside the workers until `stop` (off: no task).
fn spawn_retention(
    retention: crate::retention::Retention,
    runtime: &Runtime,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    stderr: &mut dyn Write,
) -> Option<tokio::task::JoinHandle<()>> {
    retention.is_on().then(|| {
        let horizon = |d: Option<std::time::Duration>| {
            d.map_or("kept".to_owned(), |d| {
                humantime::format_duration(d).to_string()
            })
        };
        let _ = writeln!(
            stderr,
            "flow daemon: retention on (runs {}, events {}), at most {} rows/s",
            horizon(retention.runs),
            horizon(retention.events),
            retention.rate
        );
        let metrics = metrics.clone();
        tokio::spawn(crate::retention::gc::run(
            runtime.ledger.clone(),
            retention,
            runtime.gateway.clock(),
            stop.clone(),
            Box::new(move |d| metrics.retention_deleted(d)),
        ))
    })
}

/// The services a daemon runs beside its claim loop — the metrics and API servers, event
/// delivery, the scheduler, retention — started together and stopped by one
/// [`Beside::drain`].
struct Beside {
    /// Ends the servers, the scheduler, retention and (between batches) delivery.
    stop: CancellationToken,
    /// Event delivery, when flow.toml has consumers.
    dispatcher: Option<tokio::task::JoinHandle<crate::events::Summary>>,
    /// The scheduler, and retention when it is on.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<crate::events::Consumer>,
    ledger: flow_ledger::Ledger,
    clock: Arc<dyn flow_ledger::Clock>,
}

impl Beside {
    /// Serves metrics (`--metrics-addr`) and the API (`--serve`), says on stderr what
    /// this daemon does, and spawns delivery, the scheduler and retention.
    async fn start(
        services: Services,
        stdio: Option<String>,
        service: shutdown::Handle,
        args: &DaemonArgs,
        config: &Settings,
        metrics: &Arc<Metrics>,
        stderr: &mut dyn Write,
    ) -> Result<Beside, Error> {
        let Services {
            runtime,
            consumers,
            auth,
            schedules,
            retention,
            connections,
            mcp,
        } = services;
        let ledger = runtime.ledger.clone();
        let stop = CancellationToken::new();
        let served = serve_metrics(args, metrics, &ledger, &stop).await?;
        if let (Some(addr), Some(auth)) = (args.serve, auth) {
            let served = Served {
                metrics: metrics.clone(),
                schedules: schedules.clone(),
                connections,
                mcp: mcp.clone(),
            };
            serve_api(auth, addr, &runtime, served, &stop, stderr).await?;
        }
        if let Some(principal) = stdio {
            let Some(front) = mcp else {
                return Err(Error::unavailable(
                    "flow mcp serve: flow.toml offers no MCP tool: list workflows under `[mcp] workflows` or servers to proxy under `[[mcp.servers]]`",
                ));
            };
            let names: Vec<String> = front
                .catalog
                .entries
                .iter()
                .map(|e| e.tool.name.to_string())
                .collect();
            let _ = writeln!(
                stderr,
                "flow mcp: serving {} on stdio as `{principal}`",
                names.join(", ")
            );
            let until = stop.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::mcp::server::Handler::stdio(front, principal, until).await {
                    tracing::warn!(error = %e, "the MCP stdio server stopped");
                }
                // The client closed stdin: stop taking runs and finish those in flight.
                service.shutdown();
            });
        }
        let wake = wake_description(config, ledger.backend_name());
        let _ = writeln!(
            stderr,
            "flow daemon {} on {}: up to {} runs at once, {wake}{}",
            config.worker.as_str(),
            ledger.url_redacted(),
            config.concurrency,
            served
                .map(|a| format!(", metrics on http://{a}/metrics"))
                .unwrap_or_default()
        );
        let clock = runtime.gateway.clock();
        let dispatcher = (!consumers.is_empty()).then(|| {
            let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
            let _ = writeln!(
                stderr,
                "flow daemon: delivering events to {}",
                names.join(", ")
            );
            let delivery = crate::events::run(
                ledger.clone(),
                consumers.clone(),
                clock.clone(),
                stop.clone(),
            );
            tokio::spawn(delivery)
        });
        let scheduler = spawn_scheduler(schedules, &ledger, metrics, &stop, stderr);
        let retention = spawn_retention(retention, &runtime, metrics, &stop, stderr);
        Ok(Beside {
            stop,
            dispatcher,
            tasks: [Some(scheduler), retention].into_iter().flatten().collect(),
            consumers,
            ledger,
            clock,
        })
    }

    /// Stops them once the claim loop has: the servers, the scheduler and retention
    /// end; delivery records the batch it is sending (unless the daemon stops at once);
    /// an idle stop (`--exit-when-idle`, which promises a drained queue) delivers the
    /// events of the runs just finished too.
    async fn drain(self, stopped: &Stopped, stderr: &mut dyn Write) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        if !matches!(stopped, Stopped::Immediate | Stopped::Unusable(_))
            && let Some(task) = self.dispatcher
        {
            let _ = task.await;
        }
        if matches!(stopped, Stopped::Idle) && !self.consumers.is_empty() {
            // A signal stop leaves these to the next dispatcher instead.
            let once = crate::events::dispatch_once(&self.ledger, self.consumers, self.clock);
            if let Err(e) = once.await {
                let _ = writeln!(stderr, "warning: final event delivery failed: {e}");
            }
        }
    }
}

/// `flow daemon`.
pub(crate) async fn daemon(
    cli: &Cli,
    args: &DaemonArgs,
    _stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    run_daemon(cli, args, None, stderr).await
}

/// `flow daemon`, or (`stdio`: the principal) `flow mcp serve`: the same workers, with
/// the MCP server on stdin/stdout, stopping gracefully when the client closes stdin.
pub(crate) async fn run_daemon(
    cli: &Cli,
    args: &DaemonArgs,
    stdio: Option<String>,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let metrics = Arc::new(Metrics::new());
    let Opened { executor, services } = open(cli, args, metrics.clone()).await?;
    let ledger = services.runtime.ledger.clone();
    let config = Settings {
        concurrency: usize::try_from(args.concurrency).unwrap_or(1),
        poll_interval: args.poll_interval,
        exit_when_idle: args.exit_when_idle,
        grace: args.grace,
        listen: !args.no_listen,
        worker: WorkerId::current(),
        flow: super::flow_command(cli),
    };
    let service = Service::new(executor, config.clone(), metrics.clone());
    let handle = service.handle();
    let beside = Beside::start(services, stdio, handle, args, &config, &metrics, stderr).await?;
    let signals = tokio::spawn(shutdown::on_signals(service.handle()));
    let stopped = service.run().await;
    beside.drain(&stopped, stderr).await;
    match stopped {
        Stopped::Idle => {
            let _ = writeln!(stderr, "flow daemon: queue empty; exiting");
            signals.abort();
            ledger.close().await;
            Ok(exit::OK)
        }
        Stopped::Graceful {
            abandoned,
            released,
            not_released,
        } => {
            let _ = writeln!(
                stderr,
                "{}",
                graceful_summary(abandoned, released, not_released)
            );
            signals.abort();
            ledger.close().await;
            Ok(exit::OK)
        }
        Stopped::Immediate => {
            let code = match signals.await {
                Ok(Some(signal)) => signal.exit_code(),
                _ => 130,
            };
            let _ = writeln!(
                stderr,
                "flow daemon: stopped at once; leases left to expire"
            );
            let _ = stderr.flush();
            // At once means at once: do not wait for the runtime to wind down tasks,
            // connections or child processes.
            std::process::exit(i32::from(code));
        }
        Stopped::Unusable(reason) => {
            let _ = writeln!(
                stderr,
                "flow daemon: stopped at once, runs left to their leases: {reason}"
            );
            let _ = stderr.flush();
            // Nothing more may be written from this process (not even a release).
            std::process::exit(i32::from(exit::UNAVAILABLE));
        }
    }
}

/// How the daemon learns of new runs, for its first line: NOTIFY only on PostgreSQL
/// (and unless `--no-listen`), polling always.
fn wake_description(config: &Settings, backend: &str) -> String {
    let every = humantime::format_duration(config.poll_interval);
    if config.listen && backend == "postgres" {
        format!("LISTEN/NOTIFY, polling every {every}")
    } else {
        format!("polling every {every}")
    }
}

/// The last line of a graceful stop: how many runs were abandoned past the grace
/// period, and of the runs left, how many went back to the queue and how many could not
/// (the database did not answer; their leases expire, then any worker resumes them).
fn graceful_summary(abandoned: usize, released: usize, not_released: usize) -> String {
    if abandoned == 0 && not_released == 0 {
        return "flow daemon: stopped; runs in flight were finished or released".to_string();
    }
    let mut parts = Vec::new();
    if abandoned > 0 {
        parts.push(format!(
            "{abandoned} run(s) had calls in flight past the grace period"
        ));
    }
    if released > 0 {
        parts.push(format!("{released} released to the queue"));
    }
    if not_released > 0 {
        parts.push(format!(
            "{not_released} could not be released (their leases will expire, then another worker resumes them)"
        ));
    }
    let hint = if abandoned > 0 {
        " (`flow runs --status paused` after they resume)"
    } else {
        ""
    };
    format!("flow daemon: stopped; {}{hint}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::graceful_summary;

    #[test]
    fn the_stop_summary_counts_released_and_not_released_runs() {
        assert_eq!(
            graceful_summary(0, 0, 0),
            "flow daemon: stopped; runs in flight were finished or released"
        );
        let all = graceful_summary(2, 2, 0);
        assert!(all.contains("2 run(s) had calls in flight") && all.contains("2 released"));
        assert!(!all.contains("could not"), "{all}");
        let none = graceful_summary(1, 0, 1);
        assert!(none.contains("1 could not be released"), "{none}");
        assert!(!none.contains("released to the queue"), "{none}");
        let some = graceful_summary(3, 1, 2);
        assert!(some.contains("1 released to the queue"), "{some}");
        assert!(some.contains("2 could not be released"), "{some}");
        let lost = graceful_summary(0, 0, 1);
        assert!(lost.contains("1 could not be released"), "{lost}");
        assert!(!lost.contains("grace period"), "{lost}");
    }
}

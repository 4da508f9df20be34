//! What a daemon tells its operators: Prometheus text at `/metrics`, `/healthz`, and one
//! structured log line per finished step.
//!
//! Two kinds of figures. Counters and histograms describe *this process* (runs claimed
//! and finished here, tool calls by outcome, claim latency, call duration). Gauges that
//! describe the *shared queue* (runs by status, queue depth, calls in doubt) are read
//! from the database at scrape time, so every daemon reports the same numbers and a
//! crashed daemon's runs are still counted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use flow_ledger::{Ledger, RunStatus};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::executor::progress::{Progress, StepEvent};
use crate::gateway::StepResult;

type Label = [(&'static str, &'static str); 1];
/// Labels whose values come from workflows (tool names) or the ledger (consumer names).
type Labels = Vec<(&'static str, String)>;

/// Most distinct tool names labelled; later ones are counted as `other`, so a stream of
/// generated workflows cannot grow the metrics without bound.
const MAX_TOOL_LABELS: usize = 64;

fn call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// How long a scrape waits for the database before reporting it down.
const DB_TIMEOUT: Duration = Duration::from_secs(2);

/// The daemon's metrics. Shared (`Arc`) by the claim loop, the step observer and the
/// HTTP endpoint.
pub struct Metrics {
    registry: Registry,
    runs: Family<Label, Gauge>,
    queue_depth: Gauge,
    waiting: Waiting,
    database_up: Gauge,
    runs_claimed: Counter,
    runs_finished: Family<Label, Counter>,
    runs_in_flight: Gauge,
    tool_calls: Family<Labels, Counter>,
    claim_seconds: Histogram,
    call_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    tools_seen: std::sync::Mutex<std::collections::HashSet<String>>,
    deliveries: Family<Labels, Gauge>,
    auth_failures: Family<Label, Counter>,
    background: Background,
    process: ProcessGauges,
}

/// What waits for a person, read from the ledger at scrape time: calls in doubt (by tool,
/// and the oldest one's wait), approvals and waits.
struct Waiting {
    in_doubt: Family<Labels, Gauge>,
    slots: Family<Labels, Gauge>,
    oldest_in_doubt: Gauge,
    approvals: Gauge,
    waits: Gauge,
}

impl Waiting {
    fn register(registry: &mut Registry) -> Self {
        let w = Self {
            in_doubt: Family::default(),
            slots: Family::default(),
            oldest_in_doubt: Gauge::default(),
            approvals: Gauge::default(),
            waits: Gauge::default(),
        };
        registry.register(
            "tool_calls_in_doubt",
            "Tool calls in doubt by tool, each waiting for a resolution (read at scrape time)",
            w.in_doubt.clone(),
        );
        registry.register(
            "tool_slots",
            "Calls of tools with a concurrency limit by limit and state: in_flight and in_doubt hold a slot, waiting wait for one (read at scrape time)",
            w.slots.clone(),
        );
        registry.register(
            "oldest_in_doubt_seconds",
            "How long the oldest call in doubt has waited for a resolution; 0 when none (read at scrape time)",
            w.oldest_in_doubt.clone(),
        );
        registry.register(
            "approvals_pending",
            "Node calls awaiting approval, nothing sent yet (read at scrape time)",
            w.approvals.clone(),
        );
        registry.register(
            "waits_pending",
            "Nodes waiting for an event or a callback (read at scrape time)",
            w.waits.clone(),
        );
        w
    }

    /// Calls in a slot or waiting for one, by limit (a limit nothing uses drops out).
    fn set_slots(&self, slots: &[flow_ledger::SlotUse]) {
        self.slots.clear();
        for s in slots {
            for (state, n) in [
                ("in_flight", s.in_flight),
                ("in_doubt", s.in_doubt),
                ("waiting", s.waiting),
            ] {
                self.slots
                    .get_or_create(&vec![
                        ("limit", s.key.clone()),
                        ("state", state.to_string()),
                    ])
                    .set(i64::from(n));
            }
        }
    }

    /// Calls in doubt by tool (a tool none of whose calls is in doubt any more drops
    /// out) and the oldest one's wait, in seconds.
    fn set_in_doubt(&self, tools: &[flow_ledger::InDoubtTool]) {
        self.in_doubt.clear();
        for t in tools {
            self.in_doubt
                .get_or_create(&vec![("tool", t.tool.clone())])
                .set(t.calls);
        }
        let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
        let oldest = tools.iter().map(|t| t.oldest).min();
        self.oldest_in_doubt
            .set(oldest.map_or(0, |o| (now.0 - o.0).max(0) / 1000));
    }
}

/// Counters of the daemon's background tasks: the scheduler and retention.
struct Background {
    schedule_ticks: Family<Labels, Counter>,
    retention_deleted: Family<Labels, Counter>,
}

impl Background {
    fn register(registry: &mut Registry) -> Self {
        let schedule_ticks = Family::<Labels, Counter>::default();
        let retention_deleted = Family::<Labels, Counter>::default();
        registry.register(
            "schedule_ticks",
            "Schedule ticks this daemon handled, by schedule and outcome (started, skipped_overlap, buffered, missed)",
            schedule_ticks.clone(),
        );
        registry.register(
            "retention_deleted",
            "Rows this daemon's retention deleted, by table (runs, steps, tool_calls, outbox, key_tombstones, …)",
            retention_deleted.clone(),
        );
        Self {
            schedule_ticks,
            retention_deleted,
        }
    }
}

/// This process's resources, read from `/proc` at scrape time.
struct ProcessGauges {
    resident_bytes: Gauge,
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    open_fds: Gauge,
    /// Spans this process's telemetry dropped (`crate::telemetry::dropped_spans`),
    /// brought up to date at scrape time.
    spans_dropped: Counter,
    /// How far this host's wall clock is from the PostgreSQL server's at the last
    /// anchoring (`flow_ledger::clock::skew_ms`); flow goes by the server's.
    clock_skew: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl ProcessGauges {
    fn register(registry: &mut Registry) -> Self {
        let resident_bytes = Gauge::default();
        let cpu_seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        let open_fds = Gauge::default();
        let spans_dropped = Counter::default();
        let clock_skew = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "clock_skew_seconds",
            "This host's wall clock minus the PostgreSQL server's, at the last anchoring (flow judges leases, deadlines and ticks by the server's; 0 on SQLite)",
            clock_skew.clone(),
        );
        let start_time = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        start_time.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of this process (read at scrape time from /proc)",
            resident_bytes.clone(),
        );
        // A counter (`_total`): CPU time only grows, and rate() needs to know it.
        registry.register(
            "process_cpu_seconds",
            "CPU time this process has used, user and system (read at scrape time)",
            cpu_seconds.clone(),
        );
        registry.register(
            "telemetry_spans_dropped",
            "Trace spans this process could not export (collector down, slow or refusing)",
            spans_dropped.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of this process (read at scrape time)",
            open_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "When this process started its metrics, in seconds since the epoch",
            start_time,
        );
        Self {
            resident_bytes,
            cpu_seconds,
            open_fds,
            spans_dropped,
            clock_skew,
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `flow_build_info`, always 1: the labels say which build answers, for dashboards and
/// alerts that compare versions across hosts (the commit comes from `build.rs`).
fn register_build_info(registry: &mut Registry) {
    let build_info = Family::<[(&'static str, &'static str); 2], Gauge>::default();
    build_info
        .get_or_create(&[
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", env!("FLOW_GIT_COMMIT")),
        ])
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the labels are this binary's version and git commit",
        build_info,
    );
}

impl Metrics {
    /// Registers every metric under the `flow_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("flow");
        let runs = Family::<Label, Gauge>::default();
        let queue_depth = Gauge::default();
        let database_up = Gauge::default();
        let runs_claimed = Counter::default();
        let runs_finished = Family::<Label, Counter>::default();
        let runs_in_flight = Gauge::default();
        let tool_calls = Family::<Labels, Counter>::default();
        let claim_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let call_seconds: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(call_histogram);
        let deliveries = Family::<Labels, Gauge>::default();
        let auth_failures = Family::<Label, Counter>::default();
        let process = ProcessGauges::register(&mut registry);
        let background = Background::register(&mut registry);
        registry.register(
            "api_auth_failures",
            "Presented API tokens that matched none, by where (api, console, metrics); each counts toward its address's throttle",
            auth_failures.clone(),
        );
        registry.register(
            "event_deliveries",
            "Event deliveries by consumer and status; dead = dead letters (read at scrape time)",
            deliveries.clone(),
        );
        register_build_info(&mut registry);
        registry.register(
            "runs",
            "Runs in the ledger by status (this tenant and workspace; read at scrape time)",
            runs.clone(),
        );
        registry.register(
            "queue_depth",
            "Queued runs waiting for a worker (read at scrape time)",
            queue_depth.clone(),
        );
        let waiting = Waiting::register(&mut registry);
        registry.register(
            "database_up",
            "1 if the ledger database answered the last scrape, else 0",
            database_up.clone(),
        );
        registry.register(
            "daemon_runs_claimed",
            "Runs this daemon claimed from the queue",
            runs_claimed.clone(),
        );
        registry.register(
            "daemon_runs_finished",
            "Executions of runs in this daemon by how they ended (queued = released)",
            runs_finished.clone(),
        );
        registry.register(
            "daemon_runs_in_flight",
            "Runs this daemon is executing now",
            runs_in_flight.clone(),
        );
        registry.register(
            "tool_calls",
            "Tool-call steps finished in this daemon by tool and outcome",
            tool_calls.clone(),
        );
        registry.register(
            "claim_duration_seconds",
            "Latency of one batch claim from the run queue",
            claim_seconds.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Duration of one tool-call step by tool, ledger writes included",
            call_seconds.clone(),
        );
        Self {
            registry,
            runs,
            queue_depth,
            waiting,
            database_up,
            runs_claimed,
            runs_finished,
            runs_in_flight,
            tool_calls,
            claim_seconds,
            call_seconds,
            tools_seen: std::sync::Mutex::new(std::collections::HashSet::new()),
            deliveries,
            auth_failures,
            background,
            process,
        }
    }

    /// Counts `n` ticks of `schedule` that came to `outcome` (schedule ids come from
    /// `flow.toml`: a bounded set).
    pub fn schedule_ticks(&self, schedule: &str, outcome: &'static str, n: u64) {
        if n > 0 {
            self.background
                .schedule_ticks
                .get_or_create(&vec![
                    ("schedule", schedule.to_string()),
                    ("outcome", outcome.to_string()),
                ])
                .inc_by(n);
        }
    }

    /// Counts the rows one retention transaction deleted, by table (a fixed set of
    /// table names).
    pub fn retention_deleted(&self, deleted: &flow_ledger::Deleted) {
        for (table, n) in &deleted.rows {
            self.background
                .retention_deleted
                .get_or_create(&vec![("table", table.clone())])
                .inc_by(*n);
        }
    }

    /// The label value for `tool`: itself while fewer than [`MAX_TOOL_LABELS`] names
    /// were seen, else `other`.
    fn tool_label(&self, tool: &str) -> String {
        let mut seen = self.tools_seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(tool) {
            return tool.to_string();
        }
        if seen.len() < MAX_TOOL_LABELS {
            seen.insert(tool.to_string());
            return tool.to_string();
        }
        "other".to_string()
    }

    /// Records one finished tool-call step.
    pub fn call_finished(&self, tool: &str, outcome: &'static str, took: Duration) {
        let tool = self.tool_label(tool);
        self.tool_calls
            .get_or_create(&vec![
                ("tool", tool.clone()),
                ("outcome", outcome.to_string()),
            ])
            .inc();
        self.call_seconds
            .get_or_create(&vec![("tool", tool)])
            .observe(took.as_secs_f64());
    }

    /// Reads this process's memory, CPU time and open files from `/proc` (Linux; left
    /// at 0 elsewhere).
    fn refresh_process(&self) {
        #[allow(clippy::cast_precision_loss)] // milliseconds of skew fit an f64 exactly
        let skew = flow_ledger::clock::skew_ms().unwrap_or(0) as f64 / 1000.0;
        self.process.clock_skew.set(skew);
        if let Ok(status) = std::fs::read_to_string("/proc/self/status")
            && let Some(kb) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        {
            self.process.resident_bytes.set(kb.saturating_mul(1024));
        }
        // Fields 14 and 15 of /proc/self/stat (after the parenthesised name): utime and
        // stime in clock ticks, which Linux reports at USER_HZ = 100 per second.
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
        {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks: f64 = [11, 12]
                .iter()
                .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
                .sum();
            let seconds = ticks / 100.0;
            let counted = self.process.cpu_seconds.get();
            if seconds > counted {
                self.process.cpu_seconds.inc_by(seconds - counted);
            }
        }
        let dropped = crate::telemetry::dropped_spans();
        let counted = self.process.spans_dropped.get();
        if dropped > counted {
            self.process.spans_dropped.inc_by(dropped - counted);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.process
                .open_fds
                .set(i64::try_from(dir.count()).unwrap_or(i64::MAX));
        }
    }

    /// Records one batch claim.
    pub fn claimed(&self, runs: usize, took: Duration) {
        self.runs_claimed
            .inc_by(u64::try_from(runs).unwrap_or(u64::MAX));
        self.claim_seconds.observe(took.as_secs_f64());
    }

    /// Sets how many runs are executing here.
    pub fn set_in_flight(&self, n: usize) {
        self.runs_in_flight
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Records how one execution ended (`queued` when the run was released).
    pub fn finished(&self, status: &'static str) {
        self.runs_finished
            .get_or_create(&[("status", status)])
            .inc();
    }

    /// Counts one failed authentication (`via`: `api`, `console` or `metrics`), so an
    /// operator sees guessing or a misconfigured client before the throttle bites.
    pub fn auth_failed(&self, via: &'static str) {
        self.auth_failures.get_or_create(&[("via", via)]).inc();
    }

    /// Reads the shared gauges from the database; returns whether it answered.
    pub async fn refresh(&self, ledger: &Ledger) -> bool {
        self.refresh_process();
        let read = async {
            let by_status = ledger.count_runs_by_status().await?;
            let in_doubt = ledger.calls_in_doubt_by_tool().await?;
            let deliveries = ledger.count_deliveries().await?;
            let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
            let approvals = ledger.count_pending_approvals(now).await?;
            let waits = ledger.count_pending_waits().await?;
            let slots = ledger.slot_use(now).await?;
            Ok::<_, flow_ledger::Error>((
                by_status,
                (in_doubt, approvals, waits, slots),
                deliveries,
            ))
        };
        match tokio::time::timeout(DB_TIMEOUT, read).await {
            Ok(Ok((by_status, (in_doubt, approvals, waits, slots), deliveries))) => {
                self.waiting.set_slots(&slots);
                for (consumer, status, n) in deliveries {
                    self.deliveries
                        .get_or_create(&vec![
                            ("consumer", consumer),
                            ("status", status.as_str().to_string()),
                        ])
                        .set(n);
                }
                for (status, n) in by_status {
                    self.runs
                        .get_or_create(&[("status", status.as_str())])
                        .set(n);
                    if status == RunStatus::Queued {
                        self.queue_depth.set(n);
                    }
                }
                self.waiting.set_in_doubt(&in_doubt);
                self.waiting
                    .approvals
                    .set(i64::try_from(approvals).unwrap_or(i64::MAX));
                self.waiting
                    .waits
                    .set(i64::try_from(waits).unwrap_or(i64::MAX));
                self.database_up.set(1);
                true
            }
            _ => {
                self.database_up.set(0);
                false
            }
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The step observer of daemon executions: instead of progress lines, a counter and a
/// duration per finished step, and one structured log line (run id from the enclosing
/// span; step and call ids as fields).
pub struct Observer {
    metrics: Arc<Metrics>,
}

impl Observer {
    /// Observes into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl Progress for Observer {
    fn step(&self, event: StepEvent<'_>) {
        match event {
            StepEvent::Started {
                node,
                step_id,
                retry,
            } => {
                tracing::debug!(step = step_id, call = node, retry, "step started");
            }
            StepEvent::Skipped { node, why } => {
                tracing::info!(step = node, why, "step skipped");
            }
            StepEvent::Closed {
                node,
                counts,
                error,
            } => {
                tracing::info!(step = node, %counts, error, "for_each items done");
            }
            StepEvent::Finished {
                node,
                tool,
                step_id,
                retry,
                took,
                result,
            } => {
                let outcome = match result {
                    StepResult::Succeeded { .. } => "succeeded",
                    StepResult::Failed { .. } => "failed",
                    StepResult::InDoubt => "in_doubt",
                    StepResult::Deferred { .. } => "deferred",
                    StepResult::TaskWorking { .. } => "task_working",
                    StepResult::AwaitingApproval { .. } => "awaiting_approval",
                    StepResult::Waiting { .. } => "waiting",
                    StepResult::Skipped { .. } => "skipped",
                };
                self.metrics.call_finished(tool, outcome, took);
                let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
                match result {
                    StepResult::InDoubt => tracing::warn!(
                        step = step_id,
                        call = node,
                        retry,
                        took_ms = ms,
                        "call in doubt: the run will pause until it is resolved"
                    ),
                    StepResult::Failed { kind, message, .. } => tracing::info!(
                        step = step_id,
                        call = node,
                        retry,
                        took_ms = ms,
                        kind = %kind,
                        error = %message,
                        "step failed"
                    ),
                    _ => tracing::info!(
                        step = step_id,
                        call = node,
                        retry,
                        took_ms = ms,
                        outcome,
                        "step finished"
                    ),
                }
            }
        }
    }
}

struct Served {
    metrics: Arc<Metrics>,
    ledger: Ledger,
}

async fn metrics_page(State(s): State<Arc<Served>>) -> Response {
    s.metrics.refresh(&s.ledger).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

async fn healthz(State(s): State<Arc<Served>>) -> Response {
    // A write, on SQLite: a ledger that answers reads but cannot be written (its lock
    // held, the disk full, its WAL gone) must not look healthy.
    match tokio::time::timeout(DB_TIMEOUT, s.ledger.probe_writable()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "database {} unreachable or not writable: {e}\n",
                s.ledger.url_redacted()
            ),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "database {} did not answer within {} ms\n",
                s.ledger.url_redacted(),
                DB_TIMEOUT.as_millis()
            ),
        )
            .into_response(),
    }
}

/// `/metrics` and `/healthz`, for this endpoint and for `flow serve` (`crate::serve`).
pub fn router(metrics: Arc<Metrics>, ledger: Ledger) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .with_state(Arc::new(Served { metrics, ledger }))
}

/// Binds `addr` and serves `/metrics` and `/healthz` until `stop` fires. Returns the
/// bound address (port 0 picks a free one).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ledger: Ledger,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let router = router(metrics, ledger);
    tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}

//! Retention passes: `flow gc` runs one; a daemon runs one every `interval`, paced at
//! `rate` rows per second so deletion never crowds out the runs it shares the database
//! with.
//!
//! A pass walks the finished runs older than the `runs` horizon oldest first and asks
//! the ledger to delete each (one transaction per run; the ledger keeps what must stay
//! and says why), then sweeps events, tombstones, schedule history, rate windows and
//! unreferenced workflow texts in batches.

use std::time::{Duration, Instant};

use flow_ledger::{Candidate, Deleted, Error, Kept, Ledger, RunGc, Sweep, Timestamp};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Retention;

/// Runs read per page of candidates.
const PAGE: u32 = 200;

/// Rows per table and transaction of a sweep.
const SWEEP_BATCH: u32 = 500;

/// How many kept runs a report names (the rest are counted).
const KEPT_NAMED: usize = 20;

/// Rate-limit windows are deleted this long after they started (a day window is
/// closed a day after it starts).
const WINDOW_AGE: Duration = Duration::from_secs(2 * 86_400);

/// How a pass goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Delete nothing; count what would go.
    DryRun,
    /// Delete as fast as the database allows (`flow gc`).
    Now,
    /// Delete at most `rate` rows per second (a daemon).
    Paced,
}

/// A run that was old enough but kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptRun {
    /// The run.
    pub run_id: String,
    /// Why it stays.
    #[serde(flatten)]
    pub why: Kept,
}

/// What a pass did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Nothing was written.
    pub dry_run: bool,
    /// Runs deleted.
    pub runs_deleted: u64,
    /// Runs past the horizon that were kept.
    pub runs_kept: u64,
    /// The first of them, with the reason.
    pub kept: Vec<KeptRun>,
    /// Rows deleted, by table.
    pub rows: Deleted,
    /// Tombstones written for the keys of the deleted runs.
    pub tombstones: u64,
    /// Stopped before the end (the daemon is stopping).
    pub interrupted: bool,
}

impl Report {
    /// Whether the pass changed (or would change) anything.
    pub fn did_something(&self) -> bool {
        self.runs_deleted > 0 || self.rows.total() > 0
    }
}

/// Keeps a pass at `rate` rows per second, averaged from its start. Its waits end
/// early when the daemon stops (a low rate must not hold a shutdown).
struct Pacer {
    rate: Option<u32>,
    start: Instant,
    rows: u64,
    stop: CancellationToken,
}

impl Pacer {
    fn new(mode: Mode, rate: u32, stop: Option<&CancellationToken>) -> Self {
        Self {
            rate: (mode == Mode::Paced).then_some(rate.max(1)),
            start: Instant::now(),
            rows: 0,
            stop: stop.cloned().unwrap_or_default(),
        }
    }

    /// Counts `n` rows, then waits until the pass is back under its rate.
    async fn spend(&mut self, n: u64) {
        self.rows += n;
        let Some(rate) = self.rate else { return };
        #[allow(clippy::cast_precision_loss)]
        let due = Duration::from_secs_f64(self.rows as f64 / f64::from(rate));
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.stop.cancelled() => {}
            }
        }
    }
}

/// One pass of `retention` at `now`. `observe` sees every deletion as it commits (the
/// daemon's metrics); `stop` ends the pass between two transactions.
pub async fn pass(
    ledger: &Ledger,
    retention: &Retention,
    now: Timestamp,
    mode: Mode,
    stop: Option<&CancellationToken>,
    observe: &(dyn Fn(&Deleted) + Send + Sync),
) -> Result<Report, Error> {
    let dry = mode == Mode::DryRun;
    let mut report = Report {
        dry_run: dry,
        ..Report::default()
    };
    let mut pacer = Pacer::new(mode, retention.rate, stop);
    let stopped = || stop.is_some_and(CancellationToken::is_cancelled);
    if let Some(runs) = retention.runs {
        let before = now.minus(runs);
        let mut after: Option<Candidate> = None;
        'pages: loop {
            let page = ledger.gc_candidates(before, after.as_ref(), PAGE).await?;
            let Some(last) = page.last().cloned() else {
                break;
            };
            for cand in page {
                if stopped() {
                    report.interrupted = true;
                    break 'pages;
                }
                match ledger.gc_run(&cand.id, before, now, dry).await? {
                    RunGc::Deleted { rows, tombstones } => {
                        report.runs_deleted += 1;
                        report.tombstones += tombstones;
                        report.rows.merge(&rows);
                        if !dry {
                            observe(&rows);
                        }
                        pacer.spend(rows.total() + tombstones).await;
                    }
                    RunGc::Kept(why) => {
                        // A kept run costs a transaction too: paced like a row.
                        pacer.spend(1).await;
                        report.runs_kept += 1;
                        if report.kept.len() < KEPT_NAMED {
                            report.kept.push(KeptRun {
                                run_id: cand.id,
                                why,
                            });
                        }
                    }
                    RunGc::Gone => {}
                }
            }
            after = Some(last);
        }
    }
    if !report.interrupted {
        sweep(
            ledger,
            retention,
            now,
            mode,
            &mut report,
            &mut pacer,
            stop,
            observe,
        )
        .await?;
    }
    Ok(report)
}

/// The sweep of a pass: batches until every part is under a batch (all done).
#[allow(clippy::too_many_arguments)]
async fn sweep(
    ledger: &Ledger,
    retention: &Retention,
    now: Timestamp,
    mode: Mode,
    report: &mut Report,
    pacer: &mut Pacer,
    stop: Option<&CancellationToken>,
    observe: &(dyn Fn(&Deleted) + Send + Sync),
) -> Result<(), Error> {
    let dry = mode == Mode::DryRun;
    let limit = if dry { u32::MAX } else { SWEEP_BATCH };
    let s = Sweep {
        events_before: retention.events.map(|e| now.minus(e)),
        history_before: retention.runs.map(|r| now.minus(r)),
        keys_before: Some(now.minus(retention.keys)),
        windows_before: Some(now.minus(WINDOW_AGE)),
        texts: retention.runs.is_some(),
        limit,
    };
    loop {
        if stop.is_some_and(CancellationToken::is_cancelled) {
            report.interrupted = true;
            return Ok(());
        }
        let deleted = ledger.gc_sweep(&s, now, dry).await?;
        report.rows.merge(&deleted);
        if dry {
            return Ok(());
        }
        observe(&deleted);
        pacer.spend(deleted.total()).await;
        if deleted.rows.values().all(|n| *n < u64::from(limit)) {
            return Ok(());
        }
    }
}

/// A daemon's retention: a paced pass every `interval` until `stop`. A failed pass is
/// logged and tried again at the next (a database blip must not stop the daemon).
pub async fn run(
    ledger: Ledger,
    retention: Retention,
    clock: std::sync::Arc<dyn flow_ledger::Clock>,
    stop: CancellationToken,
    observe: Box<dyn Fn(&Deleted) + Send + Sync>,
) {
    loop {
        match pass(
            &ledger,
            &retention,
            clock.now(),
            Mode::Paced,
            Some(&stop),
            &*observe,
        )
        .await
        {
            Ok(r) if r.did_something() => tracing::info!(
                runs_deleted = r.runs_deleted,
                rows = r.rows.total(),
                tombstones = r.tombstones,
                runs_kept = r.runs_kept,
                "retention pass"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention pass failed; trying again at the next"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retention.interval) => {}
        }
    }
}

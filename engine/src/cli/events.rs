//! `flow events`: the outbox and its deliveries — list, re-queue, follow, dispatch.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use flow_ledger::{
    Clock, Delivery, DeliveryFilter, DeliveryStatus, EventFilter, Ledger, SystemClock,
};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

use super::table::{cell, table, terminal_width};
use super::{Cli, Error, LedgerContext, exit, logging, open_ledger};
use crate::config::Config;
use crate::events::{self, Consumer, Dispatcher, Options, wire};
use crate::secrets::Secrets;

/// Arguments of `flow events`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EventsArgs {
    /// What to do (without one: list deliveries).
    #[command(subcommand)]
    pub command: Option<EventsCommand>,
    /// Only dead letters: deliveries that gave up after `max_attempts`.
    #[arg(long, conflicts_with = "status")]
    pub failed: bool,
    /// Only deliveries in this state: pending, delivered or dead.
    #[arg(long)]
    pub status: Option<String>,
    /// Only this consumer's deliveries.
    #[arg(long)]
    pub consumer: Option<String>,
    /// Only deliveries of this run's events.
    #[arg(long)]
    pub run: Option<String>,
    /// Most deliveries to list (the newest).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Print a JSON array of `{consumer, status, attempts, next_attempt_at, last_error, event}`.
    #[arg(long)]
    pub json: bool,
}

/// `flow events` subcommands.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Re-queue deliveries (dead, delivered or pending): due now, attempts counted afresh.
    #[command(
        after_help = "Examples:\n  flow events redeliver evt_01J...                 # to every consumer that had it\n  flow events redeliver evt_01J... --consumer ops-webhook\n  flow events redeliver --failed                   # every dead letter"
    )]
    Redeliver(RedeliverArgs),
    /// Follow new events as they are written (like `tail -f`); Ctrl-C stops.
    #[command(
        after_help = "Examples:\n  flow events tail\n  flow events tail --json --from-start | jq .type"
    )]
    Tail(TailArgs),
    /// Run the dispatcher in the foreground: deliver to the consumers of flow.toml.
    #[command(
        after_help = "Examples:\n  flow --config flow.toml events dispatch          # until Ctrl-C / SIGTERM\n  flow events dispatch --once                      # deliver what is due, then exit"
    )]
    Dispatch(DispatchArgs),
}

/// Arguments of `flow events redeliver`.
#[derive(Debug, Args)]
pub struct RedeliverArgs {
    /// Event ids (`evt_…`).
    #[arg(required_unless_present = "failed")]
    pub ids: Vec<String>,
    /// Only for this consumer (default: every consumer that has a delivery of the event).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Every dead letter (of `--consumer`, if given).
    #[arg(long)]
    pub failed: bool,
}

/// Arguments of `flow events tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    /// Only this run's events.
    #[arg(long)]
    pub run: Option<String>,
    /// Print every event in the outbox first, not only new ones.
    #[arg(long)]
    pub from_start: bool,
    /// One JSON object per line (what consumers receive).
    #[arg(long)]
    pub json: bool,
    /// How often to look for new events.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
}

/// Arguments of `flow events dispatch`.
#[derive(Debug, Args)]
pub struct DispatchArgs {
    /// Deliver what is due now, then exit (retries are left for later).
    #[arg(long)]
    pub once: bool,
    /// How often an idle consumer looks for work.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
}

/// `flow events …`.
pub(crate) async fn events(
    cli: &Cli,
    args: &EventsArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    match &args.command {
        None => list(cli, args, stdout, stderr).await,
        Some(EventsCommand::Redeliver(a)) => redeliver(cli, a, stdout, stderr).await,
        Some(EventsCommand::Tail(a)) => tail(cli, a, stdout).await,
        Some(EventsCommand::Dispatch(a)) => dispatch(cli, a, stderr).await,
    }
}

fn delivery_json(d: &Delivery, ledger: &Ledger) -> Json {
    json!({
        "consumer": d.consumer,
        "status": d.status.as_str(),
        "attempts": d.attempts,
        "next_attempt_at": d.next_attempt_at,
        "last_error": d.last_error,
        "event": wire::to_json(&d.event, ledger.scope()),
    })
}

async fn list(
    cli: &Cli,
    args: &EventsArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let status = match (args.failed, args.status.as_deref()) {
        (true, _) => Some(DeliveryStatus::Dead),
        (false, None) => None,
        (false, Some("pending")) => Some(DeliveryStatus::Pending),
        (false, Some("delivered")) => Some(DeliveryStatus::Delivered),
        (false, Some("dead")) => Some(DeliveryStatus::Dead),
        (false, Some(other)) => {
            return Err(Error::invalid(format!(
                "unknown delivery status `{other}`; use pending, delivered or dead"
            )));
        }
    };
    let ledger = open_ledger(cli).await?;
    let filter = DeliveryFilter {
        consumer: args.consumer.clone(),
        status,
        event_id: None,
        run_id: args.run.clone(),
        limit: args.limit,
    };
    let list = ledger.list_deliveries(filter).await.map_err(unavailable)?;
    if args.json {
        let out: Vec<Json> = list.iter().map(|d| delivery_json(d, &ledger)).collect();
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_default()
        );
        return Ok(exit::OK);
    }
    if list.is_empty() {
        let what = if status == Some(DeliveryStatus::Dead) {
            "no dead letters"
        } else {
            "no deliveries yet; consumers are configured as [[consumers]] in flow.toml, and `flow events tail --from-start` shows the events themselves"
        };
        let _ = writeln!(stderr, "{what}");
    }
    if !list.is_empty() {
        let rows: Vec<Vec<String>> = list.iter().map(delivery_row).collect();
        let header = [
            "EVENT", "TYPE", "RUN", "CONSUMER", "STATUS", "ATTEMPTS", "NOTE",
        ];
        let _ = stdout.write_all(table(&header, &rows, terminal_width()).as_bytes());
    }
    Ok(exit::OK)
}

/// The most characters of an error a table row shows (`--json` has it whole).
const NOTE_MAX: usize = 100;

/// One delivery as a row of the `flow events` table; the note is when a pending one is
/// tried next and why the last attempt failed, or why a dead one gave up.
fn delivery_row(d: &Delivery) -> Vec<String> {
    let note = match d.status {
        DeliveryStatus::Pending if d.attempts > 0 => format!(
            "next attempt {}: {}",
            d.next_attempt_at,
            d.last_error.as_deref().unwrap_or("")
        ),
        DeliveryStatus::Dead => d.last_error.clone().unwrap_or_default(),
        _ => String::new(),
    };
    vec![
        d.event.id.clone(),
        d.event.event_type.as_str().to_string(),
        d.event.run_id.clone().unwrap_or_else(|| "-".into()),
        d.consumer.clone(),
        d.status.as_str().to_string(),
        d.attempts.to_string(),
        cell(&note, NOTE_MAX),
    ]
}

/// A ledger error that stops the command, exit by its class (`Error::Ledger`).
fn unavailable(e: flow_ledger::Error) -> Error {
    Error::Ledger(e)
}

async fn redeliver(
    cli: &Cli,
    args: &RedeliverArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    let mut targets: Vec<(String, String)> = Vec::new();
    let mut missing = Vec::new();
    let mut filters: Vec<DeliveryFilter> = args
        .ids
        .iter()
        .map(|id| DeliveryFilter {
            consumer: args.consumer.clone(),
            event_id: Some(id.clone()),
            limit: 10_000,
            ..Default::default()
        })
        .collect();
    if args.failed {
        filters.push(DeliveryFilter {
            consumer: args.consumer.clone(),
            status: Some(DeliveryStatus::Dead),
            limit: 100_000,
            ..Default::default()
        });
    }
    for filter in filters {
        let id = filter.event_id.clone();
        let found = ledger.list_deliveries(filter).await.map_err(unavailable)?;
        if found.is_empty() {
            missing.extend(id);
        }
        targets.extend(found.into_iter().map(|d| (d.consumer, d.event.id)));
    }
    let now = SystemClock.now();
    for (consumer, id) in &targets {
        ledger
            .redeliver(consumer, id, now)
            .await
            .doing(|| format!("re-queueing {id} for {consumer}"))?;
        let _ = writeln!(stdout, "re-queued {id} for {consumer}");
    }
    if args.failed && targets.is_empty() {
        let _ = writeln!(stderr, "no dead letters to re-queue");
    }
    if !missing.is_empty() {
        let to = args
            .consumer
            .as_deref()
            .map_or(String::new(), |c| format!(" to consumer `{c}`"));
        return Err(Error::invalid(format!(
            "no delivery of {}{to} (see `flow events`)",
            missing.join(", ")
        )));
    }
    Ok(exit::OK)
}

/// Resolves when Ctrl-C or SIGTERM arrives.
async fn interrupted() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How far behind the highest `seq` seen each poll of `tail` re-reads (PostgreSQL may
/// make an event visible after events with a higher `seq`).
const LOOKBACK: i64 = 1000;

async fn tail(cli: &Cli, args: &TailArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    // On PostgreSQL a transaction may commit after a later `seq` became visible, so each
    // poll re-reads a window behind the highest `seq` seen and prints what is new.
    let mut seen: BTreeMap<i64, ()> = BTreeMap::new();
    let mut high = -1;
    let mut first = !args.from_start;
    if first {
        high = ledger
            .last_event_seq()
            .await
            .map_err(unavailable)?
            .unwrap_or(-1);
    }
    let stop = interrupted();
    tokio::pin!(stop);
    // Catching up (a full page last time): read forward only, so a backlog larger than
    // the look-back window still makes progress.
    let mut behind = args.from_start;
    loop {
        let after = if behind { high } else { high - LOOKBACK };
        let filter = EventFilter {
            run_id: args.run.clone(),
            after_seq: Some(after),
            limit: 1000,
        };
        let events = ledger.list_events(filter).await.map_err(unavailable)?;
        let full = events.len() == 1000;
        for e in events {
            if seen.insert(e.seq, ()).is_some() {
                continue;
            }
            high = high.max(e.seq);
            if first {
                continue;
            }
            let line = if args.json {
                wire::to_json(&e, ledger.scope()).to_string()
            } else {
                let mut place = e.run_id.clone().unwrap_or_default();
                if let Some(step) = &e.step_id {
                    place.push_str(&format!(" step={step}"));
                }
                if let Some(call) = &e.tool_call_id {
                    place.push_str(&format!(" call={call}"));
                }
                format!(
                    "{}  {:<20} {place}  {}",
                    e.time,
                    e.event_type.as_str(),
                    e.payload
                )
            };
            if writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // The reader went away (a closed pipe): stop like `tail` does.
                return Ok(exit::OK);
            }
        }
        first = false;
        seen = seen.split_off(&(high - LOOKBACK));
        behind = full;
        if full {
            continue;
        }
        tokio::select! {
            _ = &mut stop => return Ok(exit::OK),
            _ = tokio::time::sleep(args.poll_interval) => {}
        }
    }
}

/// Secrets, logging, config and consumers for `dispatch`.
fn load_consumers(cli: &Cli) -> Result<Vec<Consumer>, Error> {
    let secrets = Secrets::load(cli.secrets_file.as_deref())?;
    // Before anything can log: webhook signing keys are secrets and are scrubbed too.
    let config = Config::load(cli.config.as_deref())?;
    logging::init(
        cli.log_format,
        &secrets,
        &config.telemetry,
        crate::telemetry::Process::Service,
    );
    let consumers = events::consumers(&config.consumers, &secrets)
        .map_err(|e| Error::unavailable(e.to_string()))?;
    if consumers.is_empty() {
        let from = config
            .path
            .as_ref()
            .map_or("no flow.toml found".to_string(), |p| {
                p.display().to_string()
            });
        return Err(Error::unavailable(format!(
            "no event consumers configured ({from}); add [[consumers]] entries (see README, Events)"
        )));
    }
    Ok(consumers)
}

async fn dispatch(cli: &Cli, args: &DispatchArgs, stderr: &mut dyn Write) -> Result<u8, Error> {
    let consumers = load_consumers(cli)?;
    let ledger = open_ledger(cli).await?;
    let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
    let _ = writeln!(
        stderr,
        "dispatching events from {} to {} consumer(s): {}",
        ledger.url_redacted(),
        names.len(),
        names.join(", ")
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let dispatcher = Dispatcher::new(ledger, consumers, clock).with_options(Options {
        poll_interval: args.poll_interval,
        ..Options::default()
    });
    if args.once {
        let summary = dispatcher
            .dispatch_once()
            .await
            .map_err(|e| Error::unavailable(e.to_string()))?;
        let _ = writeln!(stderr, "{summary}");
        return Ok(exit::OK);
    }
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        interrupted().await;
        trigger.cancel();
    });
    let summary = dispatcher.run(shutdown).await;
    let _ = writeln!(stderr, "stopped: {summary}");
    Ok(exit::OK)
}

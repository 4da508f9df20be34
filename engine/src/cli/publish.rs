//! `flow publish NAME --data JSON`: publish an event for `wait:` nodes, locally against
//! `--db` or through a `flow serve` with `--server`. Idempotent on `--id`.

use std::io::Write;

use clap::Args;
use serde_json::{Value as Json, json};

use super::{Cli, Error, LedgerContext, exit, open_ledger};

/// Arguments of `flow publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The event's name (`shipment.delivered`).
    pub name: String,
    /// The event's data, JSON (default `{}`): a wait's `match` reads it as `event`.
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// Your id for the event: publishing the same id again changes nothing.
    #[arg(long = "id", value_name = "EVENT_ID")]
    pub event_id: Option<String>,
    /// Who publishes (recorded with the event; default `USER@host`).
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Client mode: publish through a `flow serve` (the token's name is recorded).
    #[command(flatten)]
    pub remote: super::Remote,
}

fn data(args: &PublishArgs) -> Result<Json, Error> {
    match &args.data {
        None => Ok(json!({})),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            Error::invalid(format!(
                "--data is not JSON (line {}, column {}): {e}",
                e.line(),
                e.column()
            ))
        }),
    }
}

fn report(stdout: &mut dyn Write, id: &str, duplicate: bool, signalled: u64) {
    let _ = if duplicate {
        writeln!(stdout, "{id} already published: nothing changed")
    } else {
        writeln!(
            stdout,
            "{id} published; {signalled} waiting run(s) signalled"
        )
    };
}

/// `flow publish` against `--db`.
pub(crate) async fn publish(
    cli: &Cli,
    args: &PublishArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let data = data(args)?;
    let by = super::who::Who {
        by: args.by.clone(),
        reason: None,
    }
    .name()?;
    let ledger = open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let p = ledger
        .publish_event(&args.name, args.event_id.as_deref(), &data, Some(&by), now)
        .await
        .doing(|| "cannot publish".into())?;
    report(stdout, &p.event_id, p.duplicate, p.signalled);
    Ok(exit::OK)
}

/// `flow publish --server`.
pub(crate) async fn remote(
    server: &str,
    args: &PublishArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let data = data(args)?;
    let client = super::remote::client(server, &args.remote)?;
    let mut body = json!({ "name": args.name, "data": data });
    if let Some(id) = &args.event_id {
        body["event_id"] = json!(id);
    }
    let v = client
        .post(&["events:publish"], &body)
        .await
        .map_err(|e| super::remote::failed(&e, client.has_token()))?;
    report(
        stdout,
        v["event_id"].as_str().unwrap_or("?"),
        v["duplicate"] == true,
        v["signalled"].as_u64().unwrap_or(0),
    );
    Ok(exit::OK)
}

//! `flow release-slot RUN NODE`: an operator frees the concurrency slot a call in doubt
//! holds (`docs/flow-control.md`), when they know the downstream is no longer working on
//! it, without deciding what became of the call.

use std::io::Write;

use clap::Args;

use super::{Cli, Error, exit, open_ledger};

/// Arguments of `flow release-slot`.
#[derive(Debug, Args)]
pub struct ReleaseSlotArgs {
    /// The run id.
    pub run: String,
    /// The node whose call is in doubt.
    pub node: String,
    /// Who and why (recorded as `tool_call.slot_released`).
    #[command(flatten)]
    pub who: super::who::Who,
}

/// Releases the slot, or says why there was none to release (exit 2).
pub(crate) async fn release_slot(
    cli: &Cli,
    args: &ReleaseSlotArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let actor = args.who.actor()?;
    let ledger = open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    if ledger
        .release_slot(&args.run, &args.node, &actor, now)
        .await
        .map_err(Error::from)?
    {
        let _ = writeln!(
            stdout,
            "released the slot of {}/{}: it stays in doubt until resolved",
            args.run, args.node
        );
        return Ok(exit::OK);
    }
    // Say why not, from what the call is.
    let why = match ledger.get_call(&args.run, &args.node).await {
        Err(flow_ledger::Error::NotFound { .. }) => {
            format!("run {} has no call of node `{}`", args.run, args.node)
        }
        Err(e) => return Err(Error::from(e)),
        Ok(call) if call.status != flow_ledger::CallStatus::InDoubt => format!(
            "{}/{} holds no concurrency slot: it is {}, and only a call in doubt keeps one",
            args.run, args.node, call.status
        ),
        Ok(_) => format!(
            "{}/{} holds no concurrency slot: its tool has no `concurrency:`, or the slot \
             was released already",
            args.run, args.node
        ),
    };
    Err(Error::invalid(why))
}

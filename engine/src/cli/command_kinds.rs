//! Which commands write to the ledger, run workflows, or only read an existing ledger:
//! the three questions `cli::command` asks of a command before it opens anything.

use super::mcp::McpCommand;
use super::{Command, connections, events, schedules};

/// The command's name when it writes to the ledger (refused on a read-only `--db`).
pub(super) fn writing_command(command: &Command) -> Option<&'static str> {
    match command {
        Command::Run(_) => Some("run"),
        Command::Submit(_) => Some("submit"),
        Command::Daemon(_) => Some("daemon"),
        Command::Serve(_) => Some("serve"),
        Command::Mcp(args) => match &args.command {
            McpCommand::Serve(_) => Some("mcp serve"),
            McpCommand::Accept(_) => Some("mcp accept"),
            McpCommand::Pins => None,
        },
        Command::Resume(_) => Some("resume"),
        Command::Reconcile(args) if !args.dry_run => Some("reconcile"),
        Command::Cancel(_) => Some("cancel"),
        Command::ReleaseSlot(_) => Some("release-slot"),
        Command::Redrive(_) => Some("redrive"),
        Command::Approve(_) => Some("approve"),
        Command::Deny(_) => Some("deny"),
        Command::Publish(_) => Some("publish"),
        Command::Migrate => Some("migrate"),
        Command::Events(args) => match &args.command {
            Some(events::EventsCommand::Redeliver(_)) => Some("events redeliver"),
            Some(events::EventsCommand::Dispatch(_)) => Some("events dispatch"),
            Some(events::EventsCommand::Tail(_)) | None => None,
        },
        Command::Gc(args) if !args.dry_run => Some("gc"),
        Command::Connect(_) => Some("connect"),
        Command::Connections(args) => match &args.command {
            Some(connections::ConnectionsCommand::Revoke(_)) => Some("connections revoke"),
            Some(connections::ConnectionsCommand::Rekey) => Some("connections rekey"),
            Some(connections::ConnectionsCommand::Keygen) | None => None,
        },
        Command::Schedules(args) => match &args.command {
            Some(schedules::SchedulesCommand::Pause(_)) => Some("schedules pause"),
            Some(schedules::SchedulesCommand::Resume(_)) => Some("schedules resume"),
            Some(schedules::SchedulesCommand::Trigger(_)) => Some("schedules trigger"),
            Some(schedules::SchedulesCommand::Apply(_)) => Some("schedules apply"),
            Some(schedules::SchedulesCommand::Remove(_)) => Some("schedules remove"),
            Some(schedules::SchedulesCommand::History(_)) | None => None,
        },
        Command::Show(_)
        | Command::Gc(_)
        | Command::Runs(_)
        | Command::Approvals(_)
        | Command::Reconcile(_)
        | Command::Validate { .. }
        | Command::Graph { .. }
        | Command::Schema
        | Command::Completions { .. }
        | Command::Man
        | Command::Version => None,
    }
}

/// Commands whose process may execute workflows through the gateway, where `FLOW_FAULT`
/// aborts: they announce a set `FLOW_FAULT` at start (`fault::start_warning`).
pub(super) fn runs_workflows(command: &Command) -> bool {
    matches!(
        command,
        Command::Run(_) | Command::Resume(_) | Command::Daemon(_) | Command::Serve(_)
    ) || matches!(command, Command::Mcp(a) if matches!(a.command, McpCommand::Serve(_)))
}

/// Commands that only look at (or steer) what is already in a ledger: on a missing one
/// they report it instead of creating an empty database.
pub(super) fn needs_existing_ledger(command: &Command) -> bool {
    match command {
        Command::Show(_)
        | Command::Runs(_)
        | Command::Cancel(_)
        | Command::ReleaseSlot(_)
        | Command::Resume(_)
        | Command::Redrive(_)
        | Command::Approvals(_)
        | Command::Approve(_)
        | Command::Deny(_)
        | Command::Reconcile(_)
        | Command::Gc(_) => true,
        Command::Mcp(a) => !matches!(a.command, McpCommand::Serve(_)),
        Command::Events(args) => !matches!(args.command, Some(events::EventsCommand::Dispatch(_))),
        _ => false,
    }
}

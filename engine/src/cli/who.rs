//! Who steers a run from the command line, and why: `--by` and `--reason` of `resume
//! --resolve`, `cancel` and `redrive`, recorded in the ledger as the API records a
//! token's name and a body's `reason`.

use clap::Args;
use flow_ledger::{Actor, WorkerId};

use super::CliError;

/// `--by` and `--reason`.
#[derive(Debug, Clone, Default, Args)]
pub struct Who {
    /// Who is doing this, recorded in the run's audit trail (default: `$USER@host`).
    /// Through `--server` the token's name is recorded instead.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Why, recorded with the change.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

impl Who {
    /// The name recorded: `--by`, else `$USER@host` (`$USERNAME` on Windows). Refused
    /// (exit 2) when neither names anyone — the audit trail never says `unknown@…` —
    /// or when `--by` is not a plain name.
    pub(crate) fn name(&self) -> Result<String, CliError> {
        if let Some(by) = &self.by {
            if by.trim().is_empty() || by.len() > 128 || by.chars().any(char::is_control) {
                return Err(CliError::invalid(format!(
                    "--by \"{}\": give 1 to 128 characters without control characters",
                    by.escape_debug()
                )));
            }
            return Ok(by.clone());
        }
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("USERNAME"))
            .ok()
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| {
                CliError::invalid(
                    "cannot tell who you are ($USER is not set): pass --by NAME, which is recorded in the run's audit trail",
                )
            })?;
        let current = WorkerId::current();
        let host = current.as_str().split(':').next().unwrap_or("localhost");
        Ok(format!("{user}@{host}"))
    }

    /// The actor recorded with the change.
    pub(crate) fn actor(&self) -> Result<Actor, CliError> {
        Ok(Actor {
            by: self.name()?,
            reason: self.reason.clone(),
        })
    }

    /// Refuses `--by` in client mode: the server records the token's name.
    pub(crate) fn check_remote(&self) -> Result<(), CliError> {
        if self.by.is_some() {
            return Err(CliError::invalid(
                "--by goes with a local --db: through --server the token's name is recorded",
            ));
        }
        Ok(())
    }
}

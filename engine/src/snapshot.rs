//! The workflow a run carries: the text stored with it when it was created, parsed and
//! re-validated whenever the run is resumed or claimed by a daemon (the file on disk may
//! have changed since), and the hash that is a run's identity with its inputs.
//!
//! Here rather than in the CLI because the daemon needs it too, and the daemon stands
//! below the commands that start it.

use flow_ledger::Run;
use sha2::{Digest, Sha256};

use crate::workflow::{ValidWorkflow, ValidateOptions, parse_with};

/// The validation every workflow flow runs gets: the built-in functions are known, so
/// a node naming an unknown function is refused with its position.
pub fn validate_options() -> ValidateOptions {
    ValidateOptions {
        functions: Some(
            flow_adapters::function::Registry::with_builtins()
                .names()
                .into_iter()
                .collect(),
        ),
    }
}

/// The workflow a run started with (its stored snapshot), re-validated.
pub fn snapshot(run: &Run) -> Result<ValidWorkflow, String> {
    parse_with(
        &run.workflow_text,
        &format!("<run {} snapshot>", run.id),
        &validate_options(),
    )
    .map_err(|d| {
        format!(
            "the stored workflow of run {} no longer validates:\n{d}",
            run.id
        )
    })
}

/// sha256 of the workflow text: a run's identity together with its inputs.
pub fn workflow_hash(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

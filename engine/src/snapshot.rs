//! The workflow a run carries: the text stored with it when it was created, parsed and
//! re-validated whenever the run is resumed or claimed by a daemon (the file on disk may
//! have changed since). The text's hash, a run's identity with its inputs and the key
//! of its one stored copy, is the ledger's (`flow_ledger::workflow_hash`).
//!
//! Here rather than in the CLI because the daemon needs it too, and the daemon stands
//! below the commands that start it.

use flow_ledger::Run;

use crate::workflow::{ValidWorkflow, ValidateOptions, parse_named};

/// The validation every workflow flow runs gets: the built-in functions are known, so
/// a node naming an unknown function is refused with its position.
pub fn validate_options() -> ValidateOptions {
    let registry = flow_adapters::function::Registry::with_builtins();
    let names = registry.names();
    ValidateOptions {
        pure_functions: names
            .iter()
            .filter(|n| registry.is_pure(n))
            .cloned()
            .collect(),
        functions: Some(names.into_iter().collect()),
    }
}

/// The workflow a run started with (its stored snapshot), re-validated.
pub fn snapshot(run: &Run) -> Result<ValidWorkflow, String> {
    parse_named(
        &run.workflow_text,
        &format!("<run {} snapshot>", run.id),
        &run.workflow_name,
        &validate_options(),
    )
    .map_err(|d| {
        format!(
            "the stored workflow of run {} no longer validates:\n{d}",
            run.id
        )
    })
}

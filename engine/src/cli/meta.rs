//! `flow completions`, `flow man` and `flow version`: what a packager or an operator asks
//! of the binary itself. Completions and the manual page are generated from the clap
//! definition, so they list exactly the flags the binary accepts.

use std::io::Write;

use clap::CommandFactory;

use super::{Cli, Error, exit};

/// `flow --version` and the first line of `flow version`: the crate version, the git
/// commit and its date (`build.rs`; `unknown` outside a git checkout).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FLOW_GIT_COMMIT"),
    ", ",
    env!("FLOW_GIT_DATE"),
    ")"
);

/// `flow completions SHELL`: the completion script on stdout.
pub(crate) fn completions(shell: clap_complete::Shell, stdout: &mut dyn Write) -> u8 {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "flow", &mut out);
    let _ = stdout.write_all(&out);
    exit::OK
}

/// `flow man`: the manual page (roff) on stdout: synopsis, global options, every
/// subcommand with its summary, examples, version (`flow COMMAND --help` has the rest).
/// The page names the release, not the commit, so the committed copy (`docs/flow.1`)
/// changes only when the interface or the version does.
pub(crate) fn man(stdout: &mut dyn Write) -> Result<u8, Error> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command().version(env!("CARGO_PKG_VERSION")))
        .render(&mut out)
        .map_err(|e| Error::unavailable(format!("cannot render the manual page: {e}")))?;
    let _ = stdout.write_all(&out);
    Ok(exit::OK)
}

/// `flow version`: the version line, the ledger schema this build expects, and the one
/// `--db` has — read without migrating or creating anything (a missing SQLite file is
/// reported as such, and the command still exits 0: a version query must not depend on
/// a database).
pub(crate) async fn version(cli: &Cli, stdout: &mut dyn Write) -> u8 {
    let _ = writeln!(stdout, "flow {VERSION}");
    let expected = flow_ledger::Ledger::schema_version();
    let _ = writeln!(stdout, "ledger schema {expected} (this build)");
    let db = flow_ledger::redact_url(&cli.db);
    let applied = match flow_ledger::sqlite_path(&cli.db) {
        Some(path) if !path.starts_with(':') && !std::path::Path::new(path).exists() => {
            format!("none: no ledger at {path} yet")
        }
        _ => {
            let opts = flow_ledger::OpenOptions {
                migrate: false,
                max_connections: 1,
                ..flow_ledger::OpenOptions::default()
            };
            match flow_ledger::Ledger::open(&cli.db, opts).await {
                Ok(ledger) => {
                    let found = ledger.applied_schema_version().await;
                    ledger.close().await;
                    match found {
                        Ok(Some(v)) => v.to_string(),
                        Ok(None) => "none: not migrated yet".into(),
                        Err(e) => format!("unknown: {e}"),
                    }
                }
                Err(e) => format!("unknown: {e}"),
            }
        }
    };
    let _ = writeln!(stdout, "ledger schema at {db}: {applied}");
    exit::OK
}

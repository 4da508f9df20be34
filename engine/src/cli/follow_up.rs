//! Commands flow prints for the user to run next (`see flow show …`, the resolve
//! commands): they repeat every global option that differs from its default, so that
//! pasting one reaches the same ledger, tenant, workspace, configuration and secrets.

use std::path::Path;

use super::Cli;

/// `flow <globals that differ from their defaults>`, shell-quoted: what a follow-up
/// command starts with.
///
/// A PostgreSQL password in `--db` is left out (it would land in terminals and logs);
/// the pasted command then takes it from `PGPASSWORD` or `~/.pgpass`, as libpq does.
/// Relative `--config` / `--secrets-file` paths are made absolute, so the command also
/// works from another directory.
pub(crate) fn prefix(cli: &Cli) -> String {
    let mut parts = vec!["flow".to_string()];
    if cli.db != super::DEFAULT_DB {
        parts.push(format!("--db {}", quote(&without_password(&cli.db))));
    }
    if cli.tenant != "default" {
        parts.push(format!("--tenant {}", quote(&cli.tenant)));
    }
    if cli.workspace != "default" {
        parts.push(format!("--workspace {}", quote(&cli.workspace)));
    }
    if let Some(config) = &cli.config {
        parts.push(format!("--config {}", quote(&absolute(config))));
    }
    if let Some(file) = &cli.secrets_file {
        parts.push(format!("--secrets-file {}", quote(&absolute(file))));
    }
    parts.join(" ")
}

fn absolute(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

fn without_password(db: &str) -> String {
    match url::Url::parse(db) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(None);
            url.to_string()
        }
        _ => db.to_string(),
    }
}

/// A word as a POSIX shell reads it back: bare when it holds only safe characters,
/// else single-quoted (`'` written as `'\''`).
pub(crate) fn quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["flow"];
        all.extend_from_slice(args);
        all.push("runs");
        Cli::try_parse_from(all).expect("parse")
    }

    #[test]
    fn defaults_are_left_out_and_the_rest_repeated() {
        // Isolated from the caller's FLOW_* variables by parsing explicit values only.
        let plain = cli(&[
            "--db",
            super::super::DEFAULT_DB,
            "--tenant",
            "default",
            "--workspace",
            "default",
        ]);
        assert_eq!(prefix(&plain), "flow");
        let other = cli(&[
            "--db",
            "postgres://u:hunter2@db:5432/flow",
            "--tenant",
            "acme corp",
            "--workspace",
            "default",
        ]);
        assert_eq!(
            prefix(&other),
            "flow --db postgres://u@db:5432/flow --tenant 'acme corp'"
        );
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}

//! Why a command stopped before doing what it was asked, and the exit code each kind
//! gets — the one place the README's exit-code table is kept for errors.
//!
//! Commands return `Result<u8, Error>`: `Ok` carries an outcome (0 done, 1 the run
//! failed, 3 paused, 4 cancelled, 130 interrupted), `Err` a reason that [`Error::report`]
//! prints as `error: …` on stderr and [`Error::exit_code`] turns into 2 or 5.

use std::io::Write;

use super::exit;

/// A command's failure, by what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Input the user can correct: arguments, a file, inputs, an unknown run (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// flow could not do the work: the ledger is unreachable, the installation is
    /// misconfigured, a server could not start (exit 5).
    #[error("{0}")]
    Unavailable(String),
    /// Workflow problems, already rendered as `FILE:LINE:COL: error: …` lines (exit 2).
    #[error("{0}")]
    Diagnostics(String),
    /// Secrets the workflow reads and nobody provided; nothing was started (exit 2).
    #[error("workflow `{workflow}` reads {} missing secret(s)", names.len())]
    MissingSecrets {
        /// The workflow's `name:`.
        workflow: String,
        /// The secrets without a value.
        names: Vec<String>,
    },
    /// A read command pointed at a SQLite ledger that does not exist (exit 5); nothing
    /// was created.
    #[error(
        "no ledger at {path}: nothing has run with this --db yet (`flow run` or `flow migrate` creates it); nothing was created"
    )]
    NoLedger {
        /// The SQLite file named by `--db`.
        path: String,
    },
    /// The ledger refused or failed an operation the command has no better words for:
    /// exit by its [`flow_ledger::ErrorClass`] — 2 for what the user can act on (bad
    /// input, not found, a state conflict, a read-only ledger), 5 for a database that
    /// cannot be used or data that cannot be trusted.
    #[error(transparent)]
    Ledger(#[from] flow_ledger::Error),
    /// As [`Error::Ledger`], with what the command was doing when the ledger said
    /// no (`cannot list approvals: …`); the same exit by class.
    #[error("{doing}: {source}")]
    LedgerWhile {
        /// What was being done, as the message's head.
        doing: String,
        /// The ledger's answer.
        source: flow_ledger::Error,
    },
    /// The ledger could not be opened (exit 5).
    #[error("cannot open the ledger at {url}: {source}")]
    OpenLedger {
        /// `--db`, password redacted.
        url: String,
        /// Why.
        source: flow_ledger::Error,
    },
    /// `flow.toml` could not be loaded (exit 5; 2 when the file is over the size limit).
    #[error(transparent)]
    Config(#[from] crate::config::Error),
    /// The secrets file could not be loaded (exit 5; 2 when it is over the size limit).
    #[error(transparent)]
    Secrets(#[from] crate::secrets::Error),
    /// The operator API refused a client-mode request (`--server`): its problem's title
    /// and detail. Exit 2 for a 4xx (what was sent can be corrected), 5 for 5xx, 408, 429.
    #[error("{title}: {detail}")]
    Remote {
        /// The HTTP status.
        status: u16,
        /// The problem's `title`.
        title: String,
        /// The problem's `detail`.
        detail: String,
    },
}

impl Error {
    /// An input error (exit 2) with this message.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }

    /// A could-not-run error (exit 5) with this message.
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable(message.into())
    }

    /// The exit code of this error: the mapping the README's table documents.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Invalid(_) | Self::Diagnostics(_) | Self::MissingSecrets { .. } => exit::INVALID,
            Self::Config(e) if e.is_invalid_input() => exit::INVALID,
            Self::Secrets(
                crate::secrets::Error::TooLarge { .. } | crate::secrets::Error::TooShort { .. },
            ) => exit::INVALID,
            Self::Remote { status, .. }
                if (400..500).contains(status) && !matches!(status, 408 | 429) =>
            {
                exit::INVALID
            }
            Self::Remote { .. } => exit::UNAVAILABLE,
            Self::Ledger(e) | Self::LedgerWhile { source: e, .. } => match e.class() {
                flow_ledger::ErrorClass::BadInput
                | flow_ledger::ErrorClass::NotFound
                | flow_ledger::ErrorClass::Conflict
                | flow_ledger::ErrorClass::Forbidden => exit::INVALID,
                flow_ledger::ErrorClass::Unavailable | flow_ledger::ErrorClass::Corrupt => {
                    exit::UNAVAILABLE
                }
            },
            Self::Unavailable(_)
            | Self::NoLedger { .. }
            | Self::OpenLedger { .. }
            | Self::Config(_)
            | Self::Secrets(_) => exit::UNAVAILABLE,
        }
    }

    /// Prints the error on `stderr`: `error: MESSAGE`, except diagnostics and located
    /// `flow.toml` errors (already in their `FILE:LINE:COL: error:` form) and missing
    /// secrets (one line per secret, then what was not done).
    pub(crate) fn report(&self, stderr: &mut dyn Write) {
        match self {
            Self::Diagnostics(text) => {
                let _ = write!(stderr, "{text}");
            }
            Self::Config(located @ crate::config::Error::At { .. }) => {
                let _ = writeln!(stderr, "{located}");
            }
            Self::MissingSecrets { workflow, names } => {
                for name in names {
                    let _ = writeln!(
                        stderr,
                        "error: secret `{name}` is not set: provide FLOW_SECRET_{name} in the environment or a line `{name}=…` in --secrets-file"
                    );
                }
                let _ = writeln!(
                    stderr,
                    "nothing was started: workflow `{workflow}` reads {} missing secret{}",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" }
                );
            }
            _ => {
                let _ = writeln!(stderr, "error: {self}");
            }
        }
    }
}

/// Says what a command was doing when the ledger refused or failed it, keeping the exit
/// the ledger's error class gives (instead of every site choosing 2 or 5 by hand).
pub(crate) trait LedgerContext<T> {
    /// The error as [`Error::LedgerWhile`], headed by `doing`.
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> LedgerContext<T> for Result<T, flow_ledger::Error> {
    fn doing(self, doing: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::LedgerWhile {
            doing: doing(),
            source,
        })
    }
}

/// The exit code of a command's result, its error (if any) reported on `stderr` first.
pub(crate) fn finish(result: Result<u8, Error>, stderr: &mut dyn Write) -> u8 {
    match result {
        Ok(code) => code,
        Err(e) => {
            e.report(stderr);
            e.exit_code()
        }
    }
}

impl From<crate::runtime::Error> for Error {
    /// An unopenable ledger keeps its own message (exit 5); tool clients that cannot be
    /// set up are the installation's (exit 5).
    fn from(e: crate::runtime::Error) -> Self {
        match e {
            crate::runtime::Error::Ledger { url, source } => Error::OpenLedger { url, source },
            e @ crate::runtime::Error::Tools(_) => Error::unavailable(e.to_string()),
        }
    }
}

impl From<crate::runtime::api::Error> for Error {
    /// A bad flag or address is the caller's (exit 2); config or secrets the
    /// installation's (exit 5).
    fn from(e: crate::runtime::api::Error) -> Self {
        match e {
            crate::runtime::api::Error::Invalid(m) => Error::invalid(m),
            crate::runtime::api::Error::Installation(m) => Error::unavailable(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(status: u16) -> Error {
        Error::Remote {
            status,
            title: "T".into(),
            detail: "d".into(),
        }
    }

    #[test]
    fn each_kind_has_its_documented_exit_code() {
        let too_large = crate::secrets::Error::TooLarge {
            path: "/dev/zero".into(),
            limit: 1,
        };
        let cases = [
            (Error::invalid("x"), 2),
            (Error::Diagnostics("f:1:1: error: x\n".into()), 2),
            (
                Error::MissingSecrets {
                    workflow: "w".into(),
                    names: vec!["A".into()],
                },
                2,
            ),
            (Error::Secrets(too_large), 2),
            (
                Error::Secrets(crate::secrets::Error::TooShort {
                    names: vec!["PIN".into()],
                    min: crate::secrets::MIN_SECRET_BYTES,
                }),
                2,
            ),
            (Error::unavailable("x"), 5),
            (Error::NoLedger { path: "p".into() }, 5),
            (remote(404), 2),
            (remote(409), 2),
            (remote(401), 2),
            (remote(429), 5),
            (remote(503), 5),
            (
                Err::<(), _>(flow_ledger::Error::NotFound { what: "x".into() })
                    .doing(|| "reading".into())
                    .unwrap_err(),
                2,
            ),
            (
                Err::<(), _>(flow_ledger::Error::Unavailable {
                    url: "u".into(),
                    reason: "down".into(),
                })
                .doing(|| "reading".into())
                .unwrap_err(),
                5,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.exit_code(), code, "{e:?}");
        }
    }

    #[test]
    fn report_prefixes_error_except_for_diagnostics() {
        let mut out = Vec::new();
        let code = finish(Err(Error::invalid("bad --limit")), &mut out);
        assert_eq!(code, exit::INVALID);
        assert_eq!(String::from_utf8_lossy(&out), "error: bad --limit\n");
        let mut out = Vec::new();
        Error::Diagnostics("f.yaml:1:2: error: x\n".into()).report(&mut out);
        assert_eq!(String::from_utf8_lossy(&out), "f.yaml:1:2: error: x\n");
        let mut out = Vec::new();
        assert_eq!(finish(Ok(exit::PAUSED), &mut out), exit::PAUSED);
        assert!(out.is_empty());
    }
}

//! Who steers a run from the command line, and why: `--by` and `--reason` of `resume
//! --resolve`, `cancel` and `redrive`, recorded in the ledger as the API records a
//! token's name and a body's `reason`.

use clap::Args;
use flow_ledger::{Actor, WorkerId};

use super::Error;

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
    /// The name recorded: `--by`, else `USER@host` with the user from [`os_user`].
    /// Refused (exit 2) when nothing names anyone — the audit trail never says
    /// `unknown@…` — or when `--by` is not a plain name.
    pub(crate) fn name(&self) -> Result<String, Error> {
        if let Some(by) = &self.by {
            if by.trim().is_empty() || by.len() > 128 || by.chars().any(char::is_control) {
                return Err(Error::invalid(format!(
                    "--by \"{}\": give 1 to 128 characters without control characters",
                    by.escape_debug()
                )));
            }
            return Ok(by.clone());
        }
        let user = os_user().ok_or_else(|| {
            Error::invalid(
                "cannot tell who you are ($USER is not set and this process's user has no name): pass --by NAME, which is recorded in the run's audit trail",
            )
        })?;
        let current = WorkerId::current();
        let host = current.as_str().split(':').next().unwrap_or("localhost");
        Ok(format!("{user}@{host}"))
    }

    /// The actor recorded with the change.
    pub(crate) fn actor(&self) -> Result<Actor, Error> {
        Ok(Actor {
            by: self.name()?,
            reason: self.reason.clone(),
        })
    }

    /// Refuses `--by` in client mode: the server records the token's name.
    pub(crate) fn check_remote(&self) -> Result<(), Error> {
        if self.by.is_some() {
            return Err(Error::invalid(
                "--by goes with a local --db: through --server the token's name is recorded",
            ));
        }
        Ok(())
    }
}

/// This process's user: `$USER`, `$USERNAME` (Windows) or `$LOGNAME`, else (a service or
/// container without them) the name `/etc/passwd` gives the process's uid, else
/// `uid<N>`; `None` only where none of that exists.
fn os_user() -> Option<String> {
    for var in ["USER", "USERNAME", "LOGNAME"] {
        if let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            return Some(v);
        }
    }
    uid_name()
}

#[cfg(unix)]
fn uid_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let named = passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?;
        (id == uid.to_string() && !name.is_empty()).then(|| name.to_string())
    });
    Some(named.unwrap_or_else(|| format!("uid{uid}")))
}

#[cfg(not(unix))]
fn uid_name() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::Who;

    #[test]
    fn by_wins_and_a_bad_name_is_refused() {
        let who = |by: &str| Who {
            by: Some(by.to_string()),
            reason: None,
        };
        assert_eq!(who("ada").name().ok().as_deref(), Some("ada"));
        for bad in ["", "  ", "a\nb", &"x".repeat(129)] {
            assert!(who(bad).name().is_err(), "{bad:?}");
        }
        // Without --by the process's user is named, never `unknown`.
        let name = Who::default().name().unwrap_or_default();
        assert!(
            name.contains('@') && !name.starts_with("unknown@"),
            "{name}"
        );
    }
}

//! Schedules a workflow file carries (`schedules:`), stored with `flow schedules apply
//! FILE`: the ledger holds their whole definition (the workflow's text included), so
//! every daemon fires them without the file.
//!
//! Ownership is in the definition: one applied from a workflow says so under
//! [`APPLIED_FROM`] (the workflow's name). Applying a workflow again replaces its own
//! schedules and removes those it no longer carries; it never touches a schedule
//! `flow.toml` declares or another workflow applied ([`Error::Owned`]). A daemon's sync
//! of `flow.toml` neither prunes an applied schedule nor takes one over when its file
//! declares the same id (`sync_schedules`: that daemon leaves it alone and says so);
//! `flow schedules remove ID` settles such a clash.

use serde_json::Value;

use super::{ScheduleDef, prune_stored, state_for_update, sync_one};
use crate::clock::Timestamp;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Actor;

/// The definition key that names the workflow a schedule was applied from.
pub const APPLIED_FROM: &str = "applied_from";

/// The workflow a stored definition was applied from; `None` for one `flow.toml`
/// declares.
pub fn applied_from(definition: &Value) -> Option<&str> {
    definition.get(APPLIED_FROM).and_then(Value::as_str)
}

/// What applying did to one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// It was not stored: stored now, its cursor at now.
    Added,
    /// Its definition changed: stored, recorded `changed`, effective from the next tick.
    Changed,
    /// The same definition was stored already.
    Unchanged,
    /// The workflow no longer carries it: removed, recorded `removed`.
    Removed,
}

impl Applied {
    /// The word shown (`flow schedules apply`, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Changed => "changed",
            Self::Unchanged => "unchanged",
            Self::Removed => "removed",
        }
    }
}

impl Ledger {
    /// Stores the schedules workflow `owner` carries now (`defs`, each naming `owner`
    /// under [`APPLIED_FROM`]) and removes the ones it applied before and no longer
    /// carries, recorded with `actor`; in one transaction, so a refusal changes
    /// nothing. [`Error::Owned`] when an id is stored by `flow.toml` or another
    /// workflow. Returns what became of each id (the carried ones first).
    pub async fn apply_schedules(
        &self,
        owner: &str,
        defs: Vec<ScheduleDef>,
        actor: &str,
        now: Timestamp,
    ) -> Result<Vec<(String, Applied)>, Error> {
        if let Some(d) = defs
            .iter()
            .find(|d| applied_from(&d.definition) != Some(owner))
        {
            return Err(Error::Owned {
                what: format!("schedule `{}`", d.id),
                owner: format!(
                    "no workflow (its definition does not say `{APPLIED_FROM}: {owner}`)"
                ),
            });
        }
        let ledger = self.clone();
        let (owner, actor) = (owner.to_owned(), actor.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let mut out = Vec::with_capacity(defs.len());
                for def in &defs {
                    let before = state_for_update(c, s, &def.id).await?;
                    let what = match &before {
                        None => Applied::Added,
                        Some(st) => match applied_from(&st.definition) {
                            Some(o) if o == owner => {
                                if st.def_hash == crate::canonical_hash(&def.definition) {
                                    Applied::Unchanged
                                } else {
                                    Applied::Changed
                                }
                            }
                            other => {
                                return Err(Error::Owned {
                                    what: format!("schedule `{}`", def.id),
                                    owner: other.map_or_else(
                                        || "flow.toml (its [[schedules]])".to_string(),
                                        |o| format!("workflow `{o}` (applied from it)"),
                                    ),
                                });
                            }
                        },
                    };
                    let stored = sync_one(c, s, def, &actor, now).await?;
                    // Two applies of one new id at once: the second's insert did
                    // nothing (ON CONFLICT), and the row is the first's.
                    if stored.def_hash != crate::canonical_hash(&def.definition) {
                        return Err(Error::Owned {
                            what: format!("schedule `{}`", def.id),
                            owner: applied_from(&stored.definition).map_or_else(
                                || "flow.toml (its [[schedules]])".to_string(),
                                |o| format!("workflow `{o}` (applied from it just now)"),
                            ),
                        });
                    }
                    out.push((def.id.clone(), what));
                }
                let keep = |id: &str, from: Option<&str>| {
                    from != Some(owner.as_str()) || defs.iter().any(|d| d.id == id)
                };
                let why = format!("workflow `{owner}` applied without it");
                let who = Actor {
                    by: actor.clone(),
                    reason: Some(why),
                };
                let removed = prune_stored(c, s, keep, &who, now).await?;
                out.extend(removed.into_iter().map(|id| (id, Applied::Removed)));
                Ok(out)
            })
        })
        .await
    }
}

/// What changed between two definitions, key by key, in words (a history entry's
/// detail): a short value is shown before and after; a long one (a workflow's whole
/// text) only as changed.
pub(super) fn change_detail(old: &Value, new: &Value) -> String {
    const SHOWN: usize = 120;
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return format!("{old} → {new}");
    };
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut parts = Vec::new();
    for k in keys {
        let (a, b) = (old.get(k), new.get(k));
        if a == b {
            continue;
        }
        let show = |v: Option<&Value>| v.map_or_else(|| "(none)".to_string(), Value::to_string);
        let (a, b) = (show(a), show(b));
        if a.len() + b.len() > SHOWN {
            parts.push(format!("{k} changed"));
        } else {
            parts.push(format!("{k}: {a} → {b}"));
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::change_detail;

    #[test]
    fn a_change_names_each_key_and_hides_long_texts() {
        let long = "x".repeat(500);
        let old = json!({ "cron": "0 2 * * *", "text": long, "overlap": "skip" });
        let new = json!({ "cron": "0 3 * * *", "text": "y", "overlap": "skip" });
        assert_eq!(
            change_detail(&old, &new),
            r#"cron: "0 2 * * *" → "0 3 * * *"; text changed"#
        );
    }
}

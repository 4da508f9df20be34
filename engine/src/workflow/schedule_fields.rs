//! The fields of one schedule — id, cron, time zone, inputs, overlap, catch-up window —
//! checked the same way wherever they are written: a `[[schedules]]` entry of
//! `flow.toml` (positions are byte offsets), a `schedules:` item of a workflow file
//! (line and column) or a definition the ledger stored (no position). A leaf: it knows
//! cron and time zones ([`super::ticks`]) and templates, not where a schedule came from
//! or which workflow it runs.

use std::time::Duration;

use flow_ledger::Overlap;
use serde_json::{Map, Value as Json, json};

use super::ticks::{self, Ticks};
use crate::workflow::diagnostic::Pos;
use crate::workflow::expr::{self, Template};

/// The catch-up window of a schedule that sets none: a tick a daemon comes to later
/// than this (no daemon ran) is recorded missed rather than started.
pub const DEFAULT_CATCHUP: Duration = Duration::from_secs(60);

/// Longest catch-up window.
const MAX_CATCHUP: Duration = Duration::from_secs(31 * 24 * 3600);

/// A schedule's fields as written, each with where (`P`: what the source can name).
#[derive(Debug, Clone)]
pub struct Written<P> {
    /// The id.
    pub id: (String, P),
    /// The cron expression.
    pub cron: (String, P),
    /// The IANA time zone (`None`: UTC).
    pub timezone: Option<(String, P)>,
    /// The run's inputs (templates may read `schedule.*`), and where they are.
    pub inputs: (Map<String, Json>, P),
    /// `skip`, `buffer_one` or `allow` (`None`: skip).
    pub overlap: Option<(String, P)>,
    /// How late a tick may still start (`None`: [`DEFAULT_CATCHUP`]).
    pub catchup_window: Option<(String, P)>,
}

/// A schedule's fields, checked.
#[derive(Debug, Clone)]
pub struct Fields {
    /// Its id: part of each tick's run id.
    pub id: String,
    /// The cron expression as written.
    pub cron: String,
    /// The time zone as written (`UTC` when absent).
    pub timezone: String,
    /// When its ticks fall.
    pub ticks: Ticks,
    /// The inputs, as written (templates rendered per tick).
    pub inputs: Map<String, Json>,
    /// What a tick does while the previous run is unfinished.
    pub overlap: Overlap,
    /// How late a tick may still start.
    pub catchup: Duration,
}

impl<P: Copy> Written<P> {
    /// The fields checked, or the first problem and where it is. Messages name the
    /// schedule (`schedule `x`: …`).
    pub fn check(&self) -> Result<Fields, (P, String)> {
        let (id, id_at) = (&self.id.0, self.id.1);
        let bad = |at: P, message: String| (at, format!("schedule `{id}`: {message}"));
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(
                id_at,
                "an id is 1 to 64 letters, digits, `_` or `-` (it is part of each tick's run id)"
                    .into(),
            ));
        }
        let zone = self.timezone.as_ref();
        let ticks = Ticks::parse(&self.cron.0, zone.map(|z| z.0.as_str())).map_err(|e| {
            let at = match (&e, zone) {
                (ticks::Error::Zone(_), Some(z)) => z.1,
                _ => self.cron.1,
            };
            bad(at, e.to_string())
        })?;
        let overlap = match &self.overlap {
            None => Overlap::Skip,
            Some((o, at)) => match o.as_str() {
                "skip" => Overlap::Skip,
                "buffer_one" => Overlap::BufferOne,
                "allow" => Overlap::Allow,
                other => {
                    return Err(bad(
                        *at,
                        format!("overlap `{other}` is not one of skip, buffer_one, allow"),
                    ));
                }
            },
        };
        let catchup = match &self.catchup_window {
            None => DEFAULT_CATCHUP,
            Some((w, at)) => humantime::parse_duration(w)
                .ok()
                .filter(|d| *d <= MAX_CATCHUP)
                .ok_or_else(|| {
                    bad(
                        *at,
                        format!(
                            "catchup_window `{w}` is not a duration of at most 31 days (e.g. 30s, 6h)"
                        ),
                    )
                })?,
        };
        check_inputs(&self.inputs.0).map_err(|m| bad(self.inputs.1, m))?;
        Ok(Fields {
            id: id.clone(),
            cron: self.cron.0.clone(),
            timezone: zone.map_or_else(|| "UTC".to_string(), |z| z.0.clone()),
            ticks,
            inputs: self.inputs.0.clone(),
            overlap,
            catchup,
        })
    }
}

impl Fields {
    /// The fields as a stored definition holds them (the workflow is the caller's).
    pub fn definition(&self) -> Map<String, Json> {
        let mut m = Map::new();
        m.insert("cron".into(), json!(self.cron));
        m.insert("timezone".into(), json!(self.timezone));
        m.insert("inputs".into(), Json::Object(self.inputs.clone()));
        m.insert("overlap".into(), json!(self.overlap.as_str()));
        m.insert(
            "catchup_window".into(),
            json!(humantime::format_duration(self.catchup).to_string()),
        );
        m
    }

    /// The fields of a stored definition ([`Fields::definition`]) of schedule `id`, or
    /// why it cannot be read.
    pub fn of_definition(id: &str, def: &Json) -> Result<Self, String> {
        let text = |key: &str| {
            def.get(key)
                .and_then(Json::as_str)
                .map(|s| (s.to_string(), ()))
        };
        let written = Written {
            id: (id.to_string(), ()),
            cron: text("cron")
                .ok_or_else(|| format!("schedule `{id}`: the stored definition has no cron"))?,
            timezone: text("timezone"),
            inputs: (
                def.get("inputs")
                    .and_then(Json::as_object)
                    .cloned()
                    .unwrap_or_default(),
                (),
            ),
            overlap: text("overlap"),
            catchup_window: text("catchup_window"),
        };
        written.check().map_err(|((), m)| m)
    }
}

/// Each string input's templates parse and read only `schedule.*`.
fn check_inputs(inputs: &Map<String, Json>) -> Result<(), String> {
    for (name, v) in inputs {
        for s in strings(v) {
            let t = Template::parse(s, Pos { line: 1, col: 1 })
                .map_err(|e| format!("input `{name}`: {e}"))?;
            for src in t.exprs() {
                if let Some(r) = expr::references(src)
                    .into_iter()
                    .find(|r| !(r == "schedule" || r.starts_with("schedule.")))
                {
                    return Err(format!(
                        "input `{name}` reads `{r}`: a schedule's inputs may read only `schedule.time` and `schedule.id`"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The strings inside a JSON value.
fn strings(v: &Json) -> Vec<&str> {
    match v {
        Json::String(s) => vec![s.as_str()],
        Json::Array(a) => a.iter().flat_map(strings).collect(),
        Json::Object(m) => m.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(cron: &str) -> Written<u32> {
        Written {
            id: ("nightly".into(), 1),
            cron: (cron.into(), 2),
            timezone: Some(("Europe/Paris".into(), 3)),
            inputs: (Map::new(), 4),
            overlap: Some(("buffer_one".into(), 5)),
            catchup_window: Some(("6h".into(), 6)),
        }
    }

    #[test]
    fn a_problem_is_where_its_value_is() {
        assert_eq!(written("nope").check().expect_err("cron").0, 2);
        let mut w = written("0 2 * * *");
        w.timezone = Some(("Mars/Olympus".into(), 3));
        assert_eq!(w.check().expect_err("zone").0, 3);
        let mut w = written("0 2 * * *");
        w.overlap = Some(("queue".into(), 5));
        let (at, m) = w.check().expect_err("overlap");
        assert_eq!(
            (at, m.starts_with("schedule `nightly`: overlap `queue`")),
            (5, true)
        );
        let mut w = written("0 2 * * *");
        w.catchup_window = Some(("40d".into(), 6));
        assert_eq!(w.check().expect_err("window").0, 6);
        let mut w = written("0 2 * * *");
        w.inputs.0.insert("x".into(), json!("${{ inputs.y }}"));
        let (at, m) = w.check().expect_err("inputs");
        assert!(at == 4 && m.contains("reads `inputs.y`"), "{m}");
    }

    #[test]
    fn a_stored_definition_reads_back_as_written() {
        let f = written("0 2 * * *").check().expect("valid");
        let back =
            Fields::of_definition("nightly", &Json::Object(f.definition())).expect("reads back");
        assert_eq!(
            (back.cron, back.timezone, back.overlap, back.catchup),
            (f.cron, f.timezone, f.overlap, f.catchup)
        );
        let e = Fields::of_definition("nightly", &json!({})).expect_err("no cron");
        assert!(e.contains("no cron"), "{e}");
    }

    #[test]
    fn inputs_read_only_the_schedule() {
        let mut inputs = Map::new();
        inputs.insert("date".into(), json!("${{ schedule.time }}"));
        inputs.insert("tags".into(), json!(["x", "${{ schedule.id }}"]));
        assert!(check_inputs(&inputs).is_ok());
        let mut bad = Map::new();
        bad.insert("x".into(), json!("${{ inputs.y }}"));
        let e = check_inputs(&bad).expect_err("reads inputs");
        assert!(e.contains("reads `inputs.y`"), "{e}");
    }
}

//! One JSON object per stderr line, shaped like flow's `tracing` JSON lines (flattened:
//! `{"timestamp", "level", "message", …fields, "target"}`), for the lines flow
//! prints itself (results, hints, progress) when `--log-format json` is on: a log
//! collector then parses every line, not only the ones `tracing` wrote.

use serde_json::{Map, Value};

/// The line's level from its text: `error: …` is ERROR, `warning: …` WARN, else INFO.
pub fn level_of(message: &str) -> &'static str {
    if message.starts_with("error") {
        "ERROR"
    } else if message.starts_with("warning") {
        "WARN"
    } else {
        "INFO"
    }
}

/// The JSON text of one line (no trailing newline). `fields` are added beside the
/// message (they must be an object; anything else is ignored).
pub fn render(target: &str, message: &str, fields: Value) -> String {
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let mut all = Map::new();
    all.insert("timestamp".into(), Value::String(now.to_rfc3339()));
    all.insert("level".into(), Value::String(level_of(message).into()));
    all.insert("message".into(), Value::String(message.to_string()));
    if let Value::Object(extra) = fields {
        all.extend(extra);
    }
    all.insert("target".into(), Value::String(target.to_string()));
    Value::Object(all).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lines_parse_and_carry_their_level() {
        let v: Value =
            serde_json::from_str(&render("flow", "error: no such run", json!({"run": "r1"})))
                .expect("json");
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["message"], "error: no such run");
        assert_eq!(v["run"], "r1");
        assert_eq!(level_of("warning: x"), "WARN");
        assert_eq!(level_of("run r1 succeeded"), "INFO");
    }
}

//! From the span-annotated YAML tree to the workflow model, collecting every problem.
//!
//! Each converter reports what is wrong at the exact key or value and keeps going with a
//! best-effort value, so one pass finds all the problems of a file. This file holds the
//! collector ([`Cx`]) and its checks of a mapping's shape; the converters live in the
//! files named for what they read: [`root`] (the top level, inputs, defaults), [`tools`],
//! [`nodes`], [`values`] (strings, booleans, numbers, durations, templates), with the
//! accepted keys in [`keys`] and the naming rules in [`names`].

mod condition;
mod for_each;
mod inputs;
mod keys;
mod names;
mod nodes;
mod reconcile;
mod root;
mod schedules;
mod tools;
mod values;
mod waits;

use crate::workflow::diagnostic::{Diagnostic, Pos, did_you_mean};
use crate::workflow::yaml::{Key, Node, Value};

pub use names::{CONNECTION_NAME_HELP, is_connection_name, is_node_id, reserved_retry_suffix};
pub(crate) use root::workflow;
pub use values::parse_duration;

/// Collects diagnostics while converting.
pub(crate) struct Cx {
    pub(crate) diags: Vec<Diagnostic>,
    /// Every tool name declared, valid or not, so a node using a broken tool is not also
    /// told the tool does not exist.
    pub(crate) declared_tools: Vec<String>,
}

impl Cx {
    pub(crate) fn error(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.push(Diagnostic::new(pos, message.into()));
    }

    fn error_help(&mut self, pos: Pos, message: impl Into<String>, help: impl Into<String>) {
        self.diags
            .push(Diagnostic::new(pos, message.into()).with_help(help));
    }

    fn map<'a>(&mut self, node: &'a Node, what: &str) -> Option<&'a [(Key, Node)]> {
        match &node.value {
            Value::Map(entries) => {
                self.check_duplicates(entries, what);
                Some(entries)
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a mapping, found {}", node.type_name()),
                );
                None
            }
        }
    }

    /// Reports repeated keys of one mapping, naming them for what they are.
    fn check_duplicates(&mut self, entries: &[(Key, Node)], what: &str) {
        let mut first: std::collections::HashMap<&str, Pos> =
            std::collections::HashMap::with_capacity(entries.len());
        for (key, _) in entries {
            let Some(first_pos) = first.get(key.name.as_str()).copied() else {
                first.insert(&key.name, key.pos);
                continue;
            };
            let message = match what {
                "`nodes`" => format!("duplicate node id `{}`", key.name),
                "`tools`" => format!("duplicate tool `{}`", key.name),
                _ => format!("duplicate key `{}` in {what}", key.name),
            };
            self.error_help(
                key.pos,
                message,
                format!("`{}` is first defined at line {}", key.name, first_pos.line),
            );
        }
    }

    /// Reports duplicate keys anywhere under a free-form value (`default:`, `with:`).
    fn check_duplicates_deep(&mut self, node: &Node, what: &str) {
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            match &n.value {
                Value::Map(entries) => {
                    self.check_duplicates(entries, what);
                    stack.extend(entries.iter().map(|(_, v)| v));
                }
                Value::Seq(items) => stack.extend(items.iter()),
                _ => {}
            }
        }
    }

    /// Reports keys outside `allowed`, suggesting the nearest allowed one.
    fn check_keys(&mut self, entries: &[(Key, Node)], allowed: &[&[&str]], context: &str) {
        for (key, _) in entries {
            if allowed.iter().any(|set| set.contains(&key.name.as_str())) {
                continue;
            }
            let all = allowed.iter().flat_map(|s| s.iter().copied());
            let message = format!("unknown key `{}` in {context}", key.name);
            match did_you_mean(&key.name, all) {
                Some(near) => self.error_help(key.pos, message, format!("did you mean `{near}`?")),
                None => {
                    let list: Vec<&str> = allowed.iter().flat_map(|s| s.iter().copied()).collect();
                    self.error_help(
                        key.pos,
                        message,
                        format!("allowed keys: {}", list.join(", ")),
                    );
                }
            }
        }
    }
}

fn get<'a>(entries: &'a [(Key, Node)], name: &str) -> Option<&'a Node> {
    entries.iter().find(|(k, _)| k.name == name).map(|(_, v)| v)
}

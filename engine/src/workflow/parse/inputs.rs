//! `inputs:` mappings — a workflow's, and an approval's (what approvers give): names,
//! types, whether required, defaults, descriptions.

use super::keys::INPUT_KEYS;
use super::names::is_identifier;
use super::{Cx, get};
use crate::workflow::diagnostic::did_you_mean;
use crate::workflow::model::{InputDecl, InputType};
use crate::workflow::yaml::Node;

/// An `inputs:` mapping: names, types, defaults.
pub(super) fn inputs(cx: &mut Cx, node: &Node) -> Vec<InputDecl> {
    let Some(entries) = cx.map(node, "`inputs`") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, spec) in entries {
        let what = format!("input `{}`", key.name);
        if !is_identifier(&key.name) {
            cx.error(
                key.pos,
                format!("{what}: input names must be identifiers (letters, digits, `_`)"),
            );
        }
        let Some(fields) = cx.map(spec, &what) else {
            continue;
        };
        cx.check_keys(fields, &[INPUT_KEYS], &what);
        let ty = match get(fields, "type") {
            Some(t) => match cx.string(t, &format!("{what} `type`")) {
                Some(name) => match InputType::parse(&name) {
                    Some(ty) => Some(ty),
                    None => {
                        let hint = did_you_mean(&name, InputType::NAMES).map_or_else(
                            || format!("types are: {}", InputType::NAMES.join(", ")),
                            |n| format!("did you mean `{n}`?"),
                        );
                        cx.error_help(t.pos, format!("unknown type `{name}` for {what}"), hint);
                        None
                    }
                },
                None => None,
            },
            None => {
                cx.error_help(
                    key.pos,
                    format!("{what} has no `type`"),
                    format!("add `type:` ({})", InputType::NAMES.join(", ")),
                );
                None
            }
        };
        let required = get(fields, "required")
            .and_then(|n| cx.bool(n, "`required`"))
            .unwrap_or(false);
        let default = get(fields, "default").map(|d| {
            cx.check_duplicates_deep(d, "`default`");
            cx.constant(d, &format!("the default of {what}"));
            (d.pos, d.to_json())
        });
        if let (Some(ty), Some((pos, value))) = (ty, &default)
            && !ty.accepts(value)
        {
            cx.error(
                *pos,
                format!("the default of {what} is not of type {}", ty.name()),
            );
        }
        let description = get(fields, "description").and_then(|n| cx.text(n, "`description`"));
        if let Some(ty) = ty {
            out.push(InputDecl {
                name: key.name.clone(),
                ty,
                required,
                default: default.map(|(_, v)| v),
                description,
            });
        }
    }
    out
}

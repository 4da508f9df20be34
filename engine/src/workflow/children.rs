//! Sub-workflows: the files a workflow's `workflow:` nodes name, read, validated and
//! carried with it.
//!
//! A child is found in the text's own `included:` (a stored run's text carries every
//! sub-workflow, so a daemon on another host or a resume after the files changed runs
//! what was submitted) or, for a workflow read from a file, on disk relative to that
//! file. Each child is validated as a workflow of its own (its own sub-workflows
//! included), its inputs are checked against the node's `with`, and a workflow that
//! includes itself, directly or not, is refused. The text a run stores is the file's
//! with `included:` appended ([`bundle`]); each included text is itself whole.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;

use super::diagnostic::{Diagnostic, Pos};
use super::expr::TValue;
use super::model::NodeDecl;
use super::{ValidWorkflow, ValidateOptions};

/// Most levels of sub-workflows under one workflow.
pub const MAX_DEPTH: usize = 8;

/// Where a workflow's sub-workflows are read from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A file in this directory: its `included:` first, then the disk.
    Dir(PathBuf),
    /// Text alone (a stored run's, the API's): its `included:` only.
    Text,
}

/// A sub-workflow, read and validated: what its node starts runs of.
#[derive(Debug, Clone)]
pub struct Child {
    /// The path as the node names it.
    pub path: String,
    /// The child workflow.
    pub workflow: ValidWorkflow,
    /// The text a run of it stores (its own sub-workflows included).
    pub text: String,
}

/// Reads and validates the sub-workflow of every `workflow:` node of `wf`; node id →
/// child. `stack` holds the identities of the files that include `wf` (and `wf`'s).
pub(crate) fn resolve(
    wf: &ValidWorkflow,
    origin: &Origin,
    stack: &mut Vec<String>,
    opts: &ValidateOptions,
) -> Result<HashMap<String, Arc<Child>>, Vec<Diagnostic>> {
    let mut out = HashMap::new();
    let mut by_path: HashMap<String, Arc<Child>> = HashMap::new();
    let mut diags = Vec::new();
    for node in &wf.nodes {
        let Some(decl) = node.child() else {
            continue;
        };
        let child = match by_path.get(&decl.path) {
            Some(c) => Ok(c.clone()),
            None => load(wf, &decl.path, decl.pos, origin, stack, opts).map(Arc::new),
        };
        match child {
            Ok(child) => {
                check_with(node, &child.workflow, &mut diags);
                by_path.insert(decl.path.clone(), child.clone());
                out.insert(node.id.clone(), child);
            }
            Err(d) => diags.push(d),
        }
    }
    if diags.is_empty() {
        Ok(out)
    } else {
        Err(diags)
    }
}

/// One child: its text (from `included:` or the disk), then its validation.
fn load(
    wf: &ValidWorkflow,
    path: &str,
    pos: Pos,
    origin: &Origin,
    stack: &mut Vec<String>,
    opts: &ValidateOptions,
) -> Result<Child, Diagnostic> {
    let err = |message: String| Diagnostic::new(pos, message);
    if stack.len() > MAX_DEPTH {
        return Err(err(format!(
            "sub-workflows are nested more than {MAX_DEPTH} deep here"
        )));
    }
    let (text, identity, child_origin) = match (wf.included.get(path), origin) {
        (Some(text), _) => (
            text.clone(),
            format!("sha256:{}", flow_ledger::workflow_hash(text)),
            Origin::Text,
        ),
        // A text that carries `included:` carries every sub-workflow it runs: what
        // it stores is what it says, never half of it from the disk.
        (None, Origin::Text) => return Err(not_included(path, pos)),
        (None, Origin::Dir(_)) if !wf.included.is_empty() => {
            return Err(not_included(path, pos));
        }
        (None, Origin::Dir(dir)) => {
            let file = dir.join(path);
            let text = super::read_text(&file).map_err(|e| {
                let why = match e {
                    super::ReadError::Message(m) => m,
                    super::ReadError::Diagnostic(d) => d.message,
                };
                err(format!("sub-workflow `{}`: {why}", file.display()))
            })?;
            let identity = std::fs::canonicalize(&file)
                .map_or_else(|_| file.display().to_string(), |p| p.display().to_string());
            let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
            (text, identity, Origin::Dir(parent))
        }
    };
    if let Some(at) = stack.iter().position(|s| *s == identity) {
        let mut chain: Vec<&str> = stack[at..].iter().map(|s| short(s)).collect();
        chain.push(short(&identity));
        return Err(err(format!(
            "sub-workflow `{path}` includes itself: {}",
            chain.join(" -> ")
        ))
        .with_help("a workflow cannot run itself, directly or through another"));
    }
    let stem = Path::new(path).file_stem().map_or_else(
        || "workflow".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    stack.push(identity);
    let parsed = super::parse_in(&text, path, &stem, opts, &child_origin, stack);
    stack.pop();
    let workflow = parsed.map_err(|d| {
        err(format!(
            "sub-workflow `{path}` does not validate:\n{}",
            d.to_string().trim_end()
        ))
    })?;
    let text = workflow.stored_text(&text).into_owned();
    Ok(Child {
        path: path.to_string(),
        workflow,
        text,
    })
}

/// A sub-workflow a text carrying `included:` does not carry.
fn not_included(path: &str, pos: Pos) -> Diagnostic {
    Diagnostic::new(
        pos,
        format!("sub-workflow `{path}` is not among this text's `included:` files"),
    )
    .with_help(
        "a stored or submitted workflow carries its sub-workflows; run or submit it from its file and flow adds them",
    )
}

/// The file name of an identity (a path, or a text's hash), for the recursion message.
fn short(identity: &str) -> &str {
    identity.rsplit('/').next().unwrap_or(identity)
}

/// The node's `with` against the child's inputs: a mapping, naming only declared
/// inputs, every required input without a default given, literal values of the
/// input's type, and no secret (the child's inputs are stored with its run).
fn check_with(node: &NodeDecl, child: &ValidWorkflow, diags: &mut Vec<Diagnostic>) {
    let pos = node.child().map_or(node.pos, |d| d.pos);
    let entries: &[(String, TValue)] = match &node.with {
        TValue::Map(entries) => entries,
        TValue::Const(Json::Object(m)) if m.is_empty() => &[],
        TValue::Const(Json::Null) => &[],
        _ => {
            diags.push(Diagnostic::new(
                pos,
                format!(
                    "`with` of sub-workflow node `{}` must be a mapping of the child's inputs",
                    node.id
                ),
            ));
            return;
        }
    };
    let secrets = super::expr::secret_names(node.with.templates());
    if !secrets.is_empty() {
        diags.push(
            Diagnostic::new(
                pos,
                format!(
                    "`with` of sub-workflow node `{}` reads secret `{}`: a child's inputs are stored with its run",
                    node.id, secrets[0]
                ),
            )
            .with_help("let the child's own tools read the secret"),
        );
    }
    let given: BTreeMap<&str, &TValue> = entries.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for name in given.keys() {
        if !child.inputs.iter().any(|i| i.name == *name) {
            let mut d = Diagnostic::new(
                pos,
                format!(
                    "`with` of node `{}` gives `{name}`, which workflow `{}` does not declare as an input",
                    node.id, child.name
                ),
            );
            let names = child.inputs.iter().map(|i| i.name.as_str());
            if let Some(near) = super::diagnostic::did_you_mean(name, names) {
                d = d.with_help(format!("did you mean `{near}`?"));
            }
            diags.push(d);
        }
    }
    for input in &child.inputs {
        match given.get(input.name.as_str()) {
            None if input.required && input.default.is_none() => diags.push(Diagnostic::new(
                pos,
                format!(
                    "node `{}` does not give workflow `{}` its required input `{}`",
                    node.id, child.name, input.name
                ),
            )),
            Some(TValue::Const(v)) if !input.ty.accepts(v) => diags.push(Diagnostic::new(
                pos,
                format!(
                    "`with` of node `{}` gives input `{}` {v}, which is not of its declared type `{}`",
                    node.id,
                    input.name,
                    input.ty.name()
                ),
            )),
            _ => {}
        }
    }
}

/// `text` with `included:` appended: each sub-workflow's (whole) text under the path
/// its node names, as JSON strings (valid YAML double-quoted scalars). `text` must be a
/// block mapping, as every workflow file flow accepts with sub-workflows is.
pub(crate) fn bundle<'t>(text: &str, files: impl Iterator<Item = (&'t str, &'t str)>) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("# Added by flow: the sub-workflows this run executes, as they were when it was stored.\nincluded:\n");
    for (path, body) in files {
        out.push_str("  ");
        out.push_str(&Json::String(path.to_string()).to_string());
        out.push_str(": ");
        out.push_str(&Json::String(body.to_string()).to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_reads_back_as_the_same_files() {
        let child = "nodes:\n  a: { tool: t }\n# \"quotes\" \\ and ünïcode\n";
        let text = bundle("name: p\n", [("sub/c.yaml", child)].into_iter());
        let root = crate::workflow::yaml::load(&text).expect("yaml");
        let crate::workflow::yaml::Value::Map(entries) = &root.value else {
            panic!("not a map");
        };
        let (_, included) = entries
            .iter()
            .find(|(k, _)| k.name == "included")
            .expect("included");
        let crate::workflow::yaml::Value::Map(files) = &included.value else {
            panic!("included is not a map");
        };
        assert_eq!(files[0].0.name, "sub/c.yaml");
        assert!(matches!(&files[0].1.value, crate::workflow::yaml::Value::Str(s) if s == child));
    }
}

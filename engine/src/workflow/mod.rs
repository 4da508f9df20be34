//! Workflow files: reading them safely, the model they describe, and validation.
//!
//! [`load_file`] is the one entry point: bytes → limits (size, UTF-8, empty) → YAML tree →
//! model → cross-reference checks. It returns a [`Workflow`] only when the file has no
//! problems at all; otherwise every problem, each with its position.

pub mod children;
pub mod diagnostic;
pub mod expr;
pub mod model;
pub(crate) mod parse;
pub mod schedule_fields;
pub mod ticks;
pub mod tool;
mod valid;
pub mod validate;
pub mod yaml;

use std::path::Path;

pub use diagnostic::{Diagnostic, Diagnostics, Pos};
pub use model::*;
pub use parse::{
    CONNECTION_NAME_HELP, is_connection_name, is_node_id, parse_duration, reserved_retry_suffix,
};
pub use tool::*;
pub use valid::ValidWorkflow;
pub use validate::ValidateOptions;

/// Largest workflow file accepted: 1 MiB keeps parsing time and memory bounded.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// A workflow together with the exact text it was read from; runs keep this snapshot.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file name as given by the user (used in diagnostics).
    pub file: String,
    /// The file's text.
    pub text: String,
}

/// Reads and validates a workflow file, and the sub-workflows it names (relative to
/// it). The returned source's text is what a run stores: the file's, with the
/// sub-workflows' files appended under `included:` when it has any.
pub fn load_file(
    path: &Path,
    opts: &ValidateOptions,
) -> Result<(ValidWorkflow, Source), Diagnostics> {
    let file = path.display().to_string();
    let fail = |message: String| {
        Diagnostics::new(
            file.clone(),
            vec![Diagnostic::new(Pos { line: 1, col: 1 }, message)],
        )
    };
    let text = read_text(path).map_err(|e| match e {
        ReadError::Message(m) => fail(m),
        ReadError::Diagnostic(d) => Diagnostics::new(file.clone(), vec![d]),
    })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let identity =
        std::fs::canonicalize(path).map_or_else(|_| file.clone(), |p| p.display().to_string());
    let origin = children::Origin::Dir(dir);
    let wf = parse_in(
        &text,
        &file,
        &stem_of(&file),
        opts,
        &origin,
        &mut vec![identity],
    )?;
    let text = stored_or_fail(&wf, text, &file, opts)?;
    Ok((wf, Source { file, text }))
}

/// The text a run of `wf` stores ([`ValidWorkflow::stored_text`]), refused past the
/// size a stored text may have.
fn stored_or_fail(
    wf: &ValidWorkflow,
    text: String,
    file: &str,
    opts: &ValidateOptions,
) -> Result<String, Diagnostics> {
    let stored = wf.stored_text(&text);
    if matches!(stored, std::borrow::Cow::Owned(_))
        && stored.len() <= MAX_FILE_BYTES
        && let Err(d) = parse_named(&stored, file, &wf.name, opts)
    {
        // `included:` is appended to the text as is; a file whose shape does not allow
        // that (its root a flow mapping `{…}`, a `...` end marker) is refused here,
        // before a run stores a text nobody could execute.
        return Err(Diagnostics::new(
            file,
            vec![Diagnostic::new(
                Pos { line: 1, col: 1 },
                format!(
                    "with its sub-workflows appended under `included:` the workflow no longer reads back; write its top level as a block mapping (one `key:` per line) without a `...` end marker:\n{}",
                    d.to_string().trim_end()
                ),
            )],
        ));
    }
    if stored.len() > MAX_FILE_BYTES {
        return Err(Diagnostics::new(
            file,
            vec![Diagnostic::new(
                Pos { line: 1, col: 1 },
                format!(
                    "with its sub-workflows the workflow is {} bytes, over the {MAX_FILE_BYTES} bytes (1 MiB) a run may store",
                    stored.len()
                ),
            )],
        ));
    }
    Ok(stored.into_owned())
}

/// Why [`read_text`] could not give a file's text.
pub(crate) enum ReadError {
    /// About the file as a whole (size, a directory, I/O).
    Message(String),
    /// At a position in it (invalid UTF-8).
    Diagnostic(Diagnostic),
}

/// A workflow file's text: bounded whatever the path names (`/dev/zero` or a FIFO
/// report no size and stream without end, so the limit is enforced while reading,
/// `read_limited`), UTF-8, without a byte-order mark.
pub(crate) fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = match crate::read_limited::read(path, MAX_FILE_BYTES as u64) {
        Ok(bytes) => bytes,
        Err(crate::read_limited::Error::TooLarge { .. }) => {
            let limit = format!("workflow files are limited to {MAX_FILE_BYTES} bytes (1 MiB)");
            let message = match std::fs::metadata(path) {
                Ok(m) if m.is_file() => format!("the file is {} bytes; {limit}", m.len()),
                _ => format!("{limit}; reading stopped past that"),
            };
            return Err(ReadError::Message(message));
        }
        Err(crate::read_limited::Error::IsDirectory { .. }) => {
            return Err(ReadError::Message(
                "is a directory, not a workflow file".to_string(),
            ));
        }
        Err(crate::read_limited::Error::Io { source, .. }) => {
            return Err(ReadError::Message(format!(
                "cannot read the file: {source}"
            )));
        }
    };
    decode(&bytes).map_err(ReadError::Diagnostic)
}

fn stem_of(file: &str) -> String {
    Path::new(file).file_stem().map_or_else(
        || "workflow".to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// Reads a workflow from standard input (`flow validate -`), bounded like a file, and
/// validates it under the name `<stdin>`.
pub fn load_stdin(opts: &ValidateOptions) -> Result<(ValidWorkflow, Source), Diagnostics> {
    use std::io::Read;
    let file = "<stdin>".to_string();
    let fail = |message: String| {
        Diagnostics::new(
            file.clone(),
            vec![Diagnostic::new(Pos { line: 1, col: 1 }, message)],
        )
    };
    let mut bytes = Vec::new();
    let limit = MAX_FILE_BYTES as u64;
    if let Err(e) = std::io::stdin()
        .lock()
        .take(limit + 1)
        .read_to_end(&mut bytes)
    {
        return Err(fail(format!("cannot read standard input: {e}")));
    }
    if bytes.len() > MAX_FILE_BYTES {
        return Err(fail(format!(
            "workflow files are limited to {MAX_FILE_BYTES} bytes (1 MiB); reading stopped past that"
        )));
    }
    let text = decode(&bytes).map_err(|d| Diagnostics::new(file.clone(), vec![d]))?;
    // Sub-workflows of a workflow read from standard input are relative to the
    // current directory.
    let origin = children::Origin::Dir(std::path::PathBuf::from("."));
    let wf = parse_in(&text, &file, "workflow", opts, &origin, &mut Vec::new())?;
    let text = stored_or_fail(&wf, text, &file, opts)?;
    Ok((wf, Source { file, text }))
}

/// Validates workflow text (already read) under the name `file`.
pub fn parse_str(text: &str, file: &str) -> Result<ValidWorkflow, Diagnostics> {
    parse_with(text, file, &ValidateOptions::default())
}

/// Validates workflow text with options; a workflow without `name:` is named after the
/// file's stem.
pub fn parse_with(
    text: &str,
    file: &str,
    opts: &ValidateOptions,
) -> Result<ValidWorkflow, Diagnostics> {
    parse_named(text, file, &stem_of(file), opts)
}

/// [`parse_with`] with the name a workflow without `name:` gets. A run's stored text is
/// re-parsed under the name it was submitted with: that name keys the tools' rate limits
/// and quotas (`<workflow>/<tool>`), so a resume or a daemon must see the same one as the
/// process that started the run — not the snapshot's label.
///
/// Text holds its sub-workflows under `included:` (as a stored run's does); it never
/// reads them from disk.
pub fn parse_named(
    text: &str,
    file: &str,
    default_name: &str,
    opts: &ValidateOptions,
) -> Result<ValidWorkflow, Diagnostics> {
    parse_in(
        text,
        file,
        default_name,
        opts,
        &children::Origin::Text,
        &mut Vec::new(),
    )
}

/// [`parse_named`] with where the sub-workflows come from and the files that include
/// this one (`stack`, to refuse recursion).
pub(crate) fn parse_in(
    text: &str,
    file: &str,
    default_name: &str,
    opts: &ValidateOptions,
    origin: &children::Origin,
    stack: &mut Vec<String>,
) -> Result<ValidWorkflow, Diagnostics> {
    if text.len() > MAX_FILE_BYTES {
        return Err(Diagnostics::new(
            file,
            vec![Diagnostic::new(
                Pos { line: 1, col: 1 },
                format!("workflow text is limited to {MAX_FILE_BYTES} bytes (1 MiB)"),
            )],
        ));
    }
    if text.trim().is_empty() {
        return Err(Diagnostics::new(
            file,
            vec![
                Diagnostic::new(Pos { line: 1, col: 1 }, "the file is empty".to_string())
                    .with_help(
                        "a workflow needs at least `tools:` and `nodes:`; see workflows/hello.yaml",
                    ),
            ],
        ));
    }
    let root = yaml::load(text).map_err(|d| Diagnostics::new(file, vec![d]))?;
    let mut cx = parse::Cx {
        diags: Vec::new(),
        declared_tools: Vec::new(),
    };
    let wf = parse::workflow(&mut cx, &root, default_name);
    let plan = validate::check(&wf, opts, &cx.declared_tools, &mut cx.diags);
    match plan {
        Some(plan) if cx.diags.is_empty() => {
            let mut valid = ValidWorkflow::new(wf, plan);
            if valid.nodes.iter().any(|n| n.child().is_some()) {
                let found = children::resolve(&valid, origin, stack, opts)
                    .map_err(|d| Diagnostics::new(file, d))?;
                valid.set_children(found);
            }
            Ok(valid)
        }
        _ => Err(Diagnostics::new(file, cx.diags)),
    }
}

/// UTF-8 decoding that reports where the first bad byte is.
fn decode(bytes: &[u8]) -> Result<String, Diagnostic> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.strip_prefix('\u{feff}').unwrap_or(text).to_string()),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
            let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let col = String::from_utf8_lossy(&valid[line_start..])
                .chars()
                .count()
                + 1;
            Err(Diagnostic::new(
                Pos {
                    line: u32::try_from(line).unwrap_or(u32::MAX),
                    col: u32::try_from(col).unwrap_or(u32::MAX),
                },
                format!(
                    "the file is not valid UTF-8 (byte {} is invalid)",
                    e.valid_up_to()
                ),
            )
            .with_help("save the file as UTF-8"))
        }
    }
}

#[cfg(test)]
mod tests;

//! Local programs: argv (no shell), `with` as JSON on stdin, JSON or text on stdout.
//!
//! - The environment is cleared; only the names in [`Spec::env_allow`] are inherited
//!   from flow's own environment, plus the tool's declared [`Spec::env`] — the only way
//!   secrets reach a command.
//! - The child runs as the leader of its own process group. When it exits, or the call
//!   times out, the whole group is killed with `SIGKILL` (so a script's background
//!   children cannot outlive the step or hold its stdout open) and the child is reaped.
//! - Classification: spawn failure (not found, not executable, bad cwd) → `NotSent`
//!   (nothing ran); exit 0 → output; non-zero exit or death by a signal flow did not
//!   send → `Permanent` with the exit code and the last 2 KiB of stderr; timeout →
//!   `Unknown` (the command may have acted); stdout beyond [`Spec::max_output_bytes`] →
//!   `Permanent` naming the cap.
//! - Output: stdout, trimmed, parsed as JSON when it is JSON, else returned as a
//!   string (empty output is the empty string).
//! - `requests_sent` is 1 once the program started, 0 when it could not be started.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::error::tail;
use crate::process::Group;
use crate::{BoxFuture, Call, Error, Outcome, SideEffect, Tool};

/// Environment variables a command inherits unless its spec says otherwise: enough to
/// find programs and format text, nothing that could carry a credential.
pub const DEFAULT_ENV_ALLOW: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// Default cap on a command's stdout, so a runaway program cannot exhaust memory or
/// the ledger.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// How much of stderr is kept for error messages.
const STDERR_TAIL_BYTES: usize = 2048;

/// A command tool as declared by a workflow, with values already rendered.
#[derive(Clone, PartialEq, Eq)]
pub struct Spec {
    /// Program and arguments. The program is looked up on the child's `PATH` when it
    /// has no `/`.
    pub argv: Vec<String>,
    /// Declared environment (values rendered, secrets included).
    pub env: Vec<(String, String)>,
    /// Working directory; flow's own when `None`.
    pub cwd: Option<PathBuf>,
    /// Names inherited from flow's environment ([`DEFAULT_ENV_ALLOW`] by default).
    pub env_allow: Vec<String>,
    /// Cap on stdout ([`DEFAULT_MAX_OUTPUT_BYTES`] by default).
    pub max_output_bytes: usize,
}

impl Spec {
    /// A spec running `argv` with the default allow-list and cap.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Spec {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
            env_allow: DEFAULT_ENV_ALLOW.iter().map(|s| s.to_string()).collect(),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec")
            .field("argv", &self.argv)
            .field("env", &crate::redact::Pairs(&self.env))
            .field("cwd", &self.cwd)
            .field("env_allow", &self.env_allow)
            .field("max_output_bytes", &self.max_output_bytes)
            .finish()
    }
}

/// Runs one [`Spec`] per call.
#[derive(Debug, Clone)]
pub struct CommandTool {
    spec: Spec,
}

impl CommandTool {
    /// A tool for `spec`.
    pub fn new(spec: Spec) -> Self {
        CommandTool { spec }
    }

    /// The program's environment and working directory.
    fn environment(&self, command: &mut tokio::process::Command, call: &Call) {
        for name in &self.spec.env_allow {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        // The call's trace, as OpenTelemetry's environment carrier names it: over what
        // `env_allow` passed on from flow's own environment, under the spec's `env`
        // (the workflow wins, as with an HTTP tool's headers).
        if let Some(trace) = &call.trace {
            command.env("TRACEPARENT", &trace.parent);
            match &trace.state {
                Some(state) => command.env("TRACESTATE", state),
                None => command.env_remove("TRACESTATE"),
            };
        }
        command.envs(self.spec.env.iter().map(|(k, v)| (k, v)));
        if let Some(cwd) = &self.spec.cwd {
            command.current_dir(cwd);
        }
    }

    async fn run(&self, call: Call) -> Outcome {
        let Some(program) = self.spec.argv.first() else {
            return Outcome::err(Error::permanent("command: `argv` is empty"), 0);
        };
        if call.timeout.is_zero() {
            return Outcome::err(Error::permanent("command: the timeout must be positive"), 0);
        }
        let mut input = match serde_json::to_vec(&call.args) {
            Ok(bytes) => bytes,
            Err(e) => return Outcome::err(Error::permanent(format!("command: {e}")), 0),
        };
        input.push(b'\n');

        let mut command = tokio::process::Command::new(program);
        command
            .args(&self.spec.argv[1..])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        self.environment(&mut command, &call);
        // The last moment before anything of the call can happen (`crate::fence`).
        if let Err(why) = call.fence.check() {
            return Outcome::err(Error::fenced(why, &format!("command `{program}`"), 0), 0);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let message = format!("cannot start `{program}`: {e}");
                return Outcome::err(Error::not_sent(message), 0);
            }
        };
        let group = Group::of(child.id());
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr_pipe = child.stderr.take();
        let cap = self.spec.max_output_bytes;

        let work = async {
            let write = async {
                if let Some(mut stdin) = stdin {
                    // A program that ignores stdin closes it: EPIPE is not a failure.
                    let _ = stdin.write_all(&input).await;
                }
            };
            let read_out = read_capped(stdout, cap, &group);
            let read_err = read_tail(stderr_pipe, &stderr);
            let wait = async {
                let status = child.wait().await;
                // The leader is done: stragglers in its group would hold stdout open.
                group.kill();
                status
            };
            let ((), out, (), status) = tokio::join!(write, read_out, read_err, wait);
            (out, status)
        };
        let finished = tokio::time::timeout(call.timeout, work).await;
        let stderr_tail = || {
            tail(
                &stderr.lock().unwrap_or_else(|e| e.into_inner()),
                STDERR_TAIL_BYTES,
            )
        };
        let (out, status) = match finished {
            Ok(done) => done,
            Err(_) => {
                group.kill();
                let _ = child.wait().await;
                let mut message = format!(
                    "`{program}` timed out after {}ms; its process group was killed (the command may have acted)",
                    call.timeout.as_millis()
                );
                append_stderr(&mut message, &stderr_tail());
                return Outcome::err(Error::unknown(message), 1);
            }
        };
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                let message = format!("waiting for `{program}` failed: {e}");
                return Outcome::err(Error::unknown(message), 1);
            }
        };
        let stdout = match out {
            Ok(bytes) => bytes,
            Err(OutputError::TooLarge) => {
                let message = format!(
                    "`{program}` wrote more than the {cap}-byte stdout cap (max_output_bytes); it was killed"
                );
                return Outcome::err(Error::permanent(message), 1);
            }
            Err(OutputError::Io(e)) => {
                let message = format!("reading the stdout of `{program}` failed: {e}");
                return Outcome::err(Error::unknown(message), 1);
            }
        };
        if !status.success() {
            let mut message = format!("`{program}` {}", describe(status));
            append_stderr(&mut message, &stderr_tail());
            return Outcome::err(Error::permanent(message), 1);
        }
        Outcome::ok(parse_output(&stdout), 1)
    }
}

impl Tool for CommandTool {
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.run(call))
    }

    /// Commands can do anything: an unknown outcome is in doubt.
    fn side_effect(&self) -> SideEffect {
        SideEffect::NotIdempotent
    }
}

/// Trimmed stdout as JSON when it parses, else as a string.
fn parse_output(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended with {status}"),
    }
}

fn append_stderr(message: &mut String, stderr: &str) {
    if !stderr.is_empty() {
        message.push_str("; stderr: ");
        message.push_str(stderr);
    }
}

enum OutputError {
    TooLarge,
    Io(std::io::Error),
}

/// Reads all of `pipe`, killing the group and failing once it passes `cap` bytes.
async fn read_capped(
    pipe: Option<impl AsyncRead + Unpin>,
    cap: usize,
    group: &Group,
) -> Result<Vec<u8>, OutputError> {
    let Some(mut pipe) = pipe else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = pipe.read(&mut buf).await.map_err(OutputError::Io)?;
        if n == 0 {
            return Ok(out);
        }
        if out.len() + n > cap {
            group.kill();
            return Err(OutputError::TooLarge);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Reads all of `pipe`, keeping only its last [`STDERR_TAIL_BYTES`] in `keep`.
async fn read_tail(pipe: Option<impl AsyncRead + Unpin>, keep: &Mutex<Vec<u8>>) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buf = vec![0_u8; 8 * 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let mut kept = keep.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend_from_slice(&buf[..n]);
        let excess = kept.len().saturating_sub(STDERR_TAIL_BYTES * 2);
        if excess > 0 {
            kept.drain(..excess);
        }
    }
}

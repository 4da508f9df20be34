//! Real test servers for flow's tests (feature `testkit`; never in the `flow` binary).
//!
//! Tests of the at-most-once contract need downstreams that count what they receive,
//! so that "sent once" is checked at the receiving end rather than inferred. Everything
//! here listens on loopback and runs in the test's process or as the `flow-testkit`
//! binary, which tests of the `flow` binary start as a child process.
//!
//! - [`http::CountingServer`]: counts requests per `Idempotency-Key`, and per path can
//!   echo, answer a status, fail N times, hold, drop the connection mid-response,
//!   redirect or send a large body. Configurable from the test process and, through
//!   `POST /_control/set`, from any process ([`http::Remote`]).
//! - [`mcp`]: an rmcp MCP server with counting tools, over stdio (the binary) and
//!   streamable HTTP ([`mcp::HttpServer`], in-process or the binary), with an OAuth
//!   mode that challenges for a scope until a token from its own `/token` carries it.
//! - [`bin_path`]: where the `flow-testkit` binary is, building it once if needed.
//! - [`flags`]: `CI` and `FLOW_BLESS`, read by one rule in every crate's tests.
//!
//! # The `flow-testkit` binary
//!
//! ```text
//! flow-testkit http [--addr 127.0.0.1:8080] [--log-file F] [--print-url]
//!     the CountingServer; --log-file appends one fsynced JSON line per arrived and
//!     per completed request ({"event":"arrived"|"completed","seq",…}), so the record
//!     outlives crashes of the process under test
//! flow-testkit mcp-stdio [--count-file F]
//!     the MCP test server on stdin/stdout; --count-file gets one JSON line per
//!     initialize and per tool call ({"event":"initialize"|"call","tool","key","pid"})
//! flow-testkit mcp-http [--addr 127.0.0.1:0] [--print-url] [--count-file F]
//!                       [--auth-scope S [--client-id ID] [--client-secret S] [--challenge-status 401|403]]
//!     the MCP test server over streamable HTTP at /mcp, token endpoint at /token
//! ```
//! `--print-url` prints the base URL (`http://127.0.0.1:PORT`, or `…/mcp` for
//! `mcp-http`) as the first line of stdout once the server listens, so a parent can bind
//! port 0 and read where it landed. The servers run until killed.
//!
//! Example workflows (`workflows/`) use `flow-testkit http --addr 127.0.0.1:8080`.

pub mod flags;
pub mod http;
mod http_remote;
pub mod mcp;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::oneshot;

/// The `flow-testkit` binary next to the running test executable
/// (`…/target/<profile>/deps/<test>` → `…/target/<profile>/flow-testkit`), built with
/// `cargo build -p flow-adapters --features testkit --bin flow-testkit` the first time
/// it is missing (once per process, even when tests run concurrently).
///
/// Panics when the binary cannot be found or built: that is a broken test setup, and
/// the panic message says what to run.
pub fn bin_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(locate_or_build).clone()
}

fn locate_or_build() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let mut profile_dir = exe
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("test executable {} has no parent", exe.display()));
    if profile_dir.ends_with("deps") {
        profile_dir.pop();
    }
    let binary = profile_dir.join("flow-testkit");
    if binary.is_file() {
        return binary;
    }
    let target_dir = profile_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir.clone());
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut command = std::process::Command::new(cargo);
    command
        .args(["build", "--manifest-path", manifest])
        .args([
            "-p",
            "flow-adapters",
            "--features",
            "testkit",
            "--bin",
            "flow-testkit",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    if release {
        command.arg("--release");
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("running cargo to build flow-testkit: {e}"));
    assert!(
        status.success() && binary.is_file(),
        "building flow-testkit failed ({status}); run `cargo build -p flow-adapters --features testkit --bin flow-testkit`"
    );
    binary
}

/// A server task that stops like a real server process would: the listener closes,
/// idle keep-alive connections are closed, and `before_stop` runs (the MCP server uses
/// it to end its sessions and event streams). Dropping it stops the server without
/// waiting; [`Running::shutdown`] waits.
pub(crate) struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    before_stop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Running {
    /// Serves `router` on `listener` until stopped.
    pub(crate) fn serve(
        listener: tokio::net::TcpListener,
        router: axum::Router,
        before_stop: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let signal = async move {
                let _ = stopped.await;
            };
            // TCP_NODELAY, as a real server is set up: otherwise a response written in
            // parts waits on the client's delayed ACK (40 ms on Linux).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(signal)
                .await
            {
                tracing::warn!("test server stopped: {e}");
            }
        });
        Running {
            stop: Some(stop),
            task: Some(task),
            before_stop,
        }
    }

    fn signal(&mut self) {
        if let Some(before_stop) = self.before_stop.take() {
            before_stop();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops and waits (at most 5 s; requests still held after that are abandoned).
    pub(crate) async fn shutdown(mut self) {
        self.signal();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal();
    }
}

//! Logs on stderr, text or JSON, with secret values scrubbed from every line.
//!
//! Any library may log a request (at `RUST_LOG=trace` many do); rather than trust each,
//! every formatted line passes through [`Secrets::scrub`] before it reaches stderr.

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use super::LogFormat;
use crate::secrets::Secrets;

/// Default filter when `RUST_LOG` is unset: warnings, and none of rmcp's ERROR lines for
/// auth challenges that flow handles itself.
const DEFAULT_FILTER: &str = "warn,rmcp=off";

/// A writer that buffers one log line and writes it scrubbed when dropped.
pub struct Scrubbed {
    secrets: Secrets,
    buf: Vec<u8>,
}

impl Write for Scrubbed {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Scrubbed {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.buf);
        let _ = std::io::stderr()
            .lock()
            .write_all(self.secrets.scrub(&text).as_bytes());
    }
}

/// Makes [`Scrubbed`] writers.
#[derive(Clone)]
pub struct MakeScrubbed {
    secrets: Secrets,
}

impl<'a> MakeWriter<'a> for MakeScrubbed {
    type Writer = Scrubbed;

    fn make_writer(&'a self) -> Self::Writer {
        Scrubbed {
            secrets: self.secrets.clone(),
            buf: Vec::new(),
        }
    }
}

/// Installs the global subscriber (once per process; later calls are no-ops).
pub fn init(format: LogFormat, secrets: &Secrets) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let writer = MakeScrubbed {
        secrets: secrets.clone(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

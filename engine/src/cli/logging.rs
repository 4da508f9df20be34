//! Logs on stderr, text or JSON, with secret values scrubbed from every line.
//!
//! Any library may log a request (at `RUST_LOG=trace` many do); rather than trust each,
//! every formatted line passes through [`Secrets::scrub`] before it reaches stderr.
//!
//! A line is scrubbed whole: tracing's formatter makes one writer per event and may
//! write the line in several pieces, so a secret can be split over two writes; the
//! writer therefore buffers every piece and scrubs once, when the event is done (drop).
//! A JSON line that holds a secret is decoded, scrubbed string by string and encoded
//! again, so it stays one valid JSON document (a textual stand-in would add unescaped
//! quotes); its keys then come out sorted.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::LogFormat;
use crate::secrets::Secrets;
use crate::telemetry::{Process, TelemetryConfig};

/// Default filter when `RUST_LOG` is unset: warnings, and none of rmcp's ERROR lines for
/// auth challenges that flow handles itself.
const DEFAULT_FILTER: &str = "warn,rmcp=off";

/// A writer that buffers one log line and writes it scrubbed when dropped.
pub struct Scrubbed {
    secrets: Secrets,
    json: bool,
    buf: Vec<u8>,
    out: Box<dyn Write + Send>,
}

impl Scrubbed {
    /// The buffered line, scrubbed.
    fn scrubbed(&self) -> Vec<u8> {
        if !self.secrets.finds(&self.buf) {
            return self.buf.clone();
        }
        if self.json {
            let line = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) {
                let mut out = self.secrets.scrub_json(&value).to_string().into_bytes();
                out.push(b'\n');
                return out;
            }
        }
        self.secrets.scrub_bytes(&self.buf)
    }
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
        let line = self.scrubbed();
        let _ = self.out.write_all(&line);
        let _ = self.out.flush();
    }
}

/// Makes [`Scrubbed`] writers.
#[derive(Clone)]
pub struct MakeScrubbed {
    secrets: Secrets,
    json: bool,
}

impl<'a> MakeWriter<'a> for MakeScrubbed {
    type Writer = Scrubbed;

    fn make_writer(&'a self) -> Self::Writer {
        Scrubbed {
            secrets: self.secrets.clone(),
            json: self.json,
            buf: Vec::new(),
            out: Box::new(std::io::stderr()),
        }
    }
}

/// Installs the global subscriber (once per process; later calls are no-ops): log lines
/// on stderr as `RUST_LOG` (default [`DEFAULT_FILTER`]) says, and with `telemetry`'s
/// endpoint configured, flow's spans exported over OTLP (`crate::telemetry`). Each has
/// its own filter, so `RUST_LOG=warn` does not silence the traces.
pub fn init(format: LogFormat, secrets: &Secrets, telemetry: &TelemetryConfig, process: Process) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let writer = MakeScrubbed {
        secrets: secrets.clone(),
        json: matches!(format, LogFormat::Json),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(false);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => Box::new(fmt.with_filter(filter)),
        LogFormat::Json => Box::new(
            fmt.json()
                .flatten_event(true)
                .with_current_span(true)
                .with_filter(filter),
        ),
    };
    let (traces, refused) = match crate::telemetry::layer(telemetry, secrets, process) {
        Ok(layer) => (layer, None),
        Err(why) => (None, Some(why)),
    };
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .is_ok();
    if let (true, Some(why)) = (installed, refused) {
        tracing::warn!("telemetry is off: {why}");
    }
}

/// The command's own stderr (results, hints, errors) in `--log-format json`: every line
/// written through it leaves as one JSON object (`crate::json_line`), so every line on
/// stderr parses. A last line without its newline is written when this is dropped.
pub struct JsonLines<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
}

impl<'a> JsonLines<'a> {
    /// Wraps the process's stderr writer.
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self {
            out,
            buf: Vec::new(),
        }
    }

    fn emit(&mut self, line: &[u8]) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.trim().is_empty() {
            return Ok(());
        }
        let json = crate::json_line::render("flow", text, serde_json::Value::Null);
        writeln!(self.out, "{json}")
    }
}

impl Write for JsonLines<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        while let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=at).collect();
            self.emit(&line)?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Drop for JsonLines<'_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            let _ = self.emit(&rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink the test can read after the writer is dropped.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(secrets: &Secrets, json: bool, pieces: &[&[u8]]) -> String {
        let sink = Sink::default();
        {
            let mut w = Scrubbed {
                secrets: secrets.clone(),
                json,
                buf: Vec::new(),
                out: Box::new(sink.clone()),
            };
            for piece in pieces {
                w.write_all(piece).expect("write");
            }
        }
        let bytes = sink.0.lock().expect("sink").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn a_secret_split_over_two_writes_is_scrubbed() {
        let s = Secrets::from_pairs([("PW".into(), "hunter\"2-long".into())]);
        let got = line(
            &s,
            false,
            &[b"error: body {\"password\":\"hunt", b"er\\\"2-long\"}\n"],
        );
        assert!(!got.contains("hunt"), "{got}");
        assert!(got.contains("PW"), "{got}");
    }

    #[test]
    fn json_lines_stay_json_and_hold_no_form_of_a_secret() {
        let s = Secrets::from_pairs([
            ("PW".into(), "hunter\"2-long".into()),
            ("TOKEN".into(), "plain-token-1".into()),
        ]);
        // The message quotes an error body that quotes the secret JSON-escaped: the log
        // line escapes it once more.
        let message = r#"HTTP 400: {"password":"hunter\"2-long","t":"plain-token-1"}"#;
        let text = format!(
            "{}\n",
            serde_json::json!({"level": "WARN", "message": message})
        );
        let got = line(&s, true, &[text.as_bytes()]);
        let value: serde_json::Value = serde_json::from_str(&got).expect("still JSON");
        let msg = value["message"].as_str().unwrap_or_default();
        assert!(
            !got.contains("hunter") && !got.contains("plain-token"),
            "{got}"
        );
        assert!(msg.contains("PW") && msg.contains("TOKEN"), "{msg}");
        assert!(got.ends_with('\n'));
    }
}

//! Where deliveries go: a webhook (signed POST) or a JSON-lines file (fsynced).
//!
//! A sink reports, per delivery, accepted or failed with a message and the downstream's
//! retry hint. It never decides what happens next: that is [`super::backoff`]'s job.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flow_adapters::http::{Client, Spec};
use flow_adapters::{Call, FailureKind, Tool};
use flow_ledger::{Delivery, Scope};
use futures::StreamExt;

use super::wire;
use crate::sign::{EVENT_ID_HEADER, EVENT_TYPE_HEADER, Key, SIGNATURE_HEADER};

/// Why one delivery failed (no secret values: the signing key is scrubbed out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// For `last_error` and `flow events --failed`.
    pub message: String,
    /// The downstream's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
}

/// A consumer's destination.
#[derive(Debug, Clone)]
pub enum Sink {
    /// POST to a URL.
    Webhook(Webhook),
    /// Append to a file.
    File(File),
}

impl Sink {
    /// Delivers a batch; one result per delivery, in order.
    pub async fn deliver(
        &self,
        batch: &[Delivery],
        scope: &Scope,
        concurrency: usize,
    ) -> Vec<Result<(), Failure>> {
        match self {
            Sink::Webhook(w) => {
                // The futures are made up front: a lazy `.map(|d| ...)` on the stream
                // would make this future not provably `Send` (rustc's higher-ranked
                // lifetime limitation), and the daemon spawns it.
                let sends: Vec<_> = batch.iter().map(|d| w.send(d, scope)).collect();
                futures::stream::iter(sends)
                    .buffered(concurrency.max(1))
                    .collect()
                    .await
            }
            Sink::File(f) => {
                let result = f.append(batch, scope).await;
                batch.iter().map(|_| result.clone()).collect()
            }
        }
    }

    /// How long one delivery may take at most (bounds the delivery lease).
    pub fn timeout(&self) -> Duration {
        match self {
            Sink::Webhook(w) => w.timeout,
            // fsync of a batch: generous, since a slow disk is not a reason to re-send.
            Sink::File(_) => Duration::from_secs(60),
        }
    }
}

/// A signed webhook. Requests go through the adapters' HTTP client (the only crate that
/// speaks HTTP), which bounds each one by `timeout` and classifies failures.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub(crate) client: Client,
    pub(crate) url: String,
    pub(crate) key: Key,
    pub(crate) secret_name: String,
    pub(crate) timeout: Duration,
}

impl Webhook {
    async fn send(&self, d: &Delivery, scope: &Scope) -> Result<(), Failure> {
        let body = wire::to_json(&d.event, scope);
        let signature = self.key.sign(&wire::to_bytes(&body));
        let mut spec = Spec::new("POST", &self.url);
        spec.headers = vec![
            (EVENT_ID_HEADER.into(), d.event.id.clone()),
            (EVENT_TYPE_HEADER.into(), d.event.event_type.as_str().into()),
            (SIGNATURE_HEADER.into(), signature),
        ];
        spec.body = Some(body);
        // The adapter also sends the event id as `Idempotency-Key`.
        let call = Call::new(serde_json::Value::Null, d.event.id.clone(), self.timeout);
        let outcome = self.client.tool(spec).call(call).await;
        match outcome.result {
            Ok(_) => Ok(()),
            Err(e) => {
                let retry_after = match e.kind {
                    FailureKind::Transient { retry_after } => retry_after,
                    _ => None,
                };
                Err(Failure {
                    message: self.key.scrub(&e.to_string(), &self.secret_name),
                    retry_after,
                })
            }
        }
    }
}

/// A JSON-lines file. Each batch is appended with one write and one fsync; a line torn
/// by a crash mid-write is cut off before the next append, so every line is a complete
/// JSON document (its event is re-sent, since it was never recorded as delivered).
#[derive(Debug, Clone)]
pub struct File {
    pub(crate) path: PathBuf,
}

impl File {
    async fn append(&self, batch: &[Delivery], scope: &Scope) -> Result<(), Failure> {
        let mut text = Vec::new();
        for d in batch {
            text.extend_from_slice(&wire::to_bytes(&wire::to_json(&d.event, scope)));
            text.push(b'\n');
        }
        let path = self.path.clone();
        let joined = tokio::task::spawn_blocking(move || append_synced(&path, &text)).await;
        let result = match joined {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        result.map_err(|e| Failure {
            message: format!("cannot append to {}: {e}", self.path.display()),
            retry_after: None,
        })
    }
}

/// Appends `text` to `path` durably: repairs a torn last line, writes, `fsync`s the file
/// and, when the file is new, its directory (so the file itself survives a crash).
fn append_synced(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let existed = path.exists();
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    cut_torn_tail(&mut file)?;
    file.write_all(text)?;
    file.sync_data()?;
    if !existed {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// If the file does not end with a newline (a crash tore the last write), truncates it
/// after its last newline.
fn cut_torn_tail(file: &mut std::fs::File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut keep = 0;
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let mut buf = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf)?;
        if let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
            keep = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    tracing::warn!(
        bytes = len - keep,
        "events file ended in a torn line (a crash mid-write); cutting it off before appending"
    );
    file.set_len(keep)?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_line_is_cut_before_appending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("events.jsonl");
        append_synced(&p, b"{\"a\":1}\n").expect("append");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .and_then(|mut f| f.write_all(b"{\"b\":"))
            .expect("tear");
        append_synced(&p, b"{\"c\":3}\n").expect("append");
        assert_eq!(
            std::fs::read_to_string(&p).expect("read"),
            "{\"a\":1}\n{\"c\":3}\n"
        );
        // A file holding only a torn line becomes empty, then gets the new line.
        let q = dir.path().join("torn.jsonl");
        std::fs::write(&q, vec![b'x'; 200_000]).expect("write");
        append_synced(&q, b"{}\n").expect("append");
        assert_eq!(std::fs::read_to_string(&q).expect("read"), "{}\n");
    }
}

//! Delivering outbox events to consumers, at least once (the README's guarantee 4).
//!
//! The ledger writes each event in the transaction of its state change (no event without
//! its state change, no state change without its event) and keeps, per consumer, a
//! checkpoint and one delivery row per `(consumer, event_id)`. This module is the
//! dispatcher that works those rows off:
//!
//! 1. **schedule**: copy the events after the consumer's checkpoint that pass its
//!    `events` filter into its delivery queue (the checkpoint advances in the same
//!    transaction, so an event is handed to a consumer as new work once);
//! 2. **lease** due deliveries; the attempt is counted at lease time, so a dispatcher
//!    killed mid-delivery has still used the attempt, and the delivery comes back when
//!    the lease ends — at once when the dead dispatcher ran on this host;
//! 3. **send** ([`sink`]: a signed webhook POST, or JSON lines appended and fsynced);
//! 4. **finish** the batch in one transaction: delivered, retry at T ([`backoff`]:
//!    1, 2, 4 … 300 s), or dead after `max_attempts` (a dead letter, shown by
//!    `flow events --failed`, re-queued by `flow events redeliver`).
//!
//! A crash between 3 and 4 sends the event again: delivery is at least once, and
//! consumers dedupe on the event id (`Flow-Event-Id`; also sent as `Idempotency-Key`).
//!
//! Modules: [`config`](crate::config) holds the `[[consumers]]` settings; [`backoff`]
//! (pure schedule), [`sign`](crate::sign) (HMAC-SHA256 `Flow-Signature`), [`wire`] (the JSON that
//! consumers receive), [`sink`] (webhook, file), [`dispatch`] (the loop).
//!
//! The daemon runs [`run`] until its shutdown token fires; `flow events dispatch` runs
//! the same function in the foreground.

pub mod backoff;
pub mod dispatch;
pub mod sink;
pub mod wire;

use flow_ledger::{EventType, StartAt};

pub use dispatch::{Dispatcher, Options, Summary, dispatch_once, run};

use crate::config::{ConsumerConfig, ConsumerKind, ConsumerStart};
use crate::secrets::Secrets;

/// Why consumers could not be set up or the dispatcher could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A consumer's settings cannot be used (bad entry, missing secret).
    #[error("consumer `{consumer}`: {reason}")]
    Consumer {
        /// The consumer's name.
        consumer: String,
        /// What is wrong (names secrets, never shows their values).
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot set up the webhook client: {0}")]
    Client(String),
    /// The ledger failed (unreachable, or a statement failed).
    #[error(transparent)]
    Ledger(#[from] flow_ledger::Error),
}

/// A consumer ready to receive events: its filter, cap and destination.
#[derive(Debug, Clone)]
pub struct Consumer {
    /// The name its checkpoint and deliveries are kept under.
    pub name: String,
    /// Types delivered (empty = all).
    pub types: Vec<EventType>,
    /// Where it starts when it has no checkpoint yet.
    pub start: StartAt,
    /// Attempts before a dead letter.
    pub max_attempts: u32,
    /// Where events go.
    pub sink: sink::Sink,
}

/// Builds the consumers of a configuration, resolving webhook secrets from `secrets`
/// (`FLOW_SECRET_<NAME>` or `--secrets-file`). A missing secret is an error here, at
/// start-up, rather than a stream of unsigned or failing deliveries later.
pub fn consumers(configs: &[ConsumerConfig], secrets: &Secrets) -> Result<Vec<Consumer>, Error> {
    let mut client = None;
    let mut out = Vec::with_capacity(configs.len());
    for c in configs {
        let bad = |reason: String| Error::Consumer {
            consumer: c.name.clone(),
            reason,
        };
        c.check().map_err(bad)?;
        let sink = match c.kind {
            ConsumerKind::Webhook => {
                let secret_name = c.secret_name.clone().unwrap_or_default();
                let value = secrets.get(&secret_name).ok_or_else(|| {
                    bad(format!(
                        "secret `{secret_name}` is not set (FLOW_SECRET_{secret_name} or --secrets-file)"
                    ))
                })?;
                let client = match &client {
                    Some(c) => c,
                    None => client.insert(
                        flow_adapters::http::Client::new()
                            .map_err(|e| Error::Client(e.to_string()))?,
                    ),
                };
                sink::Sink::Webhook(sink::Webhook {
                    client: client.clone(),
                    url: c.url.clone().unwrap_or_default(),
                    key: crate::sign::Key::new(value),
                    secret_name,
                    timeout: c.timeout().map_err(bad)?,
                })
            }
            ConsumerKind::File => sink::Sink::File(sink::File {
                path: c.path.clone().unwrap_or_default(),
            }),
        };
        out.push(Consumer {
            name: c.name.clone(),
            types: c.types().map_err(bad)?,
            start: match c.start {
                ConsumerStart::Beginning => StartAt::Beginning,
                ConsumerStart::Latest => StartAt::Latest,
            },
            max_attempts: c.max_attempts(),
            sink,
        });
    }
    Ok(out)
}

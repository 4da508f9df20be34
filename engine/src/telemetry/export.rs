//! The guard around the SDK's batch processor: it bounds the spans waiting for export
//! and counts every span that never reached the collector, and it scrubs secret values
//! from every exported span (the last gate, whatever put them there).
//!
//! The SDK's batch processor counts the spans it drops, privately; flow needs the count
//! as a metric. So the guard counts what it hands on (`QUEUED`) and the exporter wrapper
//! what was exported or failed (`HANDLED`): their difference is what waits, and the
//! guard drops — counted — instead of handing on a span the queue could not take.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::{Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use crate::secrets::Secrets;

/// How much larger the SDK's queue is than the guard's bound: two threads ending spans
/// at the same instant could both pass the guard's check.
pub(super) const MARGIN: usize = 64;

/// Spans this process ended for export that never reached a collector.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans dropped since the process started: a full queue, a failed or timed-out export,
/// or left unsent at exit. Read by the daemon's `flow_telemetry_spans_dropped_total`.
pub fn dropped_spans() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Spans the guard handed on to the processor, and spans the exporter is done with
/// (exported or failed): their difference is what waits. One exporting provider per
/// process (`super::PROVIDER`), so the counts are the process's.
static QUEUED: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// After a shutdown that timed out: whatever was handed on and not handled is lost.
pub(super) fn count_unsent() {
    let queued = QUEUED.load(Ordering::Relaxed);
    let handled = HANDLED.swap(queued, Ordering::Relaxed);
    DROPPED.fetch_add(queued.saturating_sub(handled), Ordering::Relaxed);
}

/// Builds the exporter a [`Counted`] sends through, on its first export.
pub(super) type Build<E> = Box<dyn Fn() -> Result<Built<E>, String> + Send + Sync>;

/// An exporter, and the runtime its exports run on when it needs one (tonic needs a
/// Tokio reactor; the SDK's export thread has none).
pub(super) struct Built<E> {
    exporter: E,
    /// The runtime, and the longest an export may take on it (connecting included:
    /// tonic's own timeout starts once the request is sent, so a collector that drops
    /// packets would hold the export thread for the system's connect timeout).
    runtime: Option<(tokio::runtime::Runtime, Duration)>,
}

impl<E> Built<E> {
    /// An exporter that runs on whatever polls it (the blocking HTTP client).
    pub(super) fn plain(exporter: E) -> Self {
        Self {
            exporter,
            runtime: None,
        }
    }

    /// An exporter whose exports are driven on `runtime`, each for at most `timeout`.
    pub(super) fn on(exporter: E, runtime: tokio::runtime::Runtime, timeout: Duration) -> Self {
        Self {
            exporter,
            runtime: Some((runtime, timeout)),
        }
    }
}

/// The exporter `build` makes, counting, and the guard to put around the processor
/// that uses it.
pub(super) fn guarded<E: SpanExporter>(
    build: impl Fn() -> Result<Built<E>, String> + Send + Sync + 'static,
    bound: usize,
    secrets: Secrets,
) -> (Counted<E>, Guard) {
    (
        Counted {
            build: Box::new(build),
            built: OnceLock::new(),
            resource: std::sync::Mutex::new(None),
        },
        Guard {
            bound: u64::try_from(bound).unwrap_or(u64::MAX),
            secrets,
        },
    )
}

/// An exporter, built on the exporter thread at its first export, that counts what it
/// exported, and as dropped what it failed to (or could not be built to) send.
pub(super) struct Counted<E> {
    build: Build<E>,
    /// The exporter, or `None` when it could not be built (said once, as a warning).
    built: OnceLock<Option<Built<E>>>,
    /// The resource the provider gave before the exporter existed.
    resource: std::sync::Mutex<Option<Resource>>,
}

impl<E> std::fmt::Debug for Counted<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted").finish_non_exhaustive()
    }
}

impl<E: SpanExporter> Counted<E> {
    fn exporter(&self) -> Option<&Built<E>> {
        self.built
            .get_or_init(|| match (self.build)() {
                Ok(mut built) => {
                    let resource = self.resource.lock().map(|r| r.clone()).ok().flatten();
                    if let Some(resource) = resource {
                        built.exporter.set_resource(&resource);
                    }
                    Some(built)
                }
                Err(why) => {
                    tracing::warn!("telemetry: {why}; spans are dropped");
                    None
                }
            })
            .as_ref()
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let export = self
            .exporter()
            .map(|b| (b.exporter.export(batch), b.runtime.as_ref()));
        async move {
            let result = match export {
                // The SDK's export thread blocks on this future, outside any runtime.
                // The timer is made inside the runtime (it needs its clock).
                Some((export, Some((runtime, timeout)))) => runtime
                    .block_on(async { tokio::time::timeout(*timeout, export).await })
                    .unwrap_or(Err(OTelSdkError::Timeout(*timeout))),
                Some((export, None)) => export.await,
                None => Err(OTelSdkError::InternalFailure("no exporter".into())),
            };
            if result.is_err() {
                DROPPED.fetch_add(n, Ordering::Relaxed);
            }
            HANDLED.fetch_add(n, Ordering::Relaxed);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.built
            .get()
            .and_then(Option::as_ref)
            .map_or(Ok(()), |b| b.exporter.shutdown_with_timeout(timeout))
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.built
            .get()
            .and_then(Option::as_ref)
            .map_or(Ok(()), |b| b.exporter.force_flush())
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self.built.get_mut().and_then(Option::as_mut) {
            Some(built) => built.exporter.set_resource(resource),
            None => {
                if let Ok(mut kept) = self.resource.lock() {
                    *kept = Some(resource.clone());
                }
            }
        }
    }
}

/// The bound and the scrubbing, before the processor sees a span.
#[derive(Debug)]
pub(super) struct Guard {
    bound: u64,
    secrets: Secrets,
}

impl Guard {
    /// The processor `inner` behind this guard.
    pub(super) fn around<P: SpanProcessor>(self, inner: P) -> Guarded<P> {
        Guarded { guard: self, inner }
    }
}

/// A span processor behind a [`Guard`].
#[derive(Debug)]
pub(super) struct Guarded<P> {
    guard: Guard,
    inner: P,
}

impl<P: SpanProcessor> SpanProcessor for Guarded<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let waiting = QUEUED
            .load(Ordering::Relaxed)
            .saturating_sub(HANDLED.load(Ordering::Relaxed));
        if waiting >= self.guard.bound {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        scrub(&mut span, &self.guard.secrets);
        QUEUED.fetch_add(1, Ordering::Relaxed);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Replaces every secret value in the span's name, attributes and events' attributes.
fn scrub(span: &mut SpanData, secrets: &Secrets) {
    if secrets.finds(span.name.as_bytes()) {
        span.name = secrets.scrub(&span.name).into();
    }
    scrub_all(&mut span.attributes, secrets);
    for event in span.events.events.iter_mut() {
        if secrets.finds(event.name.as_bytes()) {
            event.name = secrets.scrub(&event.name).into();
        }
        scrub_all(&mut event.attributes, secrets);
    }
    for link in span.links.links.iter_mut() {
        scrub_all(&mut link.attributes, secrets);
    }
}

fn scrub_all(attributes: &mut [KeyValue], secrets: &Secrets) {
    for kv in attributes {
        if let Value::String(text) = &kv.value
            && secrets.finds(text.as_str().as_bytes())
        {
            kv.value = Value::String(StringValue::from(secrets.scrub(text.as_str())));
        }
    }
}

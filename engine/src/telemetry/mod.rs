//! OpenTelemetry traces: a span per run segment, per step and per call that leaves the
//! process, exported over OTLP; the call's trace context is carried to the downstream
//! (HTTP headers, MCP `_meta`, command environment — see `crate::gateway::trace`).
//!
//! Off unless an endpoint is configured (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, or `[telemetry] otlp_endpoint` in flow.toml): then no
//! layer is installed, and a span costs what a disabled tracing span costs.
//!
//! Export never blocks or fails a run: ended spans go to a bounded queue that the SDK's
//! batch processor drains on its own thread; a full queue or a failed export drops
//! spans, counted ([`dropped_spans`], `flow_telemetry_spans_dropped_total`). At exit a
//! process waits at most [`EXIT_FLUSH`] for its last batch.
//!
//! The spans are tracing spans (the executor's `run` and `step`, the gateway's `call`)
//! turned into OpenTelemetry spans by `tracing-opentelemetry`: their `otel.name` and
//! `otel.kind` fields name them; only spans of flow's own targets are exported, never
//! log events (a log line may quote a downstream's answer; an exported span holds only
//! what flow chose to put in it, scrubbed again on the way out).

mod export;
pub mod spans;
pub mod w3c;

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{
    Protocol, RetryPolicy, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use serde::Deserialize;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets, filter_fn};
use tracing_subscriber::registry::LookupSpan;

pub use export::dropped_spans;

use crate::secrets::Secrets;

/// The longest a process waits at exit for its last spans to leave: a collector that
/// hangs must not hold up `flow run`'s exit code (the spans are then dropped, counted and
/// named in a warning).
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);

/// The tracing target of a pure function step's span. Such steps can be thousands per
/// run; the exporting layer drops this target unless `[telemetry] pure_steps = true`.
pub const PURE_STEP_TARGET: &str = "flow::pure_step";

/// The queue of ended spans waiting for export, unless `OTEL_BSP_MAX_QUEUE_SIZE` says
/// otherwise (the SDK's default).
const QUEUE: usize = 2_048;

/// `[telemetry]` in flow.toml. Environment variables (`OTEL_EXPORTER_OTLP_*`,
/// `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`) configure the
/// rest the standard way, and an endpoint in the environment wins over this file's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP base URL (`http://collector:4318`, where flow appends
    /// `/v1/traces`; `http://collector:4317` with `otlp_protocol = "grpc"`). Unset, and
    /// no endpoint in the environment: no traces.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (default), `http/json` or `grpc`; `OTEL_EXPORTER_OTLP_PROTOCOL`
    /// wins.
    #[serde(default)]
    pub otlp_protocol: Option<String>,
    /// Export a span for every pure function step too (off: they can be thousands).
    #[serde(default)]
    pub pure_steps: bool,
}

impl TelemetryConfig {
    /// Checks the file's endpoint when flow.toml is loaded, so a typo is an
    /// installation error at start, not traces silently missing.
    pub fn check(&self) -> Result<(), String> {
        if let Some(asked) = &self.otlp_protocol {
            parse_protocol(asked).map_err(|e| format!("[telemetry] otlp_protocol: {e}"))?;
        }
        let Some(endpoint) = &self.otlp_endpoint else {
            return Ok(());
        };
        match url::Url::parse(endpoint) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(()),
            Ok(url) => Err(format!(
                "[telemetry] otlp_endpoint: unsupported scheme `{}` (use http or https)",
                url.scheme()
            )),
            Err(e) => Err(format!(
                "[telemetry] otlp_endpoint: not a URL ({e}): {endpoint:?}"
            )),
        }
    }
}

/// Where the exporter sends, once the environment and flow.toml are read.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    /// No endpoint anywhere, or `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`.
    Off,
    /// The environment names it (signal-specific first): the SDK reads it itself; flow
    /// only looks at its scheme.
    FromEnvironment(String),
    /// flow.toml's base URL (an endpoint given in code is used verbatim by the SDK:
    /// [`signal_url`] appends OTLP/HTTP's signal path).
    Given(String),
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn endpoint(config: &TelemetryConfig) -> Endpoint {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Endpoint::Off;
    }
    if let Some(url) =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        return Endpoint::FromEnvironment(url);
    }
    match &config.otlp_endpoint {
        Some(base) => Endpoint::Given(base.clone()),
        None => Endpoint::Off,
    }
}

/// The URL the SDK is given for flow.toml's base URL: OTLP/HTTP posts to the signal's
/// path (appended once), gRPC calls a method on the host (the URL as given).
fn signal_url(base: &str, protocol: Protocol) -> String {
    let base = base.trim_end_matches('/');
    if protocol == Protocol::Grpc || base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

fn parse_protocol(asked: &str) -> Result<Protocol, String> {
    match asked.trim() {
        "http/protobuf" => Ok(Protocol::HttpBinary),
        "http/json" => Ok(Protocol::HttpJson),
        "grpc" => Ok(Protocol::Grpc),
        other => Err(format!(
            "{other:?} is not one of http/protobuf, http/json, grpc"
        )),
    }
}

/// The OTLP protocol the environment asks for, else flow.toml, else OTLP/HTTP with
/// protobuf (the specification's default); `Err` for one flow does not speak.
fn protocol(config: &TelemetryConfig) -> Result<Protocol, String> {
    let asked = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find_map(|name| env(name).map(|v| (name, v)));
    match (asked, &config.otlp_protocol) {
        (Some((name, asked)), _) => parse_protocol(&asked).map_err(|e| format!("{name}: {e}")),
        (None, Some(file)) => parse_protocol(file),
        (None, None) => Ok(Protocol::HttpBinary),
    }
}

/// The OTLP exporter for `protocol`, built on the exporter's thread ([`layer`]). A gRPC
/// exporter (tonic) needs a Tokio reactor, which the SDK's export thread does not have:
/// it gets a current-thread runtime of its own, built here and kept beside it. `https`:
/// gRPC must be told to talk TLS (with the platform's roots); the HTTP client decides
/// from the URL itself.
fn build_exporter(
    protocol: Protocol,
    given: Option<&str>,
    https: bool,
    retry: &RetryPolicy,
) -> Result<export::Built<opentelemetry_otlp::SpanExporter>, String> {
    let failed = |e: &dyn std::fmt::Display| format!("cannot build the OTLP exporter: {e}");
    if protocol != Protocol::Grpc {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_retry_policy(retry.clone());
        if let Some(url) = given {
            builder = builder.with_endpoint(signal_url(url, protocol));
        }
        return builder
            .build()
            .map(export::Built::plain)
            .map_err(|e| failed(&e));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_protocol(protocol)
        .with_retry_policy(retry.clone());
    if let Some(url) = given {
        builder = builder.with_endpoint(signal_url(url, protocol));
    }
    if https {
        builder = builder.with_tls_config(ClientTlsConfig::new().with_native_roots());
    }
    // The channel is made lazily but registers with the reactor it is built in.
    let exporter = {
        let _entered = runtime.enter();
        builder.build().map_err(|e| failed(&e))?
    };
    Ok(export::Built::on(exporter, runtime, export_timeout()))
}

/// The OTLP export timeout (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds; 10 s by default, as the SDK's).
fn export_timeout() -> Duration {
    env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The process's resource: the environment's attributes (`OTEL_RESOURCE_ATTRIBUTES`,
/// `OTEL_SERVICE_NAME`), with `service.name` `flow` unless they name one.
fn resource() -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    let mut builder = Resource::builder();
    if !named {
        builder = builder.with_service_name("flow");
    }
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The provider this process exports through, flushed at exit ([`finish`]).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether this process exports traces: the spans' OpenTelemetry attributes are only
/// computed then (off, a span carries only the fields its log lines show).
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// What kind of process exports: it decides whether a failed export is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// A command that ends with its run (`flow run`, `resume`, `submit`): it exports
    /// once, at exit, and a collector that refuses must not hold the exit up with
    /// retries (one attempt, within [`EXIT_FLUSH`]).
    Command,
    /// A daemon or server: a failed batch is tried again with the OTLP recommended
    /// backoff, on the exporter's own thread.
    Service,
}

/// The exporting layer for the process's subscriber, or `Ok(None)` when telemetry is
/// off; `Err` says why it is off although it was asked for (the caller warns: a trace
/// never stops flow from running).
///
/// The OTLP client is built by the exporter's thread at its first export, not here: a
/// command whose run takes 30 ms must not wait for an HTTP client (its thread and TLS
/// roots) before its first node.
pub fn layer<S>(
    config: &TelemetryConfig,
    secrets: &Secrets,
    process: Process,
) -> Result<Option<Box<dyn Layer<S> + Send + Sync>>, String>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let (given, url) = match endpoint(config) {
        Endpoint::Off => return Ok(None),
        Endpoint::FromEnvironment(url) => (None, url),
        Endpoint::Given(url) => (Some(url.clone()), url),
    };
    let https = url.trim().to_ascii_lowercase().starts_with("https://");
    let protocol = protocol(config)?;
    let retry = match process {
        Process::Command => RetryPolicy::disabled(),
        Process::Service => RetryPolicy::recommended(),
    };
    let build = move || build_exporter(protocol, given.as_deref(), https, &retry);
    let queue = env("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(QUEUE);
    let (exporter, guard) = export::guarded(build, queue, secrets.clone());
    // The SDK's own queue is a little larger than the guard's bound, so the guard is
    // the one that drops (and counts) a span when the collector falls behind.
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue + export::MARGIN)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(guard.around(batch))
        .with_resource(resource())
        .build();
    let tracer = provider.tracer("flow");
    // A second install in one process (tests call the CLI in-process) keeps the first.
    let _ = PROVIDER.set(provider);
    let pure = if config.pure_steps {
        LevelFilter::INFO
    } else {
        LevelFilter::OFF
    };
    let targets = Targets::new()
        .with_target("flow", LevelFilter::INFO)
        .with_target(PURE_STEP_TARGET, pure);
    let spans_only = filter_fn(|meta| meta.is_span());
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_filter(targets.and(spans_only));
    Ok(Some(Box::new(layer)))
}

/// Sends what is left and stops the exporter, waiting at most [`EXIT_FLUSH`]; warns
/// when spans were dropped. Called once, as the process's command ends.
pub fn finish() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if provider.shutdown_with_timeout(EXIT_FLUSH).is_err() {
        export::count_unsent();
    }
    let dropped = dropped_spans();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "telemetry: {dropped} span(s) were not exported (the OTLP collector did not take them)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_endpoint_gets_the_signal_path_once() {
        // Only meaningful without an endpoint in the environment (CI sets none).
        if env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
            || env("OTEL_SDK_DISABLED").is_some()
            || env("OTEL_TRACES_EXPORTER").is_some()
        {
            return;
        }
        let of = |url: &str| {
            endpoint(&TelemetryConfig {
                otlp_endpoint: Some(url.into()),
                ..TelemetryConfig::default()
            })
        };
        assert_eq!(
            of("http://c:4318/"),
            Endpoint::Given("http://c:4318/".into())
        );
        assert_eq!(endpoint(&TelemetryConfig::default()), Endpoint::Off);
        let http = Protocol::HttpBinary;
        assert_eq!(signal_url("http://c:4318", http), "http://c:4318/v1/traces");
        assert_eq!(
            signal_url("http://c:4318/", http),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://c:4318/v1/traces", http),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://c:4317/", Protocol::Grpc),
            "http://c:4317"
        );
    }

    #[test]
    fn a_bad_file_endpoint_is_refused_on_load() {
        let bad = |url: &str| TelemetryConfig {
            otlp_endpoint: Some(url.into()),
            ..TelemetryConfig::default()
        };
        assert!(bad("collector:4318").check().is_err());
        assert!(bad("ftp://c/").check().is_err());
        assert!(bad("https://c:4318").check().is_ok());
        let protocol = |p: &str| TelemetryConfig {
            otlp_protocol: Some(p.into()),
            ..TelemetryConfig::default()
        };
        assert!(protocol("grpc").check().is_ok());
        assert!(protocol("http/json").check().is_ok());
        assert!(protocol("udp").check().is_err());
    }
}

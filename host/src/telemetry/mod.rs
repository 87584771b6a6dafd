//! Traces and metrics through OTLP/HTTP (OpenTelemetry), when the standard variables ask for
//! them ([`config`]), and nothing at all when they do not: an instance without telemetry holds
//! `None` and runs no code of this module.
//!
//! What is recorded ([`recorder`]): a span per call, a child per statement the guest sends (the
//! host sees its requests), retries and lock waits from the guest's log ([`Event`]), and the
//! metrics in [`Instruments`]. The guest gains no import for any of it.
//!
//! [`Event`]: clickhouse_state_contract::events::Event

mod client;
pub mod config;
pub mod recorder;

use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
pub use opentelemetry_otlp::Protocol;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use config::TelemetryConfig;

use crate::error::Error;
use crate::http::proxy::Proxies;
use crate::http::sender::Sender;
use crate::http::tls::LazyClientConfig;

/// The instrumentation scope's name, on every span and metric, and the service's name unless
/// the variables give one.
pub const SCOPE: &str = "meltano-state-backend";

/// The metrics, made once per exporter.
pub struct Instruments {
    /// Calls by operation and outcome (`ok`, or the contract's error kind).
    pub(crate) calls: Counter<u64>,
    /// Each statement's round trip, by statement kind.
    pub(crate) statement_duration: Histogram<f64>,
    /// Each pause while another instance held the lock.
    pub(crate) lock_wait: Histogram<f64>,
    /// Statements sent again after a failure.
    pub(crate) retries: Counter<u64>,
    /// Kept locks given back (idle for the linger, or wanted by a waiter).
    pub(crate) handoffs: Counter<u64>,
}

/// The names of the metrics, as a collector shows them.
pub const METRICS: [&str; 5] = [
    "state_backend.calls",
    "state_backend.statement.duration",
    "state_backend.lock.wait.duration",
    "state_backend.retries",
    "state_backend.lock.handoffs",
];

/// A statement's buckets, in seconds: a local server answers in a millisecond, a cluster's
/// quorum insert in a second or more.
pub const STATEMENT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A lock wait's buckets, in seconds: a pause is about `lock_retry_seconds` (1 s by default),
/// a wait for a run's hold as long as the lock timeout.
pub const LOCK_WAIT_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// The runtime the exports run on, shut down without blocking wherever it is dropped (async
/// code included, where a runtime may not block).
struct ExportRuntime(Option<tokio::runtime::Runtime>);

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A running exporter: the SDK's providers and the runtime their exports run on.
pub struct Telemetry {
    tracer: Option<SdkTracer>,
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    pub(crate) instruments: Instruments,
    _runtime: ExportRuntime,
}

impl Telemetry {
    /// Starts exporting as `config` says, through `proxies` as the host's other requests go.
    pub fn start(config: &TelemetryConfig, proxies: Arc<Proxies>) -> Result<Arc<Self>, Error> {
        // A bad CA path is the operator's to fix, named before anything is exported.
        let sender = Sender::new(Arc::new(LazyClientConfig::new(&config.tls)?), proxies);
        let runtime = ExportRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("otlp-export")
                .enable_all()
                .build()
                .map_err(|e| Error::Component(format!("cannot start the OTLP exporter: {e}")))?,
        ));
        let handle = match &runtime.0 {
            Some(runtime) => runtime.handle().clone(),
            None => unreachable!("the runtime was just built"),
        };
        let client = || client::Client {
            sender: sender.clone(),
            runtime: handle.clone(),
            timeout: config.timeout,
        };
        let invalid = |signal: &str, e: &dyn std::fmt::Display| {
            Error::InvalidConfig(format!("the OTLP {signal} exporter: {e}"))
        };
        let endpoint = |path: &str| {
            config
                .endpoint
                .as_ref()
                .map(|base| format!("{}/{path}", base.trim_end_matches('/')))
        };
        let resource = resource();
        let tracer_provider = match config.traces {
            Some(protocol) => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client())
                    .with_protocol(protocol);
                if let Some(url) = endpoint("v1/traces") {
                    builder = builder.with_endpoint(url);
                }
                let exporter = builder.build().map_err(|e| invalid("trace", &e))?;
                Some(
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(resource.clone())
                        .build(),
                )
            }
            None => None,
        };
        let meter_provider = match config.metrics {
            Some(protocol) => {
                let mut builder = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(client())
                    .with_protocol(protocol);
                if let Some(url) = endpoint("v1/metrics") {
                    builder = builder.with_endpoint(url);
                }
                let exporter = builder.build().map_err(|e| invalid("metrics", &e))?;
                Some(
                    SdkMeterProvider::builder()
                        .with_reader(PeriodicReader::builder(exporter).build())
                        .with_resource(resource)
                        .build(),
                )
            }
            None => None,
        };
        let meter = match &meter_provider {
            Some(provider) => provider.meter(SCOPE),
            // Instruments of a provider with no reader record nothing.
            None => SdkMeterProvider::builder().build().meter(SCOPE),
        };
        let [calls, statement, lock_wait, retries, handoffs] = METRICS;
        let instruments = Instruments {
            calls: meter.u64_counter(calls).build(),
            statement_duration: meter
                .f64_histogram(statement)
                .with_unit("s")
                .with_boundaries(STATEMENT_BUCKETS.to_vec())
                .build(),
            lock_wait: meter
                .f64_histogram(lock_wait)
                .with_unit("s")
                .with_boundaries(LOCK_WAIT_BUCKETS.to_vec())
                .build(),
            retries: meter.u64_counter(retries).build(),
            handoffs: meter.u64_counter(handoffs).build(),
        };
        Ok(Arc::new(Telemetry {
            tracer: tracer_provider.as_ref().map(|p| p.tracer(SCOPE)),
            tracer_provider,
            meter_provider,
            instruments,
            _runtime: runtime,
        }))
    }

    pub(crate) fn tracer(&self) -> Option<&SdkTracer> {
        self.tracer.as_ref()
    }

    /// Exports what is recorded so far (it blocks until the collector answers or times out).
    pub fn flush(&self) {
        if let Some(p) = &self.tracer_provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!("exporting traces failed: {e}");
        }
        if let Some(p) = &self.meter_provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!("exporting metrics failed: {e}");
        }
    }

    /// Exports what is left and stops.
    pub fn shutdown(&self) {
        if let Some(p) = &self.tracer_provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!("exporting the last traces failed: {e}");
        }
        if let Some(p) = &self.meter_provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!("exporting the last metrics failed: {e}");
        }
    }
}

/// `service.name`: the variables' (`OTEL_SERVICE_NAME`, or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`, which the SDK reads), else this product's; and its version.
fn resource() -> Resource {
    let given = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    let named = given("OTEL_SERVICE_NAME").is_some()
        || given("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
            attributes.split(',').any(|pair| {
                pair.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == "service.name")
            })
        });
    let builder = Resource::builder();
    let builder = if named {
        builder
    } else {
        builder.with_service_name(SCOPE)
    };
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The process's exporter, started once from the standard variables; `None` when they ask for
/// nothing, or for what this host cannot do (a warning names the variable: the environment's
/// telemetry settings never stop the state backend).
pub fn from_env(proxies: &Arc<Proxies>) -> Option<Arc<Telemetry>> {
    PROCESS
        .get_or_init(|| {
            let config = match TelemetryConfig::from_env(|v| std::env::var(v).ok()) {
                Ok(config) => config?,
                Err(why) => {
                    tracing::warn!("no traces or metrics: {why}");
                    return None;
                }
            };
            match Telemetry::start(&config, Arc::clone(proxies)) {
                Ok(telemetry) => Some(telemetry),
                Err(e) => {
                    tracing::warn!("no traces or metrics: {e}");
                    None
                }
            }
        })
        .clone()
}

/// Exports what the process's exporter has recorded so far, if it started, waiting at most
/// `timeout` and 5 s (the embedded host, as Meltano closes a backend: the process itself may
/// end without telling us); a zero timeout does not wait.
pub fn flush_process(timeout: Duration) {
    let timeout = timeout.min(Duration::from_secs(5));
    let Some(Some(telemetry)) = PROCESS.get() else {
        return;
    };
    let telemetry = Arc::clone(telemetry);
    let (done, flushed) = mpsc::channel();
    let flushing = std::thread::Builder::new()
        .name("otlp-flush".into())
        .spawn(move || {
            telemetry.flush();
            let _ = done.send(());
        });
    if flushing.is_ok() && !timeout.is_zero() && flushed.recv_timeout(timeout).is_err() {
        tracing::warn!(
            "the collector did not take the last traces and metrics within {} s",
            timeout.as_secs_f64()
        );
    }
}

/// Exports what the process's exporter has left, if it started (at the CLI's exit).
pub fn shutdown_process() {
    if let Some(Some(telemetry)) = PROCESS.get() {
        telemetry.shutdown();
    }
}

static PROCESS: OnceLock<Option<Arc<Telemetry>>> = OnceLock::new();

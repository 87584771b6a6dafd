//! Traces and metrics through OTLP/HTTP (OpenTelemetry), when the standard variables ask for
//! them (`OTEL_EXPORTER_OTLP_ENDPOINT`, or a signal's own endpoint), and nothing at all when
//! they do not: an instance without telemetry holds `None` and runs no code of this module.
//!
//! What is recorded ([`recorder`]): a span per call, a child per statement the guest sends (the
//! host sees its requests), retries and lock waits from the guest's log ([`Event`]), and the
//! metrics in [`Instruments`]. The guest gains no import for any of it.
//!
//! [`Event`]: clickhouse_state_contract::events::Event

mod client;
pub mod recorder;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
pub use opentelemetry_otlp::Protocol;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::error::Error;
use crate::http::proxy::Proxies;
use crate::http::sender::Sender;
use crate::http::tls::{LazyClientConfig, TlsOptions};

/// The instrumentation scope's name, on every span and metric.
pub const SCOPE: &str = "meltano-state-backend";

/// What to export, and where.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// The collector's base URL (`/v1/traces` and `/v1/metrics` are added); `None` leaves each
    /// signal's endpoint to the `OTEL_EXPORTER_OTLP_*` variables.
    pub endpoint: Option<String>,
    pub traces: bool,
    pub metrics: bool,
    /// `None` takes `OTEL_EXPORTER_OTLP_PROTOCOL` (http/protobuf by default).
    pub protocol: Option<Protocol>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default).
    pub timeout: Duration,
    /// The collector's CA and client identity (`OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`).
    pub tls: TlsOptions,
}

impl TelemetryConfig {
    /// The configuration the standard variables give, or `None` when they ask for nothing:
    /// no endpoint, `OTEL_SDK_DISABLED=true`, or both signals' exporters `none`.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Error> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let general = set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let wanted = |signal: &str| {
            let exporter = set(&format!("OTEL_{signal}_EXPORTER"));
            (general || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")).is_some())
                && !exporter.is_some_and(|e| e.trim().eq_ignore_ascii_case("none"))
        };
        let (traces, metrics) = (wanted("TRACES"), wanted("METRICS"));
        if !traces && !metrics {
            return Ok(None);
        }
        if let Some(protocol) = set("OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol.trim() == "grpc"
        {
            return Err(Error::InvalidConfig(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: this host exports OTLP over HTTP only; set \
                 it to http/protobuf (the collector's port 4318) or http/json"
                    .into(),
            ));
        }
        let timeout = match set("OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => Duration::from_secs(10),
            Some(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| {
                Error::InvalidConfig(format!(
                    "OTEL_EXPORTER_OTLP_TIMEOUT={ms:?}: expected milliseconds, such as 10000"
                ))
            })?),
        };
        let path = |name: &str| set(name).map(PathBuf::from);
        Ok(Some(TelemetryConfig {
            endpoint: None,
            traces,
            metrics,
            protocol: None,
            timeout,
            tls: TlsOptions {
                ca_bundle: path("OTEL_EXPORTER_OTLP_CERTIFICATE"),
                client_cert: path("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
                client_key: path("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
            },
        }))
    }
}

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

/// A running exporter: the SDK's providers and the runtime their exports run on.
pub struct Telemetry {
    tracer: Option<SdkTracer>,
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    pub(crate) instruments: Instruments,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Telemetry {
    /// Starts exporting as `config` says, through `proxies` as the host's other requests go.
    pub fn start(config: &TelemetryConfig, proxies: Arc<Proxies>) -> Result<Arc<Self>, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(|e| Error::Component(format!("cannot start the OTLP exporter: {e}")))?;
        // A bad CA path is the operator's to fix, named before anything is exported.
        let sender = Sender::new(Arc::new(LazyClientConfig::new(&config.tls)?), proxies);
        let client = || client::Client {
            sender: sender.clone(),
            runtime: runtime.handle().clone(),
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
        let tracer_provider = if config.traces {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client());
            if let Some(protocol) = config.protocol {
                builder = builder.with_protocol(protocol);
            }
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
        } else {
            None
        };
        let meter_provider = if config.metrics {
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(client());
            if let Some(protocol) = config.protocol {
                builder = builder.with_protocol(protocol);
            }
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
        } else {
            None
        };
        let meter = match &meter_provider {
            Some(provider) => provider.meter(SCOPE),
            // Instruments of a provider with no reader record nothing.
            None => SdkMeterProvider::builder().build().meter(SCOPE),
        };
        let [calls, statement, lock_wait, retries, handoffs] = METRICS;
        let instruments = Instruments {
            calls: meter.u64_counter(calls).build(),
            statement_duration: meter.f64_histogram(statement).with_unit("s").build(),
            lock_wait: meter.f64_histogram(lock_wait).with_unit("s").build(),
            retries: meter.u64_counter(retries).build(),
            handoffs: meter.u64_counter(handoffs).build(),
        };
        Ok(Arc::new(Telemetry {
            tracer: tracer_provider.as_ref().map(|p| p.tracer(SCOPE)),
            tracer_provider,
            meter_provider,
            instruments,
            runtime: Mutex::new(Some(runtime)),
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
            tracing::debug!("the trace exporter's shutdown: {e}");
        }
        if let Some(p) = &self.meter_provider
            && let Err(e) = p.shutdown()
        {
            tracing::debug!("the metrics exporter's shutdown: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Dropped from async code too, where a runtime may not block.
        if let Ok(mut runtime) = self.runtime.lock()
            && let Some(runtime) = runtime.take()
        {
            runtime.shutdown_background();
        }
    }
}

/// `service.name` from `OTEL_SERVICE_NAME` (read by the SDK), else this product's; and its
/// version.
fn resource() -> Resource {
    let builder = Resource::builder();
    let builder = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder
    } else {
        builder.with_service_name(SCOPE)
    };
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The process's exporter, started once from the standard variables; `None` when they ask for
/// nothing.
pub fn from_env(proxies: &Arc<Proxies>) -> Result<Option<Arc<Telemetry>>, Error> {
    if let Some(started) = PROCESS.get() {
        return Ok(started.clone());
    }
    let started = match TelemetryConfig::from_env(|v| std::env::var(v).ok())? {
        Some(config) => Some(Telemetry::start(&config, Arc::clone(proxies))?),
        None => None,
    };
    Ok(PROCESS.get_or_init(|| started).clone())
}

/// Exports what the process's exporter has recorded so far, if it started (the embedded host,
/// as Meltano closes a backend: the process itself may end without telling us).
pub fn flush_process() {
    if let Some(Some(telemetry)) = PROCESS.get() {
        telemetry.flush();
    }
}

/// Exports what the process's exporter has left, if it started (at the CLI's exit).
pub fn shutdown_process() {
    if let Some(Some(telemetry)) = PROCESS.get() {
        telemetry.shutdown();
    }
}

static PROCESS: OnceLock<Option<Arc<Telemetry>>> = OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Option<TelemetryConfig>, Error> {
        TelemetryConfig::from_env(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn nothing_is_exported_unless_an_endpoint_is_set() {
        assert!(config(&[]).unwrap().is_none());
        assert!(config(&[("OTEL_SERVICE_NAME", "x")]).unwrap().is_none());
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let both = config(&[endpoint]).unwrap().unwrap();
        assert!(both.traces && both.metrics);
        assert!(
            config(&[endpoint, ("OTEL_SDK_DISABLED", "true")])
                .unwrap()
                .is_none()
        );
        let traces_only = config(&[endpoint, ("OTEL_METRICS_EXPORTER", "none")])
            .unwrap()
            .unwrap();
        assert!(traces_only.traces && !traces_only.metrics);
        assert!(
            config(&[
                endpoint,
                ("OTEL_METRICS_EXPORTER", "none"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .unwrap()
            .is_none()
        );
        let metrics_only = config(&[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://127.0.0.1:4318/v1/metrics",
        )])
        .unwrap()
        .unwrap();
        assert!(!metrics_only.traces && metrics_only.metrics);
    }

    #[test]
    fn grpc_and_a_bad_timeout_are_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        let grpc = config(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(grpc.to_string().contains("http/protobuf"), "{grpc}");
        let timeout = config(&[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).unwrap_err();
        assert!(
            timeout.to_string().contains("OTEL_EXPORTER_OTLP_TIMEOUT"),
            "{timeout}"
        );
        let ms = config(&[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")])
            .unwrap()
            .unwrap();
        assert_eq!(ms.timeout, Duration::from_millis(2500));
    }
}

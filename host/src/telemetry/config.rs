//! What the standard OpenTelemetry variables ask for: which signals, where, how.
//!
//! OTEL variables are the environment's, shared by every tool of a process tree: a value this
//! host cannot follow (a `grpc` protocol meant for another tool, a console exporter) is named
//! in a warning and the host runs without telemetry, never refusing to read or write state.

use std::path::PathBuf;
use std::time::Duration;

use opentelemetry_otlp::Protocol;

use crate::http::tls::TlsOptions;

/// What to export, and where.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// The collector's base URL (`/v1/traces` and `/v1/metrics` are added); `None` leaves each
    /// signal's endpoint to the `OTEL_EXPORTER_OTLP_*ENDPOINT` variables, which the exporter
    /// reads.
    pub endpoint: Option<String>,
    /// Each signal's protocol; `None` when it is not exported.
    pub traces: Option<Protocol>,
    pub metrics: Option<Protocol>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default).
    pub timeout: Duration,
    /// The collector's CA and client identity (`OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`).
    pub tls: TlsOptions,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            endpoint: None,
            traces: Some(Protocol::HttpBinary),
            metrics: Some(Protocol::HttpBinary),
            timeout: Duration::from_secs(10),
            tls: TlsOptions::default(),
        }
    }
}

const SIGNALS: [&str; 2] = ["TRACES", "METRICS"];

impl TelemetryConfig {
    /// The configuration the standard variables give; `Ok(None)` when they ask for nothing (no
    /// endpoint, `OTEL_SDK_DISABLED=true`, or both signals' exporters `none`); `Err` names a
    /// value this host cannot follow.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let general = set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let mut protocols = [None, None];
        for (signal, protocol) in SIGNALS.iter().zip(&mut protocols) {
            // No endpoint for this signal: its other variables are another tool's business.
            if !general && set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")).is_none() {
                continue;
            }
            let exporter = format!("OTEL_{signal}_EXPORTER");
            match set(&exporter).map(|e| e.to_ascii_lowercase()).as_deref() {
                None | Some("otlp") => {}
                Some("none") => continue,
                Some(other) => {
                    return Err(format!(
                        "{exporter}={other:?}: this host exports OTLP only (`otlp`, or `none`)"
                    ));
                }
            }
            let own = format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL");
            let (name, value) = match set(&own) {
                Some(value) => (own, value),
                None => (
                    "OTEL_EXPORTER_OTLP_PROTOCOL".into(),
                    set("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or("http/protobuf".into()),
                ),
            };
            *protocol = Some(match value.as_str() {
                "http/protobuf" => Protocol::HttpBinary,
                "http/json" => Protocol::HttpJson,
                other => {
                    return Err(format!(
                        "{name}={other:?}: this host exports OTLP over HTTP only, \
                         `http/protobuf` (the collector's port 4318) or `http/json`"
                    ));
                }
            });
        }
        let [traces, metrics] = protocols;
        if traces.is_none() && metrics.is_none() {
            return Ok(None);
        }
        let timeout = match set("OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => Duration::from_secs(10),
            Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
                format!("OTEL_EXPORTER_OTLP_TIMEOUT={ms:?}: expected milliseconds, such as 10000")
            })?),
        };
        let path = |name: &str| set(name).map(PathBuf::from);
        Ok(Some(TelemetryConfig {
            endpoint: None,
            traces,
            metrics,
            timeout,
            tls: TlsOptions {
                ca_bundle: path("OTEL_EXPORTER_OTLP_CERTIFICATE"),
                client_cert: path("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
                client_key: path("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Option<TelemetryConfig>, String> {
        TelemetryConfig::from_env(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    const ENDPOINT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");

    #[test]
    fn nothing_is_exported_unless_an_endpoint_is_set() {
        assert!(config(&[]).unwrap().is_none());
        assert!(config(&[("OTEL_SERVICE_NAME", "x")]).unwrap().is_none());
        // Another tool's exporter, with no endpoint for this host: nothing to say.
        assert!(
            config(&[("OTEL_TRACES_EXPORTER", "console")])
                .unwrap()
                .is_none()
        );
        let both = config(&[ENDPOINT]).unwrap().unwrap();
        assert_eq!(
            (both.traces, both.metrics),
            (Some(Protocol::HttpBinary), Some(Protocol::HttpBinary))
        );
        assert!(
            config(&[ENDPOINT, ("OTEL_SDK_DISABLED", "true")])
                .unwrap()
                .is_none()
        );
        let traces_only = config(&[ENDPOINT, ("OTEL_METRICS_EXPORTER", "none")])
            .unwrap()
            .unwrap();
        assert!(traces_only.traces.is_some() && traces_only.metrics.is_none());
        let none = [
            ENDPOINT,
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        assert!(config(&none).unwrap().is_none());
        let metrics_only = config(&[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://127.0.0.1:4318/v1/metrics",
        )])
        .unwrap()
        .unwrap();
        assert!(metrics_only.traces.is_none() && metrics_only.metrics.is_some());
    }

    #[test]
    fn the_protocol_is_read_for_both_signals_and_for_each() {
        let json = config(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (json.traces, json.metrics),
            (Some(Protocol::HttpJson), Some(Protocol::HttpJson))
        );
        let mixed = config(&[
            ENDPOINT,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (mixed.traces, mixed.metrics),
            (Some(Protocol::HttpJson), Some(Protocol::HttpBinary))
        );
    }

    #[test]
    fn a_value_this_host_cannot_follow_is_named() {
        for (vars, named) in [
            (
                vec![ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\"",
            ),
            (
                vec![ENDPOINT, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            ),
            (
                vec![ENDPOINT, ("OTEL_TRACES_EXPORTER", "console")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![ENDPOINT, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
        ] {
            let error = config(&vars).unwrap_err();
            assert!(error.contains(named), "{error}");
        }
        let ms = config(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")])
            .unwrap()
            .unwrap();
        assert_eq!(ms.timeout, Duration::from_millis(2500));
    }
}

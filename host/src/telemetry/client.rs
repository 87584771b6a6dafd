//! The exporter's HTTP client: the host's own sender, on a small runtime of its own.
//!
//! The SDK exports from its own threads and waits on the future it is given; the sender needs
//! a tokio reactor, so each export runs as a task of this runtime and the SDK waits on its
//! handle. One HTTP and TLS stack for the guest's requests and the exporter's: the same proxies,
//! the same trust, and the tripwire in test builds.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use wasmtime_wasi_http::RequestOptions;

use crate::http::policy::AddressAllowance;
use crate::http::sender::Sender;

/// A collector runs beside the host (loopback), as a sidecar or on the private network; no
/// instance metadata service is a collector.
const COLLECTOR_ADDRESSES: AddressAllowance = AddressAllowance {
    loopback: true,
    link_local: true,
    metadata: false,
    private: true,
};

pub(super) struct Client {
    pub(super) sender: Sender,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let sender = self.sender.clone();
        let options = RequestOptions {
            connect_timeout: Some(self.timeout),
            first_byte_timeout: Some(self.timeout),
            between_bytes_timeout: Some(self.timeout),
        };
        let (mut parts, body) = request.into_parts();
        // The sender writes the origin form, so the host goes in `Host` (without any user
        // information the endpoint's URL had).
        if let Some(authority) = parts.uri.authority() {
            let host = match authority.port() {
                Some(port) => format!("{}:{port}", authority.host()),
                None => authority.host().to_string(),
            };
            if let Ok(host) = http::HeaderValue::from_str(&host) {
                parts.headers.insert(http::header::HOST, host);
            }
        }
        let body = Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        let request = http::Request::from_parts(parts, body);
        let exported = self.runtime.spawn(async move {
            let (response, io) = sender
                .send(request, options, COLLECTOR_ADDRESSES)
                .await
                .map_err(|e| format!("cannot reach the collector: {e}"))?;
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| format!("the collector's answer broke off: {e}"))?
                .to_bytes();
            let _ = Box::into_pin(io).await;
            Ok::<_, String>(Response::from_parts(parts, body))
        });
        match exported.await {
            Ok(Ok(response)) if response.status().is_success() => Ok(response),
            Ok(Ok(response)) => Err(format!("the collector answered {}", response.status()).into()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(format!("the export stopped: {e}").into()),
        }
    }
}

//! The baseline: the same statements over the same HTTP stack, without the component.
//!
//! The guest's own code (`clickhouse_state::store::Store`), compiled natively, sends its
//! requests through the host's sender (same keep-alive pool, same TLS) from the host process.
//! So both paths run the same SQL in the same number of round trips, and the difference
//! between them is what the component costs: the wasm boundary, wasi:http, and the guest's
//! logic running as wasm.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clickhouse_state::config::Scheme;
use clickhouse_state::http::{Request, Response, Transport, TransportError};
use clickhouse_state::session::{Level, Platform};
use clickhouse_state::store::Store;
use http_body_util::{BodyExt, Full};
use integration_tests::state_host::http::policy::AddressAllowance;
use integration_tests::state_host::http::pool::PoolLimits;
use integration_tests::state_host::http::sender::Sender;
use integration_tests::state_host::http::tls::{LazyClientConfig, TlsOptions};
use wasmtime_wasi_http::RequestOptions;

pub type NativeStore = Store<NativeTransport, NativeHost>;

/// Opens the guest's store natively over the host's sender; also returns the count of response
/// body bytes it receives.
pub fn open(
    uri: &str,
    settings: &[(String, String)],
    tokio: tokio::runtime::Handle,
    keep_alive: PoolLimits,
    tls: &TlsOptions,
) -> (NativeStore, Rc<Cell<u64>>) {
    let config = LazyClientConfig::new(tls).expect("TLS configuration");
    let bytes_in = Rc::new(Cell::new(0));
    let transport = NativeTransport {
        sender: Sender::new(std::sync::Arc::new(config), Default::default())
            .for_instance(keep_alive),
        tokio,
        bytes_in: Rc::clone(&bytes_in),
    };
    let store = Store::open(uri, settings, transport, NativeHost).expect("opens natively");
    (store, bytes_in)
}

pub struct NativeTransport {
    sender: Sender,
    tokio: tokio::runtime::Handle,
    bytes_in: Rc<Cell<u64>>,
}

impl Transport for NativeTransport {
    fn send(&self, request: Request) -> Result<Response, TransportError> {
        let scheme = match request.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let mut builder = http::Request::post(format!(
            "{scheme}://{}{}",
            request.authority, request.path_and_query
        ));
        for (name, value) in &request.headers {
            builder = builder.header(name.as_str(), value.as_slice());
        }
        let body = Full::new(Bytes::copy_from_slice(&request.body))
            .map_err(|never| match never {})
            .boxed_unsync();
        let http_request = builder
            .body(body)
            .map_err(|e| TransportError::Unreachable(e.to_string()))?;
        let options = RequestOptions {
            connect_timeout: Some(Duration::from_secs(10)),
            first_byte_timeout: Some(Duration::from_secs(30)),
            between_bytes_timeout: Some(Duration::from_secs(30)),
        };
        let sender = self.sender.clone();
        let (status, headers, body) = self
            .tokio
            .block_on(async move {
                let (response, _io) = sender
                    .send(http_request, options, AddressAllowance::loopback())
                    .await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, wasmtime_wasi_http::Error>((parts.status, parts.headers, body))
            })
            .map_err(|e| TransportError::Unreachable(format!("{e:?}")))?;
        self.bytes_in.set(self.bytes_in.get() + body.len() as u64);
        Ok(Response {
            status: status.as_u16(),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.to_vec(),
        })
    }
}

/// Time, randomness and a log for the native store (the component gets them from the host).
pub struct NativeHost;

impl Platform for NativeHost {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn sleep_ms(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    fn random_u128(&self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }

    fn log(&self, _level: Level, _message: &str) {}
}

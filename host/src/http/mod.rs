//! The guest's outgoing HTTP: the policy of what it may reach (`policy`), the wasi:http hook
//! that applies it (`hook`), the sender with its keep-alive pool, TLS and proxies (`sender`,
//! `pool`, `tls`, `proxy`), the tripwire that keeps test builds on this machine (`tripwire`), and, for tests
//! only, fault injection as a decorator around the sender (`faults`, behind the `faults`
//! feature: the production hook does not know faults exist).

use std::pin::Pin;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

pub mod hook;
pub mod policy;
pub mod pool;
pub mod proxy;
pub mod sender;
pub mod tls;
pub mod tripwire;

#[cfg(feature = "faults")]
pub mod faults;

use policy::AddressAllowance;
use sender::{Sender, Sent};

/// The future of one exchange.
pub type Exchanging = Pin<Box<dyn Future<Output = Result<Sent, HttpError>> + Send>>;

/// Sends a request the policy allowed: the instance's [`Sender`], or a decorator around it.
pub trait Exchange: Send + Sync + 'static {
    fn exchange(
        &self,
        request: http::Request<WasiBody>,
        options: RequestOptions,
        addresses: AddressAllowance,
    ) -> Exchanging;
}

impl Exchange for Sender {
    fn exchange(
        &self,
        request: http::Request<WasiBody>,
        options: RequestOptions,
        addresses: AddressAllowance,
    ) -> Exchanging {
        let sender = self.clone();
        Box::pin(async move { sender.send(request, options, addresses).await })
    }
}

//! Keep-alive connections of one instance, by destination, so that a guest's requests do not
//! each pay a TCP connect and a TLS handshake (against ClickHouse Cloud, a handshake per
//! operation otherwise).
//!
//! One pool per instance (so per tenant): connections are never shared across tenants. Each
//! destination (scheme, host, port) keeps at most `max_idle` idle connections, each for at most
//! `idle_timeout`, below the keep-alive timeouts servers use (ClickHouse: 10 s or more), so a
//! reused connection is rarely one the server is closing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;
use wasmtime_wasi_http::WasiBody;

/// How long a pooled connection may take to become ready for its next request.
const READY_WAIT: Duration = Duration::from_secs(1);

/// How a pool is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Idle connections kept per destination; 0 turns keep-alive off.
    pub max_idle: usize,
    /// How long an idle connection is kept.
    pub idle_timeout: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            max_idle: 2,
            idle_timeout: Duration::from_secs(8),
        }
    }
}

impl PoolLimits {
    /// No keep-alive: a connection per request.
    pub fn off() -> Self {
        PoolLimits {
            max_idle: 0,
            ..PoolLimits::default()
        }
    }
}

/// Where a connection goes, and through which proxy (host and port), if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Destination {
    pub https: bool,
    pub host: String,
    pub port: u16,
    pub proxy: Option<(String, u16)>,
}

/// An open HTTP/1.1 connection, with the address it was made to (checked when it was made, and
/// again before each reuse), or none through a proxy (whose address the policy does not hold
/// to the address classes: see `proxy`).
pub(crate) struct Connection {
    pub sender: SendRequest<WasiBody>,
    pub peer: Option<IpAddr>,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

/// Idle connections by destination.
pub(crate) struct Pool {
    limits: PoolLimits,
    idle: Mutex<HashMap<Destination, Vec<Idle>>>,
}

impl Pool {
    pub fn new(limits: PoolLimits) -> Arc<Pool> {
        Arc::new(Pool {
            limits,
            idle: Mutex::new(HashMap::new()),
        })
    }

    pub fn enabled(&self) -> bool {
        self.limits.max_idle > 0
    }

    /// The most recently pooled connection to `destination` that is still fresh. The caller
    /// waits for it to be ready (see [`Pool::ready`]) before sending on it.
    pub fn take(&self, destination: &Destination) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(destination)?;
        while let Some(entry) = list.pop() {
            if entry.since.elapsed() < self.limits.idle_timeout
                && !entry.connection.sender.is_closed()
            {
                return Some(entry.connection);
            }
        }
        None
    }

    /// Waits until a taken connection can carry a request: at once when its last response has
    /// been read, an error when the server closed it. Bounded, so a connection in an odd state
    /// costs a new connection, not a hang.
    pub async fn ready(connection: &mut Connection) -> bool {
        matches!(
            tokio::time::timeout(READY_WAIT, connection.sender.ready()).await,
            Ok(Ok(()))
        )
    }

    /// Keeps `connection` for the next request to `destination`: called when its response body
    /// has been read to the end, before the guest sees that end, so its next request finds it.
    /// A full pool drops it (which closes it).
    pub fn put(&self, destination: Destination, connection: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(destination).or_default();
        list.retain(|entry| entry.since.elapsed() < self.limits.idle_timeout);
        if list.len() < self.limits.max_idle {
            list.push(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }
}

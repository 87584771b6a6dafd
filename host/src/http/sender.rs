//! The outgoing HTTP sender behind the wasi:http hook: TCP, TLS with our trust settings, HTTP/1.1.
//!
//! wasmtime-wasi-http's `default_send_request` trusts only its compiled-in web roots, so it
//! cannot reach a server with a private CA or present a client certificate. This sender does the
//! same job with a rustls configuration of ours (see `tls`), and honours the (clamped) connect,
//! first-byte and between-bytes timeouts. Connections are kept alive and reused through a pool
//! of the instance's own (see `pool`). A request may go through an HTTP proxy (see `proxy`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, TlsAlertReceivedPayload};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::policy::AddressAllowance;
use super::pool::{Connection, Destination, Pool, PoolLimits};
use super::proxy::{self, Proxies};
use super::tls::LazyClientConfig;
use super::tripwire;

/// A response and the future that reports the connection's own failures.
pub type Sent = (
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
);

/// Sends requests with one TLS configuration, reusing keep-alive connections from its pool.
/// Clones share the pool; [`Sender::for_instance`] makes one with a pool of its own.
#[derive(Clone)]
pub struct Sender {
    tls: Arc<LazyClientConfig>,
    proxies: Arc<Proxies>,
    pool: Arc<Pool>,
}

impl Sender {
    /// A sender without keep-alive (a connection per request).
    pub fn new(tls: Arc<LazyClientConfig>, proxies: Arc<Proxies>) -> Self {
        Sender {
            tls,
            proxies,
            pool: Pool::new(PoolLimits::off()),
        }
    }

    /// A sender with the same TLS configuration and a pool of its own: one per instance, so
    /// that no connection is shared between tenants.
    pub fn for_instance(&self, limits: PoolLimits) -> Self {
        Sender {
            tls: Arc::clone(&self.tls),
            proxies: Arc::clone(&self.proxies),
            pool: Pool::new(limits),
        }
    }

    pub async fn send(
        &self,
        mut request: http::Request<WasiBody>,
        options: RequestOptions,
        addresses: AddressAllowance,
    ) -> Result<Sent, HttpError> {
        let uri = request.uri().clone();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let authority = uri.authority().ok_or(HttpError::HttpRequestUriInvalid)?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let connect_timeout = options.connect_timeout.unwrap_or(Duration::from_secs(10));
        let first_byte_timeout = options
            .first_byte_timeout
            .unwrap_or(Duration::from_secs(30));
        let between_bytes = options
            .between_bytes_timeout
            .unwrap_or(Duration::from_secs(30))
            .max(Duration::from_millis(1));

        let route = self.proxies.route(&uri);
        match &route {
            // A proxy takes plain http in the absolute form, with its credentials.
            Some(route) if !https => {
                // Rebuilt from what the policy checked: no user information goes on.
                let path = uri.path_and_query().map_or("/", |p| p.as_str());
                let authority = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                *request.uri_mut() = http::Uri::try_from(format!("http://{authority}{path}"))
                    .map_err(|_| HttpError::HttpRequestUriInvalid)?;
                if let Some(auth) = &route.auth {
                    request
                        .headers_mut()
                        .insert(http::header::PROXY_AUTHORIZATION, auth.clone());
                }
            }
            // HTTP/1.1 sends the origin form (path and query) to the server itself, and in a
            // tunnel.
            _ => {
                let path = uri.path_and_query().map_or("/", |p| p.as_str());
                *request.uri_mut() =
                    http::Uri::try_from(path).map_err(|_| HttpError::HttpRequestUriInvalid)?;
            }
        }
        let destination = Destination {
            https,
            host: host.clone(),
            port,
            proxy: route.as_ref().map(|r| (r.host.clone(), r.port)),
        };

        while let Some(mut connection) = self.pool.take(&destination) {
            // The address allowance is checked again on every reuse, not only at connect time.
            let refused = match connection.peer {
                Some(peer) => addresses.check(peer).is_err(),
                // Through a proxy, which connects anew for each plain request: the destination
                // is checked again (see `proxy`).
                None => proxy::check_destination(&host, port, addresses)
                    .await
                    .is_err(),
            };
            if refused || !Pool::ready(&mut connection).await {
                continue;
            }
            let sent = tokio::time::timeout(
                first_byte_timeout,
                connection.sender.try_send_request(request),
            )
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)?;
            match sent {
                Ok(response) => {
                    let recycle = Recycle::new(&self.pool, destination, connection);
                    let done: Box<dyn Future<Output = _> + Send> = Box::new(async { Ok(()) });
                    return Ok((timed(response, between_bytes, recycle), done));
                }
                // Closed before the request went out (the server ended the keep-alive): the
                // request is intact, so another connection may carry it.
                Err(mut error) => match error.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(HttpError::Hyper(error.into_error())),
                },
            }
        }

        let timeouts = Timeouts {
            connect: connect_timeout,
            first_byte: first_byte_timeout,
            between_bytes,
        };
        if let Some(route) = route {
            return self
                .send_through(route, request, timeouts, destination, addresses)
                .await;
        }
        let tcp = tokio::time::timeout(connect_timeout, connect(&host, port, addresses))
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        let peer = tcp.peer_addr().map_err(HttpError::Connect)?.ip();
        // Small requests and responses: do not wait to coalesce.
        tcp.set_nodelay(true).ok();
        if https {
            let name = ServerName::try_from(host.clone()).map_err(|_| {
                HttpError::InternalError(Some(format!("'{host}' is not a valid TLS server name")))
            })?;
            let tls = self.handshake(name, tcp, connect_timeout).await?;
            self.exchange(tls, request, timeouts, destination, Some(peer))
                .await
        } else {
            self.exchange(tcp, request, timeouts, destination, Some(peer))
                .await
        }
    }

    /// A new connection through the proxy of `route`: a tunnel for https, the proxy itself for
    /// http. The destination is checked first (see `proxy`).
    async fn send_through(
        &self,
        route: proxy::Route,
        request: http::Request<WasiBody>,
        timeouts: Timeouts,
        destination: Destination,
        addresses: AddressAllowance,
    ) -> Result<Sent, HttpError> {
        let (host, port) = (destination.host.clone(), destination.port);
        // Checked before anything goes to the proxy.
        let name = if destination.https {
            Some(ServerName::try_from(host.clone()).map_err(|_| {
                HttpError::InternalError(Some(format!("'{host}' is not a valid TLS server name")))
            })?)
        } else {
            None
        };
        let connected = async {
            proxy::check_destination(&host, port, addresses).await?;
            let tcp = proxy::connect(&route).await?;
            tcp.set_nodelay(true).ok();
            Ok::<_, HttpError>(tcp)
        };
        let tcp = tokio::time::timeout(timeouts.connect, connected)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        let Some(name) = name else {
            return self
                .exchange(tcp, request, timeouts, destination, None)
                .await;
        };
        let tunnel = tokio::time::timeout(
            timeouts.connect,
            proxy::tunnel(tcp, &host, port, route.auth.clone()),
        )
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;
        let tls = self.handshake(name, tunnel, timeouts.connect).await?;
        self.exchange(tls, request, timeouts, destination, None)
            .await
    }

    /// TLS to `name` over `stream`, with our trust settings.
    async fn handshake<S>(
        &self,
        name: ServerName<'static>,
        stream: S,
        timeout: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<S>, HttpError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        // Fails only as the check at start-up would have (see `LazyClientConfig::get`); the
        // guest learns the kind, not the host's file names.
        let config = self.tls.get().map_err(|e| {
            tracing::error!("TLS configuration: {e}");
            HttpError::TlsCertificateError
        })?;
        let connector = tokio_rustls::TlsConnector::from(config);
        tokio::time::timeout(timeout, connector.connect(name, stream))
            .await
            .map_err(|_| HttpError::ConnectionTimeout)?
            .map_err(HttpError::Tls)
    }

    /// Opens HTTP/1.1 on a new connection and sends `request`; the connection goes to the pool
    /// afterwards when keep-alive is on.
    async fn exchange<S>(
        &self,
        stream: S,
        request: http::Request<WasiBody>,
        timeouts: Timeouts,
        destination: Destination,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Sent, HttpError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sender, connection) = tokio::time::timeout(
            timeouts.connect,
            hyper::client::conn::http1::handshake(TokioIo::new(stream)),
        )
        .await
        .map_err(|_| HttpError::ConnectionTimeout)?
        .map_err(HttpError::Hyper)?;
        // The connection is driven by its own task until it closes: after this response when
        // it is not pooled, or when the pool lets it go.
        let driver = tokio::spawn(connection);
        let response = tokio::time::timeout(timeouts.first_byte, sender.send_request(request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)?
            .map_err(HttpError::Hyper)?;
        let recycle = Recycle::new(&self.pool, destination, Connection { sender, peer });
        if recycle.is_some() {
            let response = timed(response, timeouts.between_bytes, recycle);
            return Ok((response, Box::new(async { Ok(()) })));
        }
        let response = timed(response, timeouts.between_bytes, None);
        let io = async move {
            match driver.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(HttpError::Hyper(e)),
                Err(e) => Err(HttpError::InternalError(Some(format!(
                    "the connection task failed: {e}"
                )))),
            }
        };
        Ok((response, Box::new(io)))
    }
}

#[derive(Clone, Copy)]
struct Timeouts {
    connect: Duration,
    first_byte: Duration,
    between_bytes: Duration,
}

/// A connection to give back to its pool once its response body ends.
struct Recycle {
    pool: Arc<Pool>,
    destination: Destination,
    connection: Connection,
}

impl Recycle {
    fn new(pool: &Arc<Pool>, destination: Destination, connection: Connection) -> Option<Self> {
        pool.enabled().then(|| Recycle {
            pool: Arc::clone(pool),
            destination,
            connection,
        })
    }

    fn done(self) {
        self.pool.put(self.destination, self.connection);
    }
}

fn timed(
    response: http::Response<hyper::body::Incoming>,
    between_bytes: Duration,
    recycle: Option<Recycle>,
) -> http::Response<WasiBody> {
    response.map(|incoming| {
        TimedBody {
            inner: incoming,
            between_bytes,
            deadline: Box::pin(tokio::time::sleep(between_bytes)),
            recycle,
        }
        .boxed_unsync()
    })
}

/// Resolves `host`, drops the addresses the policy refuses, and connects to the first that
/// answers; the tripwire, when armed, stands between the policy and the network. Connecting to
/// the checked address itself (not the name again) leaves no room for a DNS answer that
/// changes between the check and the connection.
async fn connect(
    host: &str,
    port: u16,
    addresses: AddressAllowance,
) -> Result<TcpStream, HttpError> {
    tripwire::check_name(host)?;
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| HttpError::DnsError {
            rcode: Some(format!("cannot resolve {host}: {e}")),
            info_code: None,
        })?
        .collect();
    let mut refused = Vec::new();
    let mut last_error = None;
    for addr in resolved {
        if let Err(class) = addresses.check(addr.ip()) {
            refused.push(format!("{} ({class})", addr.ip()));
            continue;
        }
        tripwire::check_address(host, addr.ip())?;
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    match last_error {
        Some(e) => Err(connect_error(e)),
        None if !refused.is_empty() => {
            tracing::warn!(target: "egress", host, port, refused = %refused.join(", "), "destination address refused");
            Err(HttpError::DestinationIpProhibited)
        }
        None => Err(HttpError::DnsError {
            rcode: Some(format!("{host} has no address")),
            info_code: None,
        }),
    }
}

fn connect_error(error: std::io::Error) -> HttpError {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => HttpError::ConnectionRefused,
        _ => HttpError::Connect(error),
    }
}

/// A response body that fails when no byte arrives for `between_bytes`, and that gives its
/// connection back to the pool when it ends (a body dropped early takes it down with it).
struct TimedBody {
    inner: hyper::body::Incoming,
    between_bytes: Duration,
    deadline: Pin<Box<Sleep>>,
    recycle: Option<Recycle>,
}

impl TimedBody {
    fn ended(&mut self) {
        if let Some(recycle) = self.recycle.take() {
            recycle.done();
        }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = Instant::now() + self.between_bytes;
                self.deadline.as_mut().reset(next);
                if self.inner.is_end_stream() {
                    self.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.recycle = None;
                Poll::Ready(Some(Err(HttpError::Hyper(e))))
            }
            Poll::Ready(None) => {
                self.ended();
                Poll::Ready(None)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A TLS failure as a wasi:http error code, and what the host can add that the code cannot
/// carry (the guest names the code; the host appends this to its message).
pub fn tls_failure(error: &std::io::Error) -> (ErrorCode, Option<String>) {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(reason)) => (
            ErrorCode::TlsCertificateError,
            Some(format!("the server's certificate was rejected: {reason:?}")),
        ),
        Some(rustls::Error::AlertReceived(alert)) => (
            ErrorCode::TlsAlertReceived(TlsAlertReceivedPayload {
                alert_id: None,
                alert_message: Some(format!("{alert:?}")),
            }),
            None,
        ),
        Some(rustls::Error::InvalidMessage(_))
        | Some(rustls::Error::InappropriateMessage { .. }) => (
            ErrorCode::TlsProtocolError,
            Some("the server did not answer with TLS (is it plain HTTP?)".into()),
        ),
        Some(other) => (ErrorCode::TlsProtocolError, Some(other.to_string())),
        None => (ErrorCode::TlsProtocolError, Some(error.to_string())),
    }
}

//! What a guest may reach: the `send_request` hook of wasi:http.
//!
//! By default a guest reaches exactly the scheme, host and port of its configured ClickHouse and
//! nothing else. Every other request is refused with `HttpRequestDenied`, which the guest turns
//! into an `unreachable` error naming its endpoint, and which the host logs with the refused
//! authority. Timeouts the guest asks for are clamped to the host's limits.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use http::HeaderName;

use crate::clock::Clock;
use crate::faults::Fault;
use crate::sender::{Sender, describe_tls_error};

/// One authority a guest may call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// `http` or `https`.
    pub scheme: String,
    /// Lower-case host name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

impl Authority {
    pub fn new(scheme: &str, host: &str, port: u16) -> Self {
        Authority {
            scheme: scheme.to_ascii_lowercase(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port,
        }
    }

    /// The authority of a request URI, with the scheme's default port when none is given.
    pub fn of_uri(uri: &http::Uri) -> Option<Self> {
        let scheme = uri.scheme_str()?;
        let authority = uri.authority()?;
        let port = authority.port_u16().or(match scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })?;
        Some(Authority::new(scheme, authority.host(), port))
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.scheme, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

/// Kinds of destination address that are refused after name resolution unless allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// 127.0.0.0/8, ::1, and the unspecified 0.0.0.0 / :: (which reach the local host).
    Loopback,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// Cloud instance metadata: 169.254.169.254, 169.254.170.2, fd00:ec2::254.
    Metadata,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Loopback => "loopback",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Metadata => "cloud metadata",
        })
    }
}

impl AddressClass {
    /// The special class of an address, IPv4-mapped IPv6 forms included; `None` for ordinary
    /// addresses.
    pub fn of(ip: IpAddr) -> Option<AddressClass> {
        let ip = match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            },
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                if o == [169, 254, 169, 254] || o == [169, 254, 170, 2] {
                    Some(AddressClass::Metadata)
                } else if v4.is_loopback() || v4.is_unspecified() {
                    Some(AddressClass::Loopback)
                } else if v4.is_link_local() {
                    Some(AddressClass::LinkLocal)
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                let s = v6.segments();
                if s == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
                    Some(AddressClass::Metadata)
                } else if v6.is_loopback() || v6.is_unspecified() {
                    Some(AddressClass::Loopback)
                } else if (s[0] & 0xffc0) == 0xfe80 {
                    Some(AddressClass::LinkLocal)
                } else {
                    None
                }
            }
        }
    }
}

/// Which special address classes a guest may connect to (none by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressAllowance {
    pub loopback: bool,
    pub link_local: bool,
    pub metadata: bool,
}

impl AddressAllowance {
    /// Loopback only: what a local ClickHouse in development and tests needs.
    pub fn loopback() -> Self {
        AddressAllowance {
            loopback: true,
            ..AddressAllowance::default()
        }
    }

    /// `Err(class)` when `ip` is of a class not allowed.
    pub fn check(&self, ip: IpAddr) -> Result<(), AddressClass> {
        match AddressClass::of(ip) {
            None => Ok(()),
            Some(AddressClass::Loopback) if self.loopback => Ok(()),
            Some(AddressClass::LinkLocal) if self.link_local => Ok(()),
            Some(AddressClass::Metadata) if self.metadata => Ok(()),
            Some(class) => Err(class),
        }
    }
}

/// Upper bounds on the timeouts a guest may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutLimits {
    pub connect: Duration,
    pub first_byte: Duration,
    pub between_bytes: Duration,
}

impl Default for TimeoutLimits {
    fn default() -> Self {
        TimeoutLimits {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(30),
            between_bytes: Duration::from_secs(30),
        }
    }
}

impl TimeoutLimits {
    pub(crate) fn clamp(&self, asked: Option<RequestOptions>) -> RequestOptions {
        let asked = asked.unwrap_or_default();
        let pick =
            |asked: Option<Duration>, limit: Duration| Some(asked.map_or(limit, |a| a.min(limit)));
        RequestOptions {
            connect_timeout: pick(asked.connect_timeout, self.connect),
            first_byte_timeout: pick(asked.first_byte_timeout, self.first_byte),
            between_bytes_timeout: pick(asked.between_bytes_timeout, self.between_bytes),
        }
    }
}

/// The policy for one guest instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    allowed: Vec<Authority>,
    timeouts: TimeoutLimits,
    addresses: AddressAllowance,
}

impl EgressPolicy {
    pub fn allow_only(allowed: Vec<Authority>) -> Self {
        EgressPolicy {
            allowed,
            timeouts: TimeoutLimits::default(),
            addresses: AddressAllowance::default(),
        }
    }

    /// Special address classes (loopback, link-local, metadata) this guest may connect to.
    pub fn with_addresses(mut self, addresses: AddressAllowance) -> Self {
        self.addresses = addresses;
        self
    }

    pub fn with_timeouts(mut self, timeouts: TimeoutLimits) -> Self {
        self.timeouts = timeouts;
        self
    }

    pub fn allowed(&self) -> &[Authority] {
        &self.allowed
    }

    /// `Ok` when the request may go; otherwise the refused authority, for the log.
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        match Authority::of_uri(uri) {
            Some(authority) if self.allowed.contains(&authority) => Ok(()),
            Some(authority) => Err(authority.to_string()),
            None => Err(format!("{uri} (no scheme or authority)")),
        }
    }
}

/// Forbidden on top of wasmtime's defaults (names are lower case).
const EXTRA_FORBIDDEN_HEADERS: &[&str] = &[
    "te",
    "trailer",
    "expect",
    "via",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "content-length",
];

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

/// Sees every request a guest sends that its policy allowed, before it goes out. Tests use it
/// to count round trips and to delay chosen requests (in the instance's clock's time).
pub trait Interceptor: Send + Sync + 'static {
    /// How long to hold this request back, if at all.
    fn before_send(&self, method: &http::Method, uri: &http::Uri) -> Option<Duration>;

    /// A fault to inject into this request's exchange, if any (see `faults`).
    fn fault(&self, _method: &http::Method, _uri: &http::Uri) -> Option<Fault> {
        None
    }
}

/// The wasi:http hook of one instance: its policy decides, its sender sends.
pub struct OutgoingHook {
    policy: EgressPolicy,
    sender: Sender,
    clock: Arc<dyn Clock>,
    interceptor: Option<Arc<dyn Interceptor>>,
}

impl OutgoingHook {
    pub fn new(
        policy: EgressPolicy,
        sender: Sender,
        clock: Arc<dyn Clock>,
        interceptor: Option<Arc<dyn Interceptor>>,
    ) -> Self {
        OutgoingHook {
            policy,
            sender,
            clock,
            interceptor,
        }
    }
}

impl WasiHttpHooks for OutgoingHook {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        drop(fut);
        if let Err(refused) = self.policy.check(request.uri()) {
            tracing::warn!(target: "egress", authority = %refused, "request denied: not an allowed ClickHouse endpoint");
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let options = self.policy.timeouts.clamp(options);
        let addresses = self.policy.addresses;
        let sender = self.sender.clone();
        let delay = self
            .interceptor
            .as_ref()
            .and_then(|i| i.before_send(request.method(), request.uri()));
        let fault = self
            .interceptor
            .as_ref()
            .and_then(|i| i.fault(request.method(), request.uri()));
        let pause = delay.map(|d| self.clock.sleep(d.as_millis() as u64));
        Box::new(async move {
            if let Some(pause) = pause {
                pause.await;
            }
            match fault {
                None => sender.send(request, options, addresses).await,
                Some(fault) => {
                    crate::faults::apply(fault, sender, request, options, addresses).await
                }
            }
        })
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        // wasmtime's list (hop-by-hop, Host, proxy credentials) plus headers that could make
        // a request look as if it came from somewhere else, or change its framing.
        Arc::new(|name: &HeaderName| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name)
                || EXTRA_FORBIDDEN_HEADERS.contains(&name.as_str())
        })
    }

    fn p2_error_from_tls(&mut self, err: &std::io::Error) -> ErrorCode {
        let message = describe_tls_error(err);
        tracing::debug!(target: "egress", "{message}");
        ErrorCode::InternalError(Some(message))
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        match err.kind() {
            std::io::ErrorKind::ConnectionRefused => ErrorCode::ConnectionRefused,
            _ => ErrorCode::InternalError(Some(format!("connect failed: {err}"))),
        }
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        // A TLS failure after the handshake (a server refusing our client certificate, say)
        // surfaces as an I/O error inside hyper's.
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>().filter(|io| {
                io.get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>())
            }) {
                return ErrorCode::InternalError(Some(describe_tls_error(io)));
            }
            source = cause.source();
        }
        if err.is_incomplete_message() || err.is_canceled() {
            return ErrorCode::ConnectionTerminated;
        }
        if err.is_parse() {
            return ErrorCode::InternalError(Some(format!(
                "the answer is not HTTP ({err}); is this a TLS port that needs secure=true?"
            )));
        }
        ErrorCode::InternalError(Some(format!("HTTP: {err}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EgressPolicy {
        EgressPolicy::allow_only(vec![Authority::new("http", "127.0.0.1", 8123)])
    }

    fn uri(text: &str) -> http::Uri {
        text.parse().expect("valid uri")
    }

    #[test]
    fn only_the_configured_authority_passes() {
        let p = policy();
        assert!(p.check(&uri("http://127.0.0.1:8123/?query=1")).is_ok());
        assert_eq!(
            p.check(&uri("http://127.0.0.1:8124/")),
            Err("http://127.0.0.1:8124".into())
        );
        assert_eq!(
            p.check(&uri("https://127.0.0.1:8123/")),
            Err("https://127.0.0.1:8123".into())
        );
        assert_eq!(
            p.check(&uri("http://localhost:8123/")),
            Err("http://localhost:8123".into())
        );
        assert_eq!(
            p.check(&uri("http://169.254.169.254/")),
            Err("http://169.254.169.254:80".into())
        );
    }

    #[test]
    fn host_comparison_ignores_case_and_brackets() {
        let p = EgressPolicy::allow_only(vec![
            Authority::new("https", "CH.Example.com", 8443),
            Authority::new("http", "[::1]", 8123),
        ]);
        assert!(p.check(&uri("https://ch.example.COM:8443/")).is_ok());
        assert!(p.check(&uri("http://[::1]:8123/")).is_ok());
    }

    #[test]
    fn special_addresses_are_classified() {
        let class = |s: &str| AddressClass::of(s.parse().unwrap());
        assert_eq!(class("127.0.0.1"), Some(AddressClass::Loopback));
        assert_eq!(class("127.9.9.9"), Some(AddressClass::Loopback));
        assert_eq!(class("0.0.0.0"), Some(AddressClass::Loopback));
        assert_eq!(class("::1"), Some(AddressClass::Loopback));
        assert_eq!(class("::"), Some(AddressClass::Loopback));
        assert_eq!(class("::ffff:127.0.0.1"), Some(AddressClass::Loopback));
        assert_eq!(class("169.254.169.254"), Some(AddressClass::Metadata));
        assert_eq!(
            class("::ffff:169.254.169.254"),
            Some(AddressClass::Metadata)
        );
        assert_eq!(class("fd00:ec2::254"), Some(AddressClass::Metadata));
        assert_eq!(class("169.254.10.1"), Some(AddressClass::LinkLocal));
        assert_eq!(class("fe80::1"), Some(AddressClass::LinkLocal));
        assert_eq!(class("10.1.2.3"), None);
        assert_eq!(class("2606:4700::1"), None);
    }

    #[test]
    fn allowances_open_one_class_at_a_time() {
        let loopback = AddressAllowance::loopback();
        assert!(loopback.check("127.0.0.1".parse().unwrap()).is_ok());
        assert_eq!(
            loopback.check("169.254.169.254".parse().unwrap()),
            Err(AddressClass::Metadata)
        );
        let link = AddressAllowance {
            link_local: true,
            ..AddressAllowance::default()
        };
        // metadata stays refused even where link-local is allowed
        assert_eq!(
            link.check("169.254.169.254".parse().unwrap()),
            Err(AddressClass::Metadata)
        );
        assert!(link.check("169.254.10.1".parse().unwrap()).is_ok());
        assert_eq!(
            AddressAllowance::default().check("::1".parse().unwrap()),
            Err(AddressClass::Loopback)
        );
    }

    #[test]
    fn timeouts_are_clamped() {
        let limits = TimeoutLimits::default();
        let asked = RequestOptions {
            connect_timeout: Some(Duration::from_secs(600)),
            first_byte_timeout: Some(Duration::from_secs(5)),
            between_bytes_timeout: None,
        };
        let got = limits.clamp(Some(asked));
        assert_eq!(got.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(got.first_byte_timeout, Some(Duration::from_secs(5)));
        assert_eq!(got.between_bytes_timeout, Some(Duration::from_secs(30)));
    }
}

//! What a guest may reach: the one ClickHouse authority of its configuration, the classes of
//! address allowed after name resolution, and bounds on the timeouts it asks for.
//!
//! By default a guest reaches exactly the scheme, host and port of its configured ClickHouse and
//! nothing else. Every other request is refused with `HttpRequestDenied`, which the guest turns
//! into an `unreachable` error naming its endpoint, and which the host logs with the refused
//! authority (see `hook`).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use wasmtime_wasi_http::RequestOptions;

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
    pub(crate) timeouts: TimeoutLimits,
    pub(crate) addresses: AddressAllowance,
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

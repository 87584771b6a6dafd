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
    /// Cloud instance metadata ([`METADATA_V4`], [`METADATA_V6`]): credentials live there, so no
    /// other class opens it.
    Metadata,
    /// Private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) and the other
    /// special-purpose ranges of the IANA registries that are not the public internet: other
    /// services inside a runner's network.
    Private,
}

/// Cloud metadata endpoints (IPv4): AWS, Azure, GCP and OpenStack (169.254.169.254), AWS ECS
/// task metadata (169.254.170.2), EKS pod identity (169.254.170.23), Alibaba Cloud
/// (100.100.100.200), Oracle Cloud (192.0.0.192).
pub const METADATA_V4: [[u8; 4]; 5] = [
    [169, 254, 169, 254],
    [169, 254, 170, 2],
    [169, 254, 170, 23],
    [100, 100, 100, 200],
    [192, 0, 0, 192],
];

/// Cloud metadata endpoints (IPv6): AWS's instance metadata (fd00:ec2::254) and EKS pod
/// identity (fd00:ec2::23).
pub const METADATA_V6: [[u16; 8]; 2] = [
    [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254],
    [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23],
];

/// IPv4 ranges of the private class, as (network, prefix length).
const PRIVATE_V4: [([u8; 4], u8); 14] = [
    ([0, 0, 0, 0], 8),       // "this network" (0.0.0.0 itself is loopback)
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // shared address space (carrier-grade NAT)
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation (TEST-NET-1)
    ([192, 31, 196, 0], 24), // AS112
    ([192, 52, 193, 0], 24), // AMT
    ([192, 88, 99, 0], 24),  // 6to4 relay anycast (deprecated)
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation (TEST-NET-2)
    ([203, 0, 113, 0], 24),  // documentation (TEST-NET-3)
    ([224, 0, 0, 0], 3),     // multicast (224/4) and reserved (240/4, broadcast included)
];

/// IPv6 ranges of the private class, as (network, prefix length). Ranges that embed an IPv4
/// address (mapped, NAT64, 6to4) are classified by that address instead.
const PRIVATE_V6: [([u16; 8], u8); 9] = [
    ([0, 0, 0, 0, 0, 0, 0, 0], 96),         // IPv4-compatible (deprecated)
    ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), // local-use NAT64
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64),     // discard-only
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),    // IETF protocol assignments (Teredo, ...)
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),    // documentation
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),     // unique local (private)
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),    // site-local (deprecated)
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),     // multicast
];

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Loopback => "loopback",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Metadata => "cloud metadata",
            AddressClass::Private => "private network",
        })
    }
}

impl AddressClass {
    /// The special class of an address, IPv6 forms that embed an IPv4 address included (mapped,
    /// NAT64, 6to4); `None` for ordinary (public) addresses.
    pub fn of(ip: IpAddr) -> Option<AddressClass> {
        match embedded_v4(ip) {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                if METADATA_V4.contains(&o) {
                    Some(AddressClass::Metadata)
                } else if v4.is_loopback() || v4.is_unspecified() {
                    Some(AddressClass::Loopback)
                } else if v4.is_link_local() {
                    Some(AddressClass::LinkLocal)
                } else if PRIVATE_V4
                    .iter()
                    .any(|(net, len)| in_prefix(u32::from(v4), u32::from_be_bytes(*net), *len))
                {
                    Some(AddressClass::Private)
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                let s = v6.segments();
                let bits = u128::from(v6);
                if METADATA_V6.contains(&s) {
                    Some(AddressClass::Metadata)
                } else if v6.is_loopback() || v6.is_unspecified() {
                    Some(AddressClass::Loopback)
                } else if (s[0] & 0xffc0) == 0xfe80 {
                    Some(AddressClass::LinkLocal)
                } else if PRIVATE_V6.iter().any(|(net, len)| {
                    in_prefix(bits, u128::from(std::net::Ipv6Addr::from(*net)), *len)
                }) {
                    Some(AddressClass::Private)
                } else {
                    None
                }
            }
        }
    }
}

/// The IPv4 address an IPv6 address stands for, where it embeds one that a packet to it
/// reaches: IPv4-mapped (`::ffff:a.b.c.d`), well-known NAT64 (`64:ff9b::a.b.c.d`) and 6to4
/// (`2002:AABB:CCDD::`). Any other address as it is.
fn embedded_v4(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let o = v6.octets();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return IpAddr::V4([o[12], o[13], o[14], o[15]].into());
    }
    if s[0] == 0x2002 {
        return IpAddr::V4([o[2], o[3], o[4], o[5]].into());
    }
    ip
}

/// Whether `addr` is in the prefix `net`/`len` (numbers of any width, big-endian bits).
fn in_prefix<T>(addr: T, net: T, len: u8) -> bool
where
    T: Copy + PartialEq + std::ops::Shr<u32, Output = T>,
{
    let width = (std::mem::size_of::<T>() * 8) as u32;
    let shift = width - u32::from(len);
    shift >= width || addr >> shift == net >> shift
}

/// Which special address classes a guest may connect to. `default()` refuses them all: the
/// policy for a runner's tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressAllowance {
    pub loopback: bool,
    pub link_local: bool,
    pub metadata: bool,
    pub private: bool,
}

impl AddressAllowance {
    /// Loopback only: what a local ClickHouse in development and tests needs.
    pub fn loopback() -> Self {
        AddressAllowance {
            loopback: true,
            ..AddressAllowance::default()
        }
    }

    /// A single user's own tool (the CLI, Meltano): private networks, where people's ClickHouse
    /// usually lives, are reachable; loopback, link-local and metadata are not.
    pub fn single_user() -> Self {
        AddressAllowance {
            private: true,
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
            Some(AddressClass::Private) if self.private => Ok(()),
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

    /// Special address classes (loopback, link-local, metadata, private) this guest may
    /// connect to.
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
        assert_eq!(class("10.1.2.3"), Some(AddressClass::Private));
        assert_eq!(class("2606:4700::1"), None);
    }

    /// Every range of the private and metadata classes, by its first and last address and,
    /// for IPv4, its IPv4-mapped, NAT64 and 6to4 forms: the tenant policy (`default()`)
    /// refuses each, and the addresses just outside stay public.
    #[test]
    fn the_tenant_policy_refuses_every_private_and_metadata_range() {
        let tenant = AddressAllowance::default();
        let class = |s: &str| AddressClass::of(s.parse().unwrap());
        let forms = |v4: &str| {
            let ip: std::net::Ipv4Addr = v4.parse().unwrap();
            let o = ip.octets();
            vec![
                v4.to_string(),
                format!("::ffff:{v4}"),
                format!("64:ff9b::{v4}"),
                format!("2002:{:02x}{:02x}:{:02x}{:02x}::1", o[0], o[1], o[2], o[3]),
            ]
        };
        let private_v4 = [
            ("0.0.0.1", "0.255.255.255"),
            ("10.0.0.0", "10.255.255.255"),
            ("100.64.0.0", "100.127.255.255"),
            ("172.16.0.0", "172.31.255.255"),
            ("192.0.0.0", "192.0.0.255"),
            ("192.0.2.0", "192.0.2.255"),
            ("192.31.196.0", "192.31.196.255"),
            ("192.52.193.0", "192.52.193.255"),
            ("192.88.99.0", "192.88.99.255"),
            ("192.168.0.0", "192.168.255.255"),
            ("198.18.0.0", "198.19.255.255"),
            ("198.51.100.0", "198.51.100.255"),
            ("203.0.113.0", "203.0.113.255"),
            ("224.0.0.0", "255.255.255.255"),
        ];
        for (first, last) in private_v4 {
            for address in forms(first).into_iter().chain(forms(last)) {
                assert_eq!(class(&address), Some(AddressClass::Private), "{address}");
                assert!(tenant.check(address.parse().unwrap()).is_err(), "{address}");
            }
        }
        let private_v6 = [
            ("::2", "::ffff:ffff"),
            ("64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"),
            ("100::", "100::ffff:ffff:ffff:ffff"),
            ("2001::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ("ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        ];
        for (first, last) in private_v6 {
            for address in [first, last] {
                assert_eq!(class(address), Some(AddressClass::Private), "{address}");
                assert!(tenant.check(address.parse().unwrap()).is_err(), "{address}");
            }
        }
        let metadata = [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.170.23",
            "100.100.100.200",
            "192.0.0.192",
        ];
        for v4 in metadata {
            for address in forms(v4) {
                assert_eq!(class(&address), Some(AddressClass::Metadata), "{address}");
                // No other allowance opens metadata, the single user's included.
                let everything_else = AddressAllowance {
                    loopback: true,
                    link_local: true,
                    private: true,
                    metadata: false,
                };
                assert_eq!(
                    everything_else.check(address.parse().unwrap()),
                    Err(AddressClass::Metadata),
                    "{address}"
                );
            }
        }
        for address in ["fd00:ec2::254", "fd00:ec2::23"] {
            assert_eq!(class(address), Some(AddressClass::Metadata), "{address}");
        }
        // Just outside the ranges: public.
        for address in [
            "1.0.0.1",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "2001:200::1",
            "2606:4700::1",
            "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            assert_eq!(class(address), None, "{address}");
            assert!(tenant.check(address.parse().unwrap()).is_ok(), "{address}");
        }
    }

    #[test]
    fn a_single_user_reaches_private_networks_and_a_tenant_does_not() {
        let address = "10.0.0.5".parse().unwrap();
        assert!(AddressAllowance::single_user().check(address).is_ok());
        assert_eq!(
            AddressAllowance::default().check(address),
            Err(AddressClass::Private)
        );
        assert_eq!(
            AddressAllowance::single_user().check("127.0.0.1".parse().unwrap()),
            Err(AddressClass::Loopback)
        );
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

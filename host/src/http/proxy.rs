//! Requests through an HTTP proxy: which destinations go through one (the variables
//! `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`, upper- or lower-case, read by
//! hyper-util's [`Matcher`], which follows curl's rules for `NO_PROXY`), and the tunnel
//! (`CONNECT`) that carries https.
//!
//! What the address policy checks when a proxy is used:
//! - **The destination**, before anything is sent to the proxy, on every request (a pooled
//!   connection to a proxy carries requests the proxy connects anew): an address as it is; a
//!   name resolved here, every address it resolves to. A name that does not resolve here is
//!   refused: the policy judges addresses, and an unchecked one is not let through. The proxy
//!   resolves the name again, and nothing here can see what it connects to: a name that
//!   resolves differently there (split-horizon DNS, a rebinding answer) is judged by what it
//!   resolves to here.
//! - **The proxy itself** is the operator's choice (the environment, or a runner's explicit
//!   proxy), not the guest's: its address is not held to the address classes (a proxy on this
//!   machine is common), and the tripwire of test builds still guards it.
//!
//! Only `http://` proxies (a missing port means 80): https destinations go through a `CONNECT`
//! tunnel to them, and TLS to the destination runs inside it, with the destination's name and
//! our trust settings.

use std::net::IpAddr;

use bytes::Bytes;
use http::HeaderValue;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use wasmtime_wasi_http::Error as HttpError;

use super::policy::AddressAllowance;
use super::tripwire;

/// The variables read, as curl reads them: the upper-case name first.
const VARIABLES: [(&str, &str); 4] = [
    ("ALL_PROXY", "all_proxy"),
    ("HTTP_PROXY", "http_proxy"),
    ("HTTPS_PROXY", "https_proxy"),
    ("NO_PROXY", "no_proxy"),
];

/// Which requests go through which proxy. None by default: the library's default, for a
/// runner's tenants, ignores the environment; the CLI reads it ([`Proxies::from_lookup`]).
#[derive(Default)]
pub struct Proxies {
    matcher: Option<Matcher>,
}

impl std::fmt::Debug for Proxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The matcher's own Debug leaves credentials out.
        f.debug_struct("Proxies")
            .field("matcher", &self.matcher)
            .finish()
    }
}

/// Where one request goes instead of its destination.
#[derive(Debug, Clone)]
pub struct Route {
    pub host: String,
    pub port: u16,
    /// `Proxy-Authorization`, from the proxy URL's user and password.
    pub auth: Option<HeaderValue>,
}

impl Proxies {
    /// Every request direct.
    pub fn none() -> Self {
        Proxies::default()
    }

    /// Every request through `url` (a runner's explicit proxy).
    pub fn explicit(url: &str) -> Result<Self, String> {
        let url = url.trim();
        check("the proxy", url)?;
        let matcher = Matcher::builder().all(url.to_string()).build();
        intercepts(&matcher, "the proxy", "http")?;
        intercepts(&matcher, "the proxy", "https")?;
        Ok(Proxies {
            matcher: Some(matcher),
        })
    }

    /// The proxies an environment names (`lookup` is `std::env::var` in the CLI). A value of
    /// `HTTPS_PROXY` or `HTTP_PROXY` that is not an `http://` URL is an error that names the
    /// variable, never its value (it may hold a password); an `ALL_PROXY` that is not (often a
    /// SOCKS proxy set for other tools) is left aside with a warning.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut values = [const { String::new() }; 4];
        for (slot, (upper, lower)) in values.iter_mut().zip(VARIABLES) {
            let found = [upper, lower].into_iter().find_map(|name| {
                lookup(name)
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .map(|v| (name, v))
            });
            let Some((name, value)) = found else {
                continue;
            };
            match upper {
                "NO_PROXY" => {}
                "ALL_PROXY" => {
                    if let Err(e) = check(name, &value) {
                        tracing::warn!("{e}: left aside");
                        continue;
                    }
                }
                _ => check(name, &value)?,
            }
            *slot = value;
        }
        if values[..3].iter().all(String::is_empty) {
            return Ok(Proxies::none());
        }
        let [all, http, https, no] = values;
        let build = |no: &str| {
            Matcher::builder()
                .all(all.clone())
                .http(http.clone())
                .https(https.clone())
                .no(no.to_string())
                .build()
        };
        // The matcher drops a value it cannot use without a word: each given one must route.
        let unfiltered = build("");
        for (name, given, scheme) in [
            ("HTTP_PROXY", !http.is_empty(), "http"),
            ("HTTPS_PROXY", !https.is_empty(), "https"),
            ("ALL_PROXY", !all.is_empty() && http.is_empty(), "http"),
            ("ALL_PROXY", !all.is_empty() && https.is_empty(), "https"),
        ] {
            if given {
                intercepts(&unfiltered, name, scheme)?;
            }
        }
        let matcher = build(&no);
        Ok(Proxies {
            matcher: Some(matcher),
        })
    }

    /// The proxy for a request to `uri`, if one applies.
    pub fn route(&self, uri: &http::Uri) -> Option<Route> {
        let intercept = self.matcher.as_ref()?.intercept(uri)?;
        let proxy = intercept.uri();
        Some(Route {
            host: proxy
                .host()?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: proxy.port_u16().unwrap_or(80),
            auth: intercept.basic_auth().cloned(),
        })
    }
}

/// Whether `matcher` sends a request with `scheme` through a proxy, as the variable `name` asks.
fn intercepts(matcher: &Matcher, name: &str, scheme: &str) -> Result<(), String> {
    let probe: http::Uri = format!("{scheme}://clickhouse.example:8123/")
        .parse()
        .map_err(|_| format!("{name}: cannot check it"))?;
    match matcher.intercept(&probe) {
        Some(_) => Ok(()),
        None => Err(format!("{name} is not a proxy URL this host can use")),
    }
}

/// `value` is an http proxy URL (a missing scheme means http, as for curl).
fn check(name: &str, value: &str) -> Result<(), String> {
    let uri: http::Uri = value
        .trim()
        .parse()
        .map_err(|_| format!("{name} is not a proxy URL"))?;
    match uri.scheme_str() {
        None | Some("http") => {}
        Some(other) => {
            return Err(format!(
                "{name}: only http:// proxies are supported (https goes through them with \
                 CONNECT), not {other}://"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{name} names no proxy host"));
    }
    Ok(())
}

/// The destination's checks before a request goes to a proxy (see the module's doc).
pub async fn check_destination(
    host: &str,
    port: u16,
    addresses: AddressAllowance,
) -> Result<(), HttpError> {
    let checked = |ip: IpAddr| {
        addresses.check(ip).map_err(|class| {
            tracing::warn!(target: "egress", host, port, refused = %format!("{ip} ({class})"), "destination address refused");
            HttpError::DestinationIpProhibited
        })?;
        // The proxy connects there on our behalf: the tripwire treats it as our connection.
        tripwire::check_address(host, ip)
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return checked(ip);
    }
    tripwire::check_name(host)?;
    match tokio::net::lookup_host((host, port)).await {
        Ok(resolved) => {
            for address in resolved {
                checked(address.ip())?;
            }
            Ok(())
        }
        Err(e) => Err(HttpError::DnsError {
            rcode: Some(format!(
                "cannot resolve {host} ({e}): through a proxy, the destination's addresses are \
                 checked here first"
            )),
            info_code: None,
        }),
    }
}

/// A connection to the proxy (its address is the operator's choice: see the module's doc).
pub async fn connect(route: &Route) -> Result<TcpStream, HttpError> {
    tripwire::check_name(&route.host)?;
    let resolved = tokio::net::lookup_host((route.host.as_str(), route.port))
        .await
        .map_err(|e| HttpError::DnsError {
            rcode: Some(format!("cannot resolve the proxy {}: {e}", route.host)),
            info_code: None,
        })?;
    let mut last_error = None;
    for address in resolved {
        tripwire::check_address(&route.host, address.ip())?;
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    Err(match last_error {
        Some(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            HttpError::ConnectionRefused
        }
        Some(e) => HttpError::Connect(e),
        None => HttpError::DnsError {
            rcode: Some(format!("the proxy {} has no address", route.host)),
            info_code: None,
        },
    })
}

/// Asks the proxy on `tcp` for a tunnel to `host:port` and returns it once granted.
pub async fn tunnel(
    tcp: TcpStream,
    host: &str,
    port: u16,
    auth: Option<HeaderValue>,
) -> Result<TokioIo<hyper::upgrade::Upgraded>, HttpError> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
            .await
            .map_err(HttpError::Hyper)?;
    tokio::spawn(connection.with_upgrades());
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(authority.as_str())
        .header(http::header::HOST, authority.as_str());
    if let Some(auth) = auth {
        request = request.header(http::header::PROXY_AUTHORIZATION, auth);
    }
    let request = request
        .body(http_body_util::Empty::new())
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(HttpError::Hyper)?;
    let status = response.status();
    if !status.is_success() {
        let refusal = format!("the proxy refused a tunnel to {authority}: {status}");
        tracing::warn!(target: "egress", "{refusal}");
        // A gateway's failure may pass (the destination was down); the proxy's own refusal
        // (authentication, its policy) will not.
        return Err(if status.is_server_error() {
            HttpError::ConnectionRefused
        } else {
            HttpError::InternalError(Some(refusal))
        });
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(HttpError::Hyper)?;
    Ok(TokioIo::new(upgraded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::env;

    fn route(proxies: &Proxies, uri: &str) -> Option<(String, u16)> {
        proxies
            .route(&uri.parse().expect("a URI"))
            .map(|r| (r.host, r.port))
    }

    #[test]
    fn the_variables_route_by_scheme_and_no_proxy_exempts() {
        let proxies = Proxies::from_lookup(env(&[
            ("HTTPS_PROXY", "http://proxy.internal:3128"),
            ("http_proxy", "plain.internal:8080"),
            ("NO_PROXY", "localhost,.corp.example,10.0.0.0/8"),
        ]))
        .expect("valid");
        assert_eq!(
            route(&proxies, "https://abc.clickhouse.cloud:8443/"),
            Some(("proxy.internal".into(), 3128))
        );
        assert_eq!(
            route(&proxies, "http://ch.other.example:8123/"),
            Some(("plain.internal".into(), 8080))
        );
        assert_eq!(route(&proxies, "http://ch.corp.example:8123/"), None);
        assert_eq!(route(&proxies, "http://10.1.2.3:8123/"), None);
        assert_eq!(route(&proxies, "http://localhost:8123/"), None);
    }

    #[test]
    fn no_variables_no_proxy_and_explicit_routes_all() {
        let none = Proxies::from_lookup(env(&[("NO_PROXY", "x")])).expect("valid");
        assert_eq!(route(&none, "https://h:8443/"), None);
        assert_eq!(route(&Proxies::default(), "https://h:8443/"), None);
        let all = Proxies::explicit("http://127.0.0.1:3128").expect("valid");
        assert_eq!(
            route(&all, "https://h:8443/"),
            Some(("127.0.0.1".into(), 3128))
        );
        assert_eq!(
            route(&all, "http://h:8123/"),
            Some(("127.0.0.1".into(), 3128))
        );
    }

    #[test]
    fn credentials_become_basic_auth_and_never_appear_in_errors() {
        let proxies = Proxies::from_lookup(env(&[("HTTPS_PROXY", "http://me:s3cret@proxy:3128")]))
            .expect("valid");
        let route = proxies
            .route(&"https://h:8443/".parse().expect("a URI"))
            .expect("routed");
        assert_eq!(
            route.auth.expect("auth").to_str().expect("ascii"),
            "Basic bWU6czNjcmV0"
        );
        assert!(!format!("{proxies:?}").contains("s3cret"), "{proxies:?}");
        for bad in [
            "socks5://me:s3cret@proxy:1080",
            "http://me:s3cret@",
            "::::s3cret",
        ] {
            let error = Proxies::from_lookup(env(&[("HTTPS_PROXY", bad)])).expect_err(bad);
            assert!(error.contains("HTTPS_PROXY"), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
        let error = Proxies::explicit("https://proxy:3128").expect_err("https proxy");
        assert!(error.contains("only http://"), "{error}");
    }

    #[test]
    fn values_are_trimmed_and_a_socks_all_proxy_is_left_aside() {
        let proxies = Proxies::from_lookup(env(&[
            ("HTTPS_PROXY", " http://proxy:3128\n"),
            ("ALL_PROXY", "socks5h://127.0.0.1:1080"),
        ]))
        .expect("valid");
        assert_eq!(
            route(&proxies, "https://h:8443/"),
            Some(("proxy".into(), 3128))
        );
        assert_eq!(route(&proxies, "http://h:8123/"), None);
        let explicit = Proxies::explicit(" http://[::1]:3128 ").expect("valid");
        assert_eq!(
            route(&explicit, "https://h:8443/"),
            Some(("::1".into(), 3128))
        );
    }
}

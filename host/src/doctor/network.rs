//! The path to the server, as the sandbox's requests take it: the proxy, the name, the
//! address's class under the policy, the TCP connection and TLS with the certificate's expiry.
//! The host's own connections here go through the same policy and tripwire as the guest's.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::check::{Check, Outcome};
use crate::http::policy::AddressAllowance;
use crate::http::proxy::Proxies;
use crate::http::tripwire;
use crate::runtime::RuntimeOptions;

/// A certificate that ends within this many days is reported.
pub const CERTIFICATE_DAYS_WARN: i64 = 14;

const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the store is: the URI's host, port and scheme.
pub struct Target {
    pub host: String,
    pub port: u16,
    pub secure: bool,
}

/// Every network check, in order; a failed step skips those after it.
pub async fn checks(target: &Target, options: &RuntimeOptions) -> Vec<Check> {
    let mut checks = Vec::new();
    let scheme = if target.secure { "https" } else { "http" };
    let uri: http::Uri =
        match format!("{scheme}://{}:{}/", bracketed(&target.host), target.port).parse() {
            Ok(uri) => uri,
            Err(e) => {
                checks.push(Check::fail(
                    "dns",
                    format!("not a host name: {e}"),
                    "fix the URI",
                ));
                return checks;
            }
        };
    let proxied = proxy_check(&uri, &options.proxies, &mut checks);
    // As the sandbox does: the policy judges the destination's addresses, through a proxy too
    // (the proxy itself is the operator's choice, not the guest's).
    let Some(addresses) = resolve(&target.host, target.port, &mut checks).await else {
        return skipped(
            checks,
            &["address", "tcp", "tls"],
            "not run: the name did not resolve",
        );
    };
    let Some(allowed) = address_check(&target.host, &addresses, &options.addresses, &mut checks)
    else {
        return skipped(
            checks,
            &["tcp", "tls"],
            "not run: the policy refuses every address",
        );
    };
    let stream = match &proxied {
        Some((host, port)) => {
            let proxy = match tokio::time::timeout(
                STEP_TIMEOUT,
                tokio::net::lookup_host((host.as_str(), *port)),
            )
            .await
            {
                Ok(Ok(found)) => found.collect(),
                _ => Vec::new(),
            };
            tcp_check(host, &proxy, &mut checks).await
        }
        None => tcp_check(&target.host, &allowed, &mut checks).await,
    };
    let Some(stream) = stream else {
        return skipped(checks, &["tls"], "not run: no TCP connection");
    };
    if !target.secure {
        checks.push(Check::new(
            "tls",
            Outcome::Skipped,
            "plain HTTP (secure=false)".into(),
            "",
        ));
    } else if proxied.is_some() {
        checks.push(Check::new(
            "tls",
            Outcome::Skipped,
            "through a proxy: the calls' own TLS is checked by `authentication`".into(),
            "",
        ));
    } else {
        checks.push(tls_check(&target.host, stream, options).await);
    }
    checks
}

fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

fn skipped(mut checks: Vec<Check>, names: &[&'static str], why: &str) -> Vec<Check> {
    for name in names {
        checks.push(Check::new(name, Outcome::Skipped, why.into(), ""));
    }
    checks
}

/// The proxy the environment names for this URI, if any (its host and port).
fn proxy_check(
    uri: &http::Uri,
    proxies: &Proxies,
    checks: &mut Vec<Check>,
) -> Option<(String, u16)> {
    match proxies.route(uri) {
        Some(route) => {
            checks.push(Check::new(
                "proxy",
                Outcome::Pass,
                format!(
                    "through {}:{} (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY)",
                    route.host, route.port
                ),
                "",
            ));
            Some((route.host, route.port))
        }
        None => {
            checks.push(Check::new(
                "proxy",
                Outcome::Pass,
                "none: direct".into(),
                "",
            ));
            None
        }
    }
}

async fn resolve(host: &str, port: u16, checks: &mut Vec<Check>) -> Option<Vec<SocketAddr>> {
    if let Err(e) = tripwire::check_name(host) {
        checks.push(Check::fail(
            "dns",
            e.to_string(),
            "this build resolves only local names",
        ));
        return None;
    }
    let looked_up = tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((host, port))).await;
    match looked_up {
        Ok(Ok(found)) => {
            let mut addresses: Vec<SocketAddr> = found.collect();
            addresses.dedup();
            let listed: Vec<String> = addresses.iter().map(|a| a.ip().to_string()).collect();
            checks.push(Check::new(
                "dns",
                Outcome::Pass,
                format!("{host} is {}", listed.join(", ")),
                "",
            ));
            Some(addresses)
        }
        Ok(Err(e)) => {
            checks.push(Check::fail(
                "dns",
                format!("cannot resolve {host}: {e}"),
                "check the URI's host name and this machine's DNS",
            ));
            None
        }
        Err(_) => {
            checks.push(Check::fail(
                "dns",
                format!(
                    "resolving {host} took more than {} s",
                    STEP_TIMEOUT.as_secs()
                ),
                "check this machine's DNS",
            ));
            None
        }
    }
}

/// The addresses the policy lets the sandbox connect to.
fn address_check(
    host: &str,
    addresses: &[SocketAddr],
    allowance: &AddressAllowance,
    checks: &mut Vec<Check>,
) -> Option<Vec<SocketAddr>> {
    let mut allowed = Vec::new();
    let mut refused = Vec::new();
    for address in addresses {
        match allowance.check(address.ip()) {
            Ok(()) => allowed.push(*address),
            Err(class) => refused.push(format!("{} ({class})", address.ip())),
        }
    }
    if allowed.is_empty() {
        checks.push(Check::fail(
            "address",
            format!(
                "the policy refuses every address of {host}: {}",
                refused.join(", ")
            ),
            "a local ClickHouse needs --allow-loopback; a private network is refused only with \
             --refuse-private",
        ));
        return None;
    }
    let classes: Vec<String> = allowed.iter().map(|a| describe(a.ip())).collect();
    let mut detail = format!("allowed: {}", classes.join(", "));
    if !refused.is_empty() {
        detail.push_str(&format!("; refused: {}", refused.join(", ")));
    }
    checks.push(Check::new("address", Outcome::Pass, detail, ""));
    Some(allowed)
}

fn describe(ip: IpAddr) -> String {
    match crate::http::policy::AddressClass::of(ip) {
        Some(class) => format!("{ip} ({class})"),
        None => format!("{ip} (public)"),
    }
}

async fn tcp_check(
    host: &str,
    addresses: &[SocketAddr],
    checks: &mut Vec<Check>,
) -> Option<TcpStream> {
    let mut failures = Vec::new();
    for address in addresses {
        if let Err(e) = tripwire::check_address(host, address.ip()) {
            failures.push(e.to_string());
            continue;
        }
        match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                checks.push(Check::new(
                    "tcp",
                    Outcome::Pass,
                    format!("connected to {address}"),
                    "",
                ));
                return Some(stream);
            }
            Ok(Err(e)) => failures.push(format!("{address}: {e}")),
            Err(_) => failures.push(format!(
                "{address}: no answer in {} s",
                STEP_TIMEOUT.as_secs()
            )),
        }
    }
    checks.push(Check::fail(
        "tcp",
        format!("cannot connect: {}", failures.join("; ")),
        "check that ClickHouse runs and listens on the URI's port, and that no firewall stands \
         between",
    ));
    None
}

/// The TLS handshake with the host's trust (the system's roots and the CA bundle), and the days
/// the server's certificate has left.
async fn tls_check(host: &str, stream: TcpStream, options: &RuntimeOptions) -> Check {
    let config = match options.tls.client_config() {
        Ok(config) => config,
        Err(e) => {
            return Check::fail(
                "tls",
                e.to_string(),
                "fix the CA bundle or the client certificate",
            );
        }
    };
    let Ok(name) = ServerName::try_from(host.to_string()) else {
        return Check::fail(
            "tls",
            format!("{host} is not a TLS server name"),
            "fix the URI",
        );
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
    let handshake = tokio::time::timeout(STEP_TIMEOUT, connector.connect(name, stream)).await;
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            return Check::fail(
                "tls",
                format!("the handshake failed: {e}"),
                "a private CA needs --ca-bundle (CLICKHOUSE_CA_BUNDLE); check the host name the \
                 certificate is for",
            );
        }
        Err(_) => {
            return Check::fail(
                "tls",
                format!("no handshake in {} s", STEP_TIMEOUT.as_secs()),
                "check that the port serves TLS (secure=true needs the HTTPS port, 8443)",
            );
        }
    };
    let (_, session) = tls.get_ref();
    let version = session
        .protocol_version()
        .map(|v| format!("{v:?}"))
        .unwrap_or_default();
    let Some(leaf) = session.peer_certificates().and_then(|c| c.first()) else {
        return Check::fail(
            "tls",
            "the server sent no certificate".into(),
            "check that the URI's port serves TLS with a certificate (8443)",
        );
    };
    match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, certificate)) => {
            let until = certificate.validity().not_after.timestamp();
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            let days = (until - now) / 86_400;
            let detail = format!(
                "{version}, the chain is trusted; the certificate ends {} ({days} days)",
                certificate.validity().not_after
            );
            if days < CERTIFICATE_DAYS_WARN {
                Check::new(
                    "tls",
                    Outcome::Warn,
                    detail,
                    "renew the server's certificate",
                )
            } else {
                Check::new("tls", Outcome::Pass, detail, "")
            }
        }
        Err(e) => Check::new(
            "tls",
            Outcome::Warn,
            format!("{version}, the chain is trusted; its expiry is unreadable: {e}"),
            "",
        ),
    }
}

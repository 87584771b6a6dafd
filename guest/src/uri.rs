//! The connection URI: `scheme://[user[:password]@]host[:port][/database][?name=value&...]`.
//!
//! A focused parser rather than the `url` crate: `url` implements the whole WHATWG URL standard
//! (IDNA, special schemes, relative references) and was 74 KB of a 442 KB component, for a
//! grammar this small. It is checked against `url` on generated URIs (tests/properties.rs).
//! Parts stay percent-encoded here; `config` decodes them.

use std::net::Ipv6Addr;

/// The parts of a URI, as written (still percent-encoded).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uri<'a> {
    /// Lower-cased.
    pub scheme: String,
    pub user: &'a str,
    pub password: Option<&'a str>,
    /// A name or IPv4 address as written; an IPv6 address without its brackets, normalised.
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Without the leading `/`.
    pub path: &'a str,
    pub query: Option<&'a str>,
}

/// Why a URI is not one.
#[derive(Debug, PartialEq, Eq)]
pub struct UriError(pub &'static str);

impl std::fmt::Display for UriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

pub fn parse(text: &str) -> Result<Uri<'_>, UriError> {
    let text = text.trim_matches(|c: char| c <= ' ');
    let (scheme, rest) = text
        .split_once("://")
        .ok_or(UriError("it does not start with scheme://"))?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(UriError("invalid scheme"));
    }
    if rest.contains('#') {
        return Err(UriError(
            "a fragment (#) is not allowed; percent-encode '#' as %23",
        ));
    }
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(UriError("whitespace or control characters"));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(at) => (&before_query[..at], &before_query[at + 1..]),
        None => (before_query, ""),
    };
    // The userinfo ends at the last '@' of the authority (a password may contain '@' only
    // encoded, but be lenient as browsers and the url crate are).
    let (userinfo, host_port) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        Some(info) => match info.split_once(':') {
            // An empty password is no password, as in the url crate.
            Some((user, password)) => (user, (!password.is_empty()).then_some(password)),
            None => (info, None),
        },
        None => ("", None),
    };
    let (host, port) = split_host_port(host_port)?;
    Ok(Uri {
        scheme: scheme.to_ascii_lowercase(),
        user,
        password,
        host,
        port,
        path,
        query,
    })
}

fn split_host_port(text: &str) -> Result<(Option<String>, Option<u16>), UriError> {
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let (address, after) = inner
            .split_once(']')
            .ok_or(UriError("an IPv6 address without its closing ']'"))?;
        let address: Ipv6Addr = address
            .parse()
            .map_err(|_| UriError("an invalid IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or(UriError("characters after the IPv6 address"))?,
            ),
        };
        (Some(address.to_string()), port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        if host.contains(['[', ']', '<', '>', '^', '|', '\\', '"', '`', '{', '}']) {
            return Err(UriError("invalid characters in the host"));
        }
        ((!host.is_empty()).then(|| host.to_string()), port)
    };
    let port = match port {
        None | Some("") => None,
        Some(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => Some(
            digits
                .parse::<u16>()
                .map_err(|_| UriError("the port is out of range"))?,
        ),
        Some(_) => return Err(UriError("the port is not a number")),
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_every_part() {
        let uri =
            parse("ClickHouse://al%40ice:p%3Ass@ch.example.com:8443/db_1?secure=true").unwrap();
        assert_eq!(
            uri,
            Uri {
                scheme: "clickhouse".into(),
                user: "al%40ice",
                password: Some("p%3Ass"),
                host: Some("ch.example.com".into()),
                port: Some(8443),
                path: "db_1",
                query: Some("secure=true"),
            }
        );
    }

    #[test]
    fn optional_parts_may_be_missing() {
        let uri = parse("clickhouse://host").unwrap();
        assert_eq!((uri.user, uri.password, uri.port), ("", None, None));
        assert_eq!((uri.path, uri.query), ("", None));
        assert_eq!(parse("clickhouse://u@h:/").unwrap().port, None);
        assert_eq!(parse("clickhouse://u:@h").unwrap().password, None);
        assert_eq!(parse("clickhouse:///db").unwrap().host, None);
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        let uri = parse("http://[::1]:8123/default").unwrap();
        assert_eq!((uri.host.as_deref(), uri.port), (Some("::1"), Some(8123)));
        assert_eq!(
            parse("http://[0:0:0:0:0:0:0:1]").unwrap().host.as_deref(),
            Some("::1")
        );
        assert!(parse("http://[::1/db").is_err());
        assert!(parse("http://[nope]/db").is_err());
        assert!(parse("http://[::1]x/db").is_err());
    }

    #[test]
    fn the_last_at_sign_ends_the_userinfo() {
        let uri = parse("clickhouse://user:p@ss@host/db").unwrap();
        assert_eq!((uri.user, uri.password), ("user", Some("p@ss")));
        assert_eq!(uri.host.as_deref(), Some("host"));
    }

    #[test]
    fn malformed_uris_are_refused() {
        for bad in [
            "host:8123/db",
            "://host",
            "1ch://host",
            "clickhouse://host:80x",
            "clickhouse://host:65536",
            "clickhouse://host/db#frag",
            "clickhouse://ho st/db",
            "clickhouse://h{o}st/db",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

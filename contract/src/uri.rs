//! The connection URI: `scheme://[user[:password]@]host[:port][/database][?name=value&...]`.
//!
//! Split here by that grammar, which is a strict subset of what the WHATWG standard (the `url`
//! crate) accepts under a non-special scheme (where WHATWG would resolve a `.` or `..` path
//! away, this refuses it); a property test holds every part to `url`'s own
//! reading of the same text (guest/tests/properties.rs), and `url` stays that test's oracle rather
//! than the component's parser, because its WHATWG machinery (special schemes, IDNA, relative
//! and file URLs, none of which a connection URI may use) was a twelfth of the component.
//! Whatever scheme the text names is read as a non-special one: a port equal to http's or https's
//! default (80, 443) is kept, and a host such as `0` or `1.2` stays a name. What WHATWG quietly
//! repairs is refused: a fragment (`#` must be written `%23`), whitespace or control characters
//! (WHATWG strips tabs and newlines anywhere), and a host that is not a plain ASCII name or an
//! IP address (non-ASCII names in their punycode form). Parts stay percent-encoded here;
//! `config` decodes them.

/// The parts of a URI (user, password, path and query still percent-encoded).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Uri {
    /// Lower-cased.
    pub scheme: String,
    pub user: String,
    pub password: Option<String>,
    /// A name or IPv4 address as written; an IPv6 address without its brackets, normalised.
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Without the leading `/`.
    pub path: String,
    pub query: Option<String>,
}

/// Why a URI is not one.
#[derive(Debug, PartialEq, Eq)]
pub struct UriError(pub String);

impl std::fmt::Display for UriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn error(message: &str) -> UriError {
    UriError(message.to_string())
}

pub fn parse(text: &str) -> Result<Uri, UriError> {
    let text = text.trim_matches(|c: char| c <= ' ');
    let (scheme, rest) = text
        .split_once("://")
        .ok_or_else(|| error("it does not start with scheme://"))?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(error("invalid scheme"));
    }
    if rest.contains('#') {
        return Err(error(
            "a fragment (#) is not allowed; percent-encode '#' as %23",
        ));
    }
    if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(error("whitespace or control characters"));
    }
    // The authority ends at the path or the query; the userinfo at its last '@'.
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let (host, port) = split_host_port(host_port)?;
    if host.is_none() && (userinfo.is_some() || port.is_some()) {
        return Err(error("a user or a port without a host"));
    }
    let (user, password): (&str, &str) = userinfo
        .map(|u| u.split_once(':').unwrap_or((u, "")))
        .unwrap_or_default();
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    // WHATWG resolves `.` and `..` (`%2e` too) away, to an empty path; here they are refused.
    let dots = path
        .trim_start_matches('/')
        .to_ascii_lowercase()
        .replace("%2e", ".");
    if dots == "." || dots == ".." {
        return Err(error("the path is '.' or '..', not a database name"));
    }
    Ok(Uri {
        scheme: scheme.to_ascii_lowercase(),
        user: user.to_string(),
        // An empty password is no password, as `url` reads it.
        password: Some(password).filter(|p| !p.is_empty()).map(str::to_string),
        host,
        port,
        path: path.trim_start_matches('/').to_string(),
        query: query.map(str::to_string),
    })
}

/// `host[:port]`, or `[ipv6][:port]`; an empty host is none.
fn split_host_port(text: &str) -> Result<(Option<String>, Option<u16>), UriError> {
    let (host, port) = if let Some(bracketed) = text.strip_prefix('[') {
        let (address, after) = bracketed
            .split_once(']')
            .ok_or_else(|| error("an IPv6 address without its closing ']'"))?;
        let address: std::net::Ipv6Addr =
            address.parse().map_err(|_| error("invalid IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| error("only a port may follow an IPv6 address"))?,
            ),
        };
        (Some(address.to_string()), port)
    } else {
        let (name, port) = match text.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text, None),
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(error(
                "invalid characters in the host (a name of letters, digits, '.', '-' and \
                 '_'; a non-ASCII name in its punycode form)",
            ));
        }
        (Some(name.to_string()).filter(|n| !n.is_empty()), port)
    };
    let port = match port {
        None | Some("") => None,
        // Leading zeros allowed, as `url` reads them.
        Some(digits) => Some(
            digits
                .bytes()
                .try_fold(0u16, |n, b| {
                    let digit = b.is_ascii_digit().then(|| u16::from(b - b'0'))?;
                    n.checked_mul(10)?.checked_add(digit)
                })
                .ok_or_else(|| error("invalid port number"))?,
        ),
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
                user: "al%40ice".into(),
                password: Some("p%3Ass".into()),
                host: Some("ch.example.com".into()),
                port: Some(8443),
                path: "db_1".into(),
                query: Some("secure=true".into()),
            }
        );
    }

    #[test]
    fn optional_parts_may_be_missing() {
        let uri = parse("clickhouse://host").unwrap();
        assert_eq!(
            (uri.user.as_str(), uri.password, uri.port),
            ("", None, None)
        );
        assert_eq!((uri.path.as_str(), uri.query), ("", None));
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
        assert_eq!(
            (uri.user.as_str(), uri.password.as_deref()),
            ("user", Some("p@ss"))
        );
        assert_eq!(uri.host.as_deref(), Some("host"));
    }

    #[test]
    fn the_special_schemes_keep_their_ports_and_names() {
        // WHATWG would drop the default port 80 and read "0" as the address 0.0.0.0.
        let uri = parse("http://0:80/db").unwrap();
        assert_eq!((uri.host.as_deref(), uri.port), (Some("0"), Some(80)));
        assert_eq!(parse("https://h:443").unwrap().port, Some(443));
        assert_eq!(parse("HTTPS://h").unwrap().scheme, "https");
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
            "clickhouse://hüst/db",
            "clickhouse://h%41st/db",
            "clickhouse://h/.",
            "clickhouse://h/..",
            "clickhouse://h/%2E",
            "clickhouse://h/.%2e",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

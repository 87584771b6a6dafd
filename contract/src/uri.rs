//! The connection URI: `scheme://[user[:password]@]host[:port][/database][?name=value&...]`,
//! parsed by the `url` crate and then held to a stricter grammar than the WHATWG standard's.
//!
//! The text is parsed as a URL of a non-special scheme whatever scheme it names (the scheme
//! itself is kept), because two special-scheme readings would surprise here: a port equal to
//! http's or https's default (80, 443) would be dropped, so the connection would go to 8123
//! instead, and a host such as `0` or `1.2` would become an IPv4 address. What WHATWG quietly
//! repairs is refused: a fragment (`#` must be written `%23`), whitespace or control characters
//! (WHATWG strips tabs and newlines anywhere), and a host that is not a plain ASCII name or an
//! IP address (non-ASCII names in their punycode form; `idna` is built without Unicode tables,
//! see `Cargo.toml`). A property test holds the result to `url`'s own reading of the same text
//! (tests/properties.rs). Parts stay percent-encoded here; `config` decodes them.

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

/// The scheme the text is parsed under: any non-special one reads the same.
const NON_SPECIAL: &str = "clickhouse";

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
    let url =
        url::Url::parse(&format!("{NON_SPECIAL}://{rest}")).map_err(|e| UriError(e.to_string()))?;
    let host = match url.host() {
        None => None,
        Some(url::Host::Ipv6(address)) => Some(address.to_string()),
        Some(url::Host::Ipv4(address)) => Some(address.to_string()),
        Some(url::Host::Domain("")) => None,
        Some(url::Host::Domain(name)) => {
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            {
                return Err(error(
                    "invalid characters in the host (a name of letters, digits, '.', '-' and \
                     '_'; a non-ASCII name in its punycode form)",
                ));
            }
            Some(name.to_string())
        }
    };
    Ok(Uri {
        scheme: scheme.to_ascii_lowercase(),
        user: url.username().to_string(),
        // An empty password is no password, as `url` reads it.
        password: url.password().map(str::to_string),
        host,
        port: url.port(),
        path: url.path().trim_start_matches('/').to_string(),
        query: url.query().map(str::to_string),
    })
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
        // `url` encodes the earlier '@' in the password; `config` decodes it.
        assert_eq!(
            (uri.user.as_str(), uri.password.as_deref()),
            ("user", Some("p%40ss"))
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
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

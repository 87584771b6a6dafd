//! Property tests of the plain-Rust logic: glob translation against a reference fnmatch, the
//! deep merge's laws, configuration parsing of arbitrary credentials, and the URI parser against
//! the `url` crate's own reading.

use clickhouse_state::config::Config;
use clickhouse_state::glob::{self, Filter};
use clickhouse_state::merge::merge;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Python's `fnmatch.fnmatchcase`, written plainly: `*`, `?`, `[seq]`, `[!seq]`, the rest literal.
fn fnmatch(pattern: &[char], text: &[char]) -> bool {
    match pattern.first() {
        None => text.is_empty(),
        Some('*') => (0..=text.len()).any(|i| fnmatch(&pattern[1..], &text[i..])),
        Some('?') => !text.is_empty() && fnmatch(&pattern[1..], &text[1..]),
        Some('[') => {
            let Some((matches, rest)) = class(&pattern[1..], text.first().copied()) else {
                // unbalanced: fnmatch reads '[' literally
                return text.first() == Some(&'[') && fnmatch(&pattern[1..], &text[1..]);
            };
            !text.is_empty() && matches && fnmatch(rest, &text[1..])
        }
        Some(c) => text.first() == Some(c) && fnmatch(&pattern[1..], &text[1..]),
    }
}

/// Parses a class after '['; returns whether `c` matches and the pattern after ']'.
fn class(p: &[char], c: Option<char>) -> Option<(bool, &[char])> {
    let mut i = 0;
    let negated = p.first() == Some(&'!');
    if negated {
        i += 1;
    }
    let start = i;
    if p.get(i) == Some(&']') {
        i += 1;
    }
    while i < p.len() && p[i] != ']' {
        i += 1;
    }
    if i >= p.len() {
        return None;
    }
    let body = &p[start..i];
    let c = c?;
    let mut hit = false;
    let mut k = 0;
    while k < body.len() {
        if k + 2 < body.len() && body[k + 1] == '-' {
            hit |= body[k] <= c && c <= body[k + 2];
            k += 3;
        } else {
            hit |= body[k] == c;
            k += 1;
        }
    }
    Some((hit != negated, &p[i + 1..]))
}

fn passes(filter: &Filter, id: &str) -> bool {
    match filter {
        Filter::All => true,
        Filter::Exact(p) => p == id,
        Filter::Match { prefix, regex } => {
            id.starts_with(prefix.as_str())
                && regex::Regex::new(regex).expect("valid regex").is_match(id)
        }
    }
}

fn id_chars() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just('a'),
            Just('b'),
            Just('_'),
            Just('%'),
            Just('\\'),
            Just('.'),
            Just('-'),
            Just(':'),
            Just('['),
            Just(']'),
            Just('*'),
            Just('?'),
            Just('!'),
            Just('ü'),
            Just('\n'),
            Just('\''),
        ],
        0..8,
    )
    .prop_map(|v| v.into_iter().collect())
}

fn pattern_chars() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("a"),
            Just("b"),
            Just("_"),
            Just("%"),
            Just("\\"),
            Just("."),
            Just("*"),
            Just("?"),
            Just("[ab]"),
            Just("[!a]"),
            Just("[a-c]"),
            Just("[]]"),
            Just("[!]a]"),
            Just("ü"),
            Just(":"),
        ],
        0..6,
    )
    .prop_map(|v| v.concat())
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::String),
        proptest::collection::vec(any::<u8>().prop_map(Value::from), 0..3).prop_map(Value::Array),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        proptest::collection::btree_map("[a-c]{1,2}", inner, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    });
    proptest::collection::btree_map("[a-c]{1,2}", value, 0..4).prop_map(|m| m.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn glob_matches_like_fnmatch(pattern in pattern_chars(), ids in proptest::collection::vec(id_chars(), 1..8)) {
        let filter = glob::filter(Some(&pattern)).expect("generated patterns are balanced");
        let p: Vec<char> = pattern.chars().collect();
        for id in ids {
            let t: Vec<char> = id.chars().collect();
            prop_assert_eq!(passes(&filter, &id), fnmatch(&p, &t), "pattern {:?} id {:?}", pattern, id);
        }
    }

    #[test]
    fn merging_the_same_partial_twice_changes_nothing(src in json_object(), dest in json_object()) {
        let mut once = dest.clone();
        merge(src.clone(), &mut once);
        let mut twice = once.clone();
        merge(src.clone(), &mut twice);
        prop_assert_eq!(&once, &twice);
        // and every key of src is in the result with src's scalar values
        for (key, value) in &src {
            if !value.is_object() {
                prop_assert_eq!(once.get(key), Some(value));
            }
        }
    }

    #[test]
    fn merging_an_empty_partial_changes_nothing(dest in json_object()) {
        let mut merged = dest.clone();
        merge(Map::new(), &mut merged);
        prop_assert_eq!(merged, dest);
    }

    #[test]
    fn credentials_round_trip_through_the_uri(
        user in "[a-zA-Z0-9@:/%# ._-]{1,12}",
        password in "[a-zA-Z0-9@:/%#?&= ._-]{0,16}",
        db in "[a-z_][a-z0-9_]{0,8}",
        port in 1u16..,
    ) {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let uri = format!(
            "clickhouse://{}:{}@db.example:{port}/{db}",
            utf8_percent_encode(&user, NON_ALPHANUMERIC),
            utf8_percent_encode(&password, NON_ALPHANUMERIC),
        );
        let config = Config::parse(&uri, &[]).expect("valid");
        prop_assert_eq!(config.user, user.clone());
        prop_assert_eq!(config.password.expose(), password.as_str());
        prop_assert_eq!(config.database, db);
        prop_assert_eq!(config.port, port);
        let shown = format!("{:?}", Config::parse(&uri, &[]).unwrap());
        prop_assert!(shown.contains("password: <redacted>"));
    }

    /// The URI parser (`url` under a non-special scheme, then stricter checks) agrees with the
    /// `url` crate's own reading of the same text on every part the configuration reads, for
    /// the URIs users write.
    #[test]
    fn the_uri_parser_agrees_with_the_url_crate(
        scheme in prop::sample::select(vec!["clickhouse", "http", "https", "CLICKHOUSE"]),
        user in prop::option::of("\\PC{0,10}"),
        password in prop::option::of("\\PC{0,12}"),
        host in prop_oneof![
            // Names start with a letter: WHATWG reads special-scheme hosts like "0" or
            // "1.2" as IPv4 numbers, a legacy this parser does not copy.
            "[a-z]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z][a-z0-9]{0,7}){0,3}",
            any::<std::net::Ipv4Addr>().prop_map(|a| a.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|a| format!("[{a}]")),
        ],
        port in prop::option::of(any::<u16>()),
        db in "[a-zA-Z0-9_%-]{0,10}",
        query in prop::option::of("secure=(true|false|1|0)"),
    ) {
        use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};
        let mut text = format!("{scheme}://");
        if let Some(user) = &user {
            text += &utf8_percent_encode(user, NON_ALPHANUMERIC).to_string();
            if let Some(password) = &password {
                text += ":";
                text += &utf8_percent_encode(password, NON_ALPHANUMERIC).to_string();
            }
            text += "@";
        }
        text += &host;
        if let Some(port) = port {
            text += &format!(":{port}");
        }
        text += &format!("/{db}");
        if let Some(query) = &query {
            text += &format!("?{query}");
        }
        let reference = url::Url::parse(&text);
        let ours = clickhouse_state::uri::parse(&text);
        let (reference, ours) = match (reference, ours) {
            (Ok(r), Ok(o)) => (r, o),
            (Err(_), Err(_)) => return Ok(()),
            (r, o) => return Err(TestCaseError::fail(format!("{text}: url {r:?}, ours {o:?}"))),
        };
        let decoded = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        prop_assert_eq!(ours.scheme, reference.scheme());
        prop_assert_eq!(decoded(&ours.user), decoded(reference.username()));
        prop_assert_eq!(ours.password.as_deref().map(decoded), reference.password().map(decoded));
        let reference_host = reference.host_str().map(|h| h.trim_matches(['[', ']']).to_string());
        // The same IPv6 address may be written two ways (::ffff:0.0.0.0 and ::ffff:0:0).
        let as_ip = |h: &Option<String>| h.as_deref().and_then(|h| h.parse::<std::net::Ipv6Addr>().ok());
        match (as_ip(&ours.host), as_ip(&reference_host)) {
            (Some(a), Some(b)) => prop_assert_eq!(a, b),
            _ => prop_assert_eq!(ours.host, reference_host),
        }
        // url drops a port equal to the scheme's default (80, 443); the text had it.
        match reference.port() {
            Some(p) => prop_assert_eq!(ours.port, Some(p)),
            None => prop_assert!(ours.port.is_none() || ours.port == reference.port_or_known_default()),
        }
        prop_assert_eq!(decoded(&ours.path), decoded(reference.path().trim_start_matches('/')));
        prop_assert_eq!(ours.query.as_deref(), reference.query());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Credentials and a database written raw (not percent-encoded), with every character a
    /// userinfo or a path may hold unencoded: read as `url` reads them, once decoded.
    #[test]
    fn raw_parts_read_as_the_url_crate_reads_them(
        user in "[a-zA-Z0-9!$&'()*+,;=._~%-]{0,10}",
        password in "[a-zA-Z0-9!$&'()*+,;=._~%:@-]{0,10}",
        db in "[a-zA-Z0-9!$&'()*+,;=_~%@:-]{0,10}",
    ) {
        use percent_encoding::percent_decode_str;
        let text = format!("clickhouse://{user}:{password}@h:9000/{db}");
        let decoded = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        match (url::Url::parse(&text), clickhouse_state::uri::parse(&text)) {
            (Ok(r), Ok(o)) => {
                prop_assert_eq!(decoded(&o.user), decoded(r.username()));
                prop_assert_eq!(o.password.as_deref().map(decoded), r.password().map(decoded));
                prop_assert_eq!(o.host.as_deref(), r.host_str());
                prop_assert_eq!(decoded(&o.path), decoded(r.path().trim_start_matches('/')));
            }
            (Err(_), Err(_)) => {}
            (r, o) => return Err(TestCaseError::fail(format!("{text}: url {r:?}, ours {o:?}"))),
        }
    }
}

/// Edges the generator above does not reach:/// Edges the generator above does not reach: the parser and `url` both accept each, or both
/// refuse it.
#[test]
fn the_uri_parser_refuses_what_the_url_crate_refuses() {
    for text in [
        "clickhouse://h:0080/db",
        "clickhouse://h:/db",
        "clickhouse://h:65535",
        "clickhouse://h:65536",
        "clickhouse://h:1:2/db",
        "clickhouse://u@/db",
        "clickhouse://:8123/db",
        "clickhouse:///db",
        "clickhouse://u:p@ss@h/db",
        "clickhouse://u:p:q@h/db",
        "clickhouse://h?secure=true",
        "clickhouse://[::1]:8123/db",
        "clickhouse://[::1]8123/db",
        "clickhouse://[::1/db",
        "clickhouse://h/a\\b",
        "clickhouse://h\\x/db",
        "clickhouse://h<x>/db",
        "clickhouse://h%41/db",
    ] {
        let ours = clickhouse_state::uri::parse(text);
        let reference = url::Url::parse(text);
        let host_ok = reference.as_ref().map(|r| {
            r.host_str().is_none_or(|h| {
                h.trim_matches(['[', ']'])
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c))
            })
        });
        // Stricter than url on the host's characters alone.
        let expected = matches!(host_ok, Ok(true));
        assert_eq!(
            ours.is_ok(),
            expected,
            "{text}: url {reference:?}, ours {ours:?}"
        );
    }
}

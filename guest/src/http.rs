//! A small blocking ClickHouse HTTP client over any [`Transport`].
//!
//! One request at a time. It sends the credentials in `X-ClickHouse-User`/`X-ClickHouse-Key`
//! headers (never in the URL), `wait_end_of_query=1` so that errors come with a real status,
//! and turns every failure into the typed [`Error`]. The password is redacted from anything the
//! server or the transport sends back.

use crate::config::{Config, Scheme, Secret};
use crate::error::{Error, Result, ServerError};
use crate::sql::{Query, escape_param};

/// An HTTP request, as the transport sends it. The body is shared with the query it came from,
/// so sending (and resending) a large insert copies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub scheme: Scheme,
    pub authority: String,
    pub path_and_query: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: std::rc::Rc<Vec<u8>>,
}

/// An HTTP response, fully read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub body: Vec<u8>,
    /// `written_rows` of the `X-ClickHouse-Summary` header; `None` when the header is missing
    /// or unreadable (a proxy may drop it), so that callers cannot mistake that for zero.
    pub written_rows: Option<u64>,
}

/// `written_rows` of a summary header: `{"read_rows":"1",...,"written_rows":"0",...}`, numbers
/// as strings (as plain numbers tolerated).
fn written_rows(summary: &str) -> Option<u64> {
    match serde_json::from_str::<serde_json::Value>(summary)
        .ok()?
        .get("written_rows")?
    {
        serde_json::Value::String(text) => text.parse().ok(),
        serde_json::Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The host's policy refused the request.
    Denied(String),
    /// The peer cannot be talked to, and trying again will not change that (TLS).
    Incompatible(String),
    /// The answer was not HTTP: a peer that does not speak it, or a dropped connection that
    /// the host words so (Node's WASI shim reports a reset as an HTTP protocol error). Tried
    /// again like a reset until it repeats [`GARBLED_TRIES`] times in a row, then given up.
    Garbled(String),
    /// The request never left: the connection was refused, the name or address not found, or
    /// the request refused before it was sent. It cannot have been done on the server.
    Unsent(String),
    /// A connection reset, or another failure after the request may have reached the server.
    Unreachable(String),
    /// No answer in time.
    Timeout(String),
}

/// Sends one HTTP request and reads the whole response.
pub trait Transport {
    fn send(&self, request: Request) -> std::result::Result<Response, TransportError>;
}

/// Answers in a row that were not HTTP before a request is given up as one to a peer that does
/// not speak it (see [`TransportError::Garbled`]).
pub const GARBLED_TRIES: u32 = 3;

/// A ClickHouse endpoint with credentials.
pub struct Client<T> {
    transport: T,
    scheme: Scheme,
    authority: String,
    endpoint: String,
    database: String,
    user: String,
    password: Secret,
    /// Answers in a row that were not HTTP (see [`TransportError::Garbled`]).
    garbled: std::cell::Cell<u32>,
    /// The last request may have reached the server (it was not refused before it left).
    reached: std::cell::Cell<bool>,
}

impl<T: Transport> Client<T> {
    pub fn new(config: &Config, transport: T) -> Self {
        Client {
            transport,
            scheme: config.scheme,
            authority: config.authority(),
            endpoint: config.endpoint(),
            database: config.database.clone(),
            user: config.user.clone(),
            password: config.password.clone(),
            garbled: std::cell::Cell::new(0),
            reached: std::cell::Cell::new(false),
        }
    }

    /// Whether the last request may have reached the server: false when it failed before it
    /// left (refused by the policy, a refused connection, no such name, a TLS handshake).
    pub fn may_have_reached(&self) -> bool {
        self.reached.get()
    }

    /// Runs a query; returns the response body.
    pub fn execute(&self, query: &Query) -> Result<Vec<u8>> {
        self.execute_with(query, &[])
    }

    /// Runs a query with more settings (the deployment's, see `deployment::Consistency`).
    pub fn execute_with(&self, query: &Query, settings: &[(&str, &str)]) -> Result<Vec<u8>> {
        self.answer(query, settings).map(|answer| answer.body)
    }

    /// Runs a query; returns the body with what the summary header counted.
    pub fn answer(&self, query: &Query, settings: &[(&str, &str)]) -> Result<Answer> {
        let request = self.request(query, settings);
        let sent = self.transport.send(request);
        let garbled = matches!(sent, Err(TransportError::Garbled(_)));
        self.reached.set(!matches!(
            sent,
            Err(TransportError::Unsent(_)
                | TransportError::Denied(_)
                | TransportError::Incompatible(_))
        ));
        self.garbled
            .set(if garbled { self.garbled.get() + 1 } else { 0 });
        let response = sent.map_err(|e| self.transport_error(e))?;
        let written_rows = response
            .header("X-ClickHouse-Summary")
            .and_then(written_rows);
        Ok(Answer {
            body: self.check(response)?,
            written_rows,
        })
    }

    fn request(&self, query: &Query, settings: &[(&str, &str)]) -> Request {
        let mut url = form_urlencoded::Serializer::new(String::from("/?"));
        url.append_pair("database", &self.database);
        url.append_pair("wait_end_of_query", "1");
        for (name, value) in settings {
            url.append_pair(name, value);
        }
        for (name, value) in &query.settings {
            url.append_pair(name, value);
        }
        for (name, value) in &query.params {
            url.append_pair(&format!("param_{name}"), &escape_param(value));
        }
        // The statement goes in the URL, so that each shows in the request line, and only an
        // INSERT's data goes in the body. A request with no body is whole when it is sent: the
        // server does not wait for a body, and a host makes fewer calls (no body stream).
        url.append_pair("query", &query.sql);
        let body = match &query.data {
            Some(data) => std::rc::Rc::clone(data),
            None => std::rc::Rc::default(),
        };
        Request {
            scheme: self.scheme,
            authority: self.authority.clone(),
            path_and_query: url.finish(),
            headers: vec![
                ("X-ClickHouse-User".into(), self.user.clone().into_bytes()),
                (
                    "X-ClickHouse-Key".into(),
                    self.password.expose().as_bytes().to_vec(),
                ),
                ("Content-Type".into(), b"text/plain; charset=UTF-8".to_vec()),
            ],
            body,
        }
    }

    fn transport_error(&self, error: TransportError) -> Error {
        match error {
            TransportError::Denied(m) => Error::Refused(self.redact(&format!(
                "request to {} denied by the host's policy: {m}",
                self.endpoint
            ))),
            TransportError::Incompatible(m) => {
                Error::Refused(self.redact(&format!("cannot reach {}: {m}", self.endpoint)))
            }
            TransportError::Unsent(m) | TransportError::Unreachable(m) => {
                Error::Unreachable(self.redact(&format!("cannot reach {}: {m}", self.endpoint)))
            }
            TransportError::Garbled(m) if self.garbled.get() < GARBLED_TRIES => {
                Error::Unreachable(self.redact(&format!("cannot reach {}: {m}", self.endpoint)))
            }
            TransportError::Garbled(m) => {
                self.garbled.set(0);
                Error::Refused(self.redact(&format!(
                    "cannot reach {}: {m} ({GARBLED_TRIES} times in a row)",
                    self.endpoint
                )))
            }
            TransportError::Timeout(m) => Error::Timeout(
                self.redact(&format!("no answer from {} in time: {m}", self.endpoint)),
            ),
        }
    }

    fn check(&self, response: Response) -> Result<Vec<u8>> {
        if response.status == 200 {
            if let Some(text) = mid_stream_exception(&response) {
                return Err(self.server_error(&text, None));
            }
            return Ok(response.body);
        }
        let text = String::from_utf8_lossy(&response.body).into_owned();
        let header_code = response
            .header("X-ClickHouse-Exception-Code")
            .and_then(|c| c.trim().parse::<i32>().ok());
        if matches!(response.status, 401 | 403)
            || matches!(header_code, Some(192..=194 | 516 | 497))
        {
            let parsed = parse_exception(&text);
            return Err(Error::Unauthorized(self.redact(&format!(
                "{} refused user '{}': {}",
                self.endpoint,
                self.user,
                parsed.map(|e| e.message).unwrap_or_else(|| format!("HTTP {}", response.status))
            ))));
        }
        if header_code.is_none() && parse_exception(&text).is_none() {
            // Not ClickHouse talking (a proxy, a load balancer, another service).
            let snippet: String = text.chars().take(200).collect();
            return Err(Error::Server(ServerError {
                code: 0,
                name: format!("HTTP_{}", response.status),
                message: self.redact(&format!(
                    "{} answered HTTP {} without a ClickHouse error: {snippet}",
                    self.endpoint, response.status
                )),
            }));
        }
        Err(self.server_error(&text, header_code))
    }

    fn server_error(&self, text: &str, header_code: Option<i32>) -> Error {
        let parsed = parse_exception(text).unwrap_or(ServerError {
            code: header_code.unwrap_or(0),
            name: String::new(),
            message: text.trim().to_string(),
        });
        let error = ServerError {
            code: header_code.unwrap_or(parsed.code),
            name: parsed.name,
            message: self.redact(&parsed.message),
        };
        if error.code == 159 || error.code == 209 {
            return Error::Timeout(format!("{} ({})", error.message, error.name));
        }
        // SETTING_CONSTRAINT_VIOLATION: a profile pins a setting (say, async_insert = 1) that
        // this backend sets on each query for its safety; it must not run without.
        if error.code == 452 {
            return Error::InvalidConfig(format!(
                "the server refuses a setting this backend sends on every query for safe writes \
                 and reads (async_insert=0, insert_deduplicate=1, insert_quorum on a cluster, \
                 select_sequential_consistency=1, mutations_sync): allow them in the user's \
                 settings profile. ClickHouse said: {} ({})",
                error.message, error.name
            ));
        }
        Error::Server(error)
    }

    /// Removes the password from text that came from outside.
    fn redact(&self, text: &str) -> String {
        let password = self.password.expose();
        if password.is_empty() {
            text.to_string()
        } else {
            text.replace(password, "<redacted>")
        }
    }
}

/// Parses `Code: 60. DB::Exception: <message>. (UNKNOWN_TABLE) (version ...)`.
pub fn parse_exception(text: &str) -> Option<ServerError> {
    let start = text.find("Code: ")?;
    let rest = &text[start + "Code: ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let code: i32 = digits.parse().ok()?;
    let mut message = rest[digits.len()..].trim_start_matches('.').trim_start();
    message = message
        .strip_prefix("DB::Exception:")
        .unwrap_or(message)
        .trim();
    // Drop " (version x.y)" and take the error name from the last "(NAME)".
    if let Some(pos) = message.rfind(" (version ") {
        message = message[..pos].trim_end();
    }
    let mut name = String::new();
    if let Some(open) = message.rfind('(').filter(|_| message.ends_with(')')) {
        let candidate = &message[open + 1..message.len() - 1];
        if !candidate.is_empty()
            && candidate
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            name = candidate.to_string();
            message = message[..open].trim_end();
        }
    }
    Some(ServerError {
        code,
        name,
        message: message.to_string(),
    })
}

/// A 200 response can still carry an error raised after streaming began. ClickHouse 25.11+
/// frames it as `__exception__\r\n<tag>\r\n<text>\n<len> <tag>\r\n__exception__\r\n`, with the
/// tag in `X-ClickHouse-Exception-Tag`; older servers append `__exception__` and the text.
pub fn mid_stream_exception(response: &Response) -> Option<String> {
    const MARKER: &str = "__exception__";
    let tail_start = response.body.len().saturating_sub(1 << 20);
    let tail = &response.body[tail_start..];
    // The common case, no marker at all, is one byte search (a 100k-state answer is 15 MB).
    memchr::memmem::rfind(tail, MARKER.as_bytes())?;
    let tail = String::from_utf8_lossy(tail);
    if let Some(tag) = response.header("X-ClickHouse-Exception-Tag") {
        let closing = format!("{tag}\r\n{MARKER}\r\n");
        let trimmed = tail.trim_end_matches(['\r', '\n']);
        if !(tail.ends_with(&closing) || trimmed.ends_with(&closing[..closing.len() - 2])) {
            return None;
        }
        let opening = format!("{MARKER}\r\n{tag}\r\n");
        let start = tail.rfind(&opening)? + opening.len();
        let end = tail.rfind(&closing)?;
        let inner = tail.get(start..end)?;
        // Drop the trailing "<len> " before the closing tag.
        let inner = inner.trim_end();
        let inner = match inner.rsplit_once('\n') {
            Some((text, len)) if len.trim().chars().all(|c| c.is_ascii_digit()) => text,
            _ => inner,
        };
        return Some(inner.trim().to_string());
    }
    // Untagged: the marker starts a line (JSON rows cannot contain a raw newline) and the
    // exception text follows it.
    let pos = if tail.starts_with(MARKER) {
        0
    } else {
        tail.rfind(&format!("\n{MARKER}"))? + 1
    };
    let after = tail[pos + MARKER.len()..].trim();
    after.starts_with("Code: ").then(|| after.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    struct Canned {
        response: std::result::Result<Response, TransportError>,
        seen: RefCell<Vec<Request>>,
    }

    impl Transport for &Canned {
        fn send(&self, request: Request) -> std::result::Result<Response, TransportError> {
            self.seen.borrow_mut().push(request);
            self.response.clone()
        }
    }

    fn canned(status: u16, headers: &[(&str, &str)], body: &str) -> Canned {
        Canned {
            response: Ok(Response {
                status,
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: body.as_bytes().to_vec(),
            }),
            seen: RefCell::new(Vec::new()),
        }
    }

    #[test]
    fn written_rows_come_from_the_summary_header_or_are_unknown() {
        assert_eq!(
            written_rows(r#"{"read_rows":"1","written_rows":"1","elapsed_ns":"4505959"}"#),
            Some(1)
        );
        assert_eq!(written_rows(r#"{"written_rows":0}"#), Some(0));
        assert_eq!(written_rows(r#"{"read_rows":"1"}"#), None);
        assert_eq!(written_rows("not json"), None);
    }

    fn config() -> Config {
        Config::parse("clickhouse://alice:hunter2-pw@ch.local:8123/db", &[]).expect("valid")
    }

    fn query() -> Query {
        crate::sql::Statements::new(&config()).get("a\tb\\c").query
    }

    #[test]
    fn request_carries_auth_in_headers_and_params_escaped() {
        let transport = canned(200, &[], "");
        let client = Client::new(&config(), &transport);
        client.execute(&query()).expect("ok");
        let seen = transport.seen.borrow();
        let request = &seen[0];
        assert_eq!(request.authority, "ch.local:8123");
        assert!(!request.path_and_query.contains("hunter2"));
        assert!(request.path_and_query.contains("wait_end_of_query=1"));
        assert!(request.path_and_query.contains("database=db"));
        // a\tb\c -> TSV a\\tb\\\\c -> urlencoded
        assert!(
            request.path_and_query.contains("param_id=a%5Ctb%5C%5Cc"),
            "{}",
            request.path_and_query
        );
        assert!(
            request
                .headers
                .contains(&("X-ClickHouse-Key".into(), b"hunter2-pw".to_vec()))
        );
        assert!(request.path_and_query.contains("query=SELECT"));
        assert!(request.body.is_empty(), "a read sends no body");
    }

    #[test]
    fn inserts_put_sql_in_the_url_and_data_in_the_body() {
        let transport = canned(200, &[], "");
        let client = Client::new(&config(), &transport);
        let q = crate::sql::Statements::new(&config()).insert_states(b"{\"x\":1}\n".to_vec(), "t");
        client
            .execute_with(&q, &[("async_insert", "0")])
            .expect("ok");
        let request = &transport.seen.borrow()[0];
        assert!(request.path_and_query.contains("query=INSERT"));
        // the deployment's settings and the query's own
        assert!(request.path_and_query.contains("async_insert=0"));
        assert!(
            request
                .path_and_query
                .contains("insert_deduplication_token=t")
        );
        assert_eq!(&*request.body, b"{\"x\":1}\n");
    }

    #[test]
    fn a_profile_that_pins_our_settings_is_a_configuration_error() {
        let transport = canned(
            500,
            &[("X-ClickHouse-Exception-Code", "452")],
            "Code: 452. DB::Exception: Setting async_insert should not be changed. \
             (SETTING_CONSTRAINT_VIOLATION) (version 26.9.2.1)",
        );
        match Client::new(&config(), &transport).execute(&query()) {
            Err(Error::InvalidConfig(m)) => {
                assert!(m.contains("settings profile"), "{m}");
                assert!(m.contains("async_insert should not be changed"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn server_errors_are_parsed() {
        let transport = canned(
            404,
            &[("X-ClickHouse-Exception-Code", "60")],
            "Code: 60. DB::Exception: Unknown table expression identifier 'meltano.state'. (UNKNOWN_TABLE) (version 26.9.2.1)\n",
        );
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        assert_eq!(
            err,
            Error::Server(ServerError {
                code: 60,
                name: "UNKNOWN_TABLE".into(),
                message: "Unknown table expression identifier 'meltano.state'.".into()
            })
        );
        assert!(err.is_missing_schema());
    }

    #[test]
    fn auth_failures_are_unauthorized_and_redacted() {
        let transport = canned(
            403,
            &[("X-ClickHouse-Exception-Code", "516")],
            "Code: 516. DB::Exception: alice: Authentication failed: password is incorrect (hunter2-pw). (AUTHENTICATION_FAILED) (version 26.9.2.1)\n",
        );
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        let Error::Unauthorized(message) = &err else {
            panic!("{err:?}")
        };
        assert!(message.contains("alice"));
        assert!(!message.contains("hunter2-pw"), "{message}");
    }

    #[test]
    fn non_clickhouse_errors_say_so() {
        let transport = canned(502, &[], "<html>Bad Gateway</html>");
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        let Error::Server(e) = err else { panic!() };
        assert_eq!(e.name, "HTTP_502");
        assert!(e.message.contains("Bad Gateway"));
    }

    #[test]
    fn timeouts_from_the_server_are_timeouts() {
        let transport = canned(
            408,
            &[("X-ClickHouse-Exception-Code", "159")],
            "Code: 159. DB::Exception: Timeout exceeded: elapsed 5 seconds. (TIMEOUT_EXCEEDED) (version 26.9.2.1)",
        );
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    }

    #[test]
    fn tagged_mid_stream_exception_is_an_error() {
        let text = "Code: 395. DB::Exception: Value passed to 'throwIf' function is non-zero. (FUNCTION_THROW_IF_VALUE_IS_NON_ZERO) (version 26.9.2.1)";
        let body = format!(
            "{{\"a\":1}}\n__exception__\r\nabcdefghijklmnop\r\n{text}\n{} abcdefghijklmnop\r\n__exception__\r\n",
            text.len()
        );
        let transport = canned(
            200,
            &[("X-ClickHouse-Exception-Tag", "abcdefghijklmnop")],
            &body,
        );
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        let Error::Server(e) = err else {
            panic!("{err:?}")
        };
        assert_eq!(e.code, 395);
        assert_eq!(e.name, "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO");
    }

    #[test]
    fn untagged_mid_stream_exception_is_an_error() {
        let body = "{\"a\":1}\n__exception__\nCode: 241. DB::Exception: Memory limit exceeded. (MEMORY_LIMIT_EXCEEDED) (version 25.3.1)\n";
        let transport = canned(200, &[], body);
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        assert!(
            matches!(err, Error::Server(ServerError { code: 241, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn data_that_mentions_the_marker_is_not_an_error() {
        let body = "{\"state\":\"__exception__ Code: 1\"}\n";
        let transport = canned(
            200,
            &[("X-ClickHouse-Exception-Tag", "abcdefghijklmnop")],
            body,
        );
        assert!(Client::new(&config(), &transport).execute(&query()).is_ok());
        let transport = canned(200, &[], body);
        assert!(Client::new(&config(), &transport).execute(&query()).is_ok());
    }

    #[test]
    fn transport_errors_name_the_endpoint() {
        let transport = Canned {
            response: Err(TransportError::Unreachable("connection refused".into())),
            seen: RefCell::new(Vec::new()),
        };
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        assert_eq!(
            err,
            Error::Unreachable("cannot reach http://ch.local:8123: connection refused".into())
        );
        let transport = Canned {
            response: Err(TransportError::Denied("not allowed".into())),
            seen: RefCell::new(Vec::new()),
        };
        let err = Client::new(&config(), &transport)
            .execute(&query())
            .unwrap_err();
        assert!(
            matches!(&err, Error::Refused(m) if m.contains("denied")),
            "{err:?}"
        );
        assert!(!err.is_transient());
    }

    /// An answer that is not HTTP is tried again like a reset (a host may word a reset so),
    /// until it repeats GARBLED_TRIES times in a row; then it is a peer that does not speak
    /// HTTP, given up at once. An answer in between starts the count again.
    #[test]
    fn an_answer_that_is_not_http_is_transient_until_it_repeats() {
        let garbled = Canned {
            response: Err(TransportError::Garbled("HTTP protocol error".into())),
            seen: RefCell::new(Vec::new()),
        };
        let client = Client::new(&config(), &garbled);
        for _ in 1..GARBLED_TRIES {
            let err = client.execute(&query()).unwrap_err();
            assert!(err.is_transient(), "{err:?}");
        }
        let err = client.execute(&query()).unwrap_err();
        assert!(
            matches!(&err, Error::Refused(m) if m.contains("3 times in a row")),
            "{err:?}"
        );
        // The count starts again after it gives up.
        assert!(client.execute(&query()).unwrap_err().is_transient());

        // And after an answer: two garbled, one answer, two garbled are all tried again.
        let garbled = || Err(TransportError::Garbled("HTTP protocol error".into()));
        let answer = canned(200, &[], "1").response;
        let mixed = Sequence(RefCell::new(vec![
            garbled(),
            garbled(),
            answer,
            garbled(),
            garbled(),
        ]));
        let client = Client::new(&config(), &mixed);
        for expect_ok in [false, false, true, false, false] {
            match client.execute(&query()) {
                Ok(_) => assert!(expect_ok),
                Err(e) => assert!(!expect_ok && e.is_transient(), "{e:?}"),
            }
        }
    }

    /// Answers in the order given.
    struct Sequence(RefCell<Vec<std::result::Result<Response, TransportError>>>);

    impl Transport for &Sequence {
        fn send(&self, _: Request) -> std::result::Result<Response, TransportError> {
            self.0.borrow_mut().remove(0)
        }
    }
}

//! What several test files share without the integration-tests library (which cannot use the
//! guest crate, a dev-dependency).

use clickhouse_state::http::{Request, Response, Transport, TransportError};

/// The guest's HTTP client, compiled natively, over plain blocking HTTP.
pub struct Ureq;

impl Transport for Ureq {
    fn send(&self, request: Request) -> Result<Response, TransportError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut call = agent.post(format!(
            "http://{}{}",
            request.authority, request.path_and_query
        ));
        for (name, value) in &request.headers {
            call = call.header(name.as_str(), String::from_utf8_lossy(value).into_owned());
        }
        let mut response = call
            .send(&request.body[..])
            .map_err(|e| TransportError::Unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect();
        let body = response
            .body_mut()
            .read_to_vec()
            .map_err(|e| TransportError::Unreachable(e.to_string()))?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// Who the statement-level tests write as, in the history (they build statements themselves).
pub const ORIGIN: clickhouse_state::sql::Origin<'static> = clickhouse_state::sql::Origin {
    op: clickhouse_state::sql::Op::Set,
    writer: "integration-tests",
    lock_owner: "",
    token: 0,
};

/// Counts the requests an instance sends (its host's interceptor).
#[derive(Default)]
pub struct Requests(std::sync::atomic::AtomicUsize);

impl integration_tests::state_host::http::hook::Interceptor for Requests {
    fn before_send(&self, _method: &http::Method, _uri: &http::Uri) -> Option<std::time::Duration> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        None
    }
}

impl Requests {
    /// The requests sent since the last call.
    pub fn take(&self) -> usize {
        self.0.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

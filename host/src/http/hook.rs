//! The wasi:http hook of one instance: the policy decides whether a request may go, an
//! [`Interceptor`] (tests) may hold it back, and the instance's [`Exchange`] sends it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderName;
use http_body_util::BodyExt;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error as HttpError, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use super::Exchange;
use super::policy::EgressPolicy;
use super::sender::{Sent, tls_failure};
use crate::clock::Clock;
use crate::telemetry::recorder::{Recorder, Statement};

/// Forbidden on top of wasmtime's defaults (names are lower case).
const EXTRA_FORBIDDEN_HEADERS: &[&str] = &[
    "te",
    "trailer",
    "expect",
    "via",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "content-length",
];

type SendFuture = Box<dyn Future<Output = Result<Sent, HttpError>> + Send>;

/// Sees every request a guest sends that its policy allowed, before it goes out. Tests use it
/// to count round trips and to delay chosen requests (in the instance's clock's time).
pub trait Interceptor: Send + Sync + 'static {
    /// How long to hold this request back, if at all.
    fn before_send(&self, method: &http::Method, uri: &http::Uri) -> Option<Duration>;

    /// The request's body, a frame at a time, as it goes out: `bytes` of data.
    fn body_sent(&self, _bytes: usize) {}
}

/// The wasi:http hook of one instance: its policy decides, its exchange sends.
pub struct OutgoingHook {
    policy: EgressPolicy,
    exchange: Arc<dyn Exchange>,
    clock: Arc<dyn Clock>,
    interceptor: Option<Arc<dyn Interceptor>>,
    /// The policy refused a destination's address since the host last asked
    /// ([`OutgoingHook::took_refusal`]): the guest only sees a wasi:http error code, and the host
    /// names the fix.
    refused: Arc<AtomicBool>,
    /// What the host saw of the last request's failure that its error code cannot carry (a
    /// certificate's rejection reason, what came back instead of HTTP): the host adds it to the
    /// guest's message ([`OutgoingHook::took_detail`]), so that no side reads the other's text.
    detail: Arc<Mutex<Option<String>>>,
    /// Each request as a statement's span and metrics, when the host exports them.
    recorder: Option<Arc<Recorder>>,
}

impl OutgoingHook {
    pub fn new(
        policy: EgressPolicy,
        exchange: Arc<dyn Exchange>,
        clock: Arc<dyn Clock>,
        interceptor: Option<Arc<dyn Interceptor>>,
    ) -> Self {
        OutgoingHook {
            policy,
            exchange,
            clock,
            interceptor,
            refused: Arc::default(),
            detail: Arc::default(),
            recorder: None,
        }
    }

    /// Records each request as a statement (see [`Recorder::statement`]).
    pub fn with_recorder(mut self, recorder: Option<Arc<Recorder>>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Whether the policy refused a destination's address since the last time this was asked.
    pub fn took_refusal(&self) -> bool {
        self.refused.swap(false, Ordering::Relaxed)
    }

    /// The host's account of the last request's failure, if it has one to add.
    pub fn took_detail(&self) -> Option<String> {
        self.detail.lock().ok()?.take()
    }

    fn note(&self, detail: Option<String>) {
        if let Ok(mut slot) = self.detail.lock() {
            *slot = detail;
        }
    }
}

impl WasiHttpHooks for OutgoingHook {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        drop(fut);
        self.note(None);
        let statement = self.recorder.as_ref().map(|r| r.statement(request.uri()));
        if let Err(refused) = self.policy.check(request.uri()) {
            tracing::warn!(target: "egress", authority = %refused, "request denied: not an allowed ClickHouse endpoint");
            if let Some(statement) = statement {
                // Not the refused URI: without an authority it is the whole request, query
                // string included.
                statement.finish::<()>(Err("denied by the host's policy".into()));
            }
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let options = self.policy.timeouts.clamp(options);
        let addresses = self.policy.addresses;
        let delay = self
            .interceptor
            .as_ref()
            .and_then(|i| i.before_send(request.method(), request.uri()));
        let counted = statement.as_ref().map(Statement::body_counter);
        let request = match (&self.interceptor, counted) {
            (None, None) => request,
            (interceptor, counted) => {
                let interceptor = interceptor.clone();
                request.map(move |body| {
                    body.map_frame(move |frame| {
                        if let Some(data) = frame.data_ref() {
                            if let Some(interceptor) = &interceptor {
                                interceptor.body_sent(data.len());
                            }
                            if let Some(counted) = &counted {
                                counted.fetch_add(data.len() as u64, Ordering::Relaxed);
                            }
                        }
                        frame
                    })
                    .boxed_unsync()
                })
            }
        };
        let pause = delay.map(|d| self.clock.sleep(d.as_millis() as u64));
        let exchange = Arc::clone(&self.exchange);
        let refused = Arc::clone(&self.refused);
        Box::new(async move {
            if let Some(pause) = pause {
                pause.await;
            }
            let sent = exchange.exchange(request, options, addresses).await;
            if matches!(sent, Err(HttpError::DestinationIpProhibited)) {
                refused.store(true, Ordering::Relaxed);
            }
            if let Some(statement) = statement {
                statement.finish(match &sent {
                    Ok((response, _)) => Ok(response),
                    Err(e) => Err(e.to_string()),
                });
            }
            sent
        })
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        // wasmtime's list (hop-by-hop, Host, proxy credentials) plus headers that could make
        // a request look as if it came from somewhere else, or change its framing.
        Arc::new(|name: &HeaderName| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name)
                || EXTRA_FORBIDDEN_HEADERS.contains(&name.as_str())
        })
    }

    fn p2_error_from_tls(&mut self, err: &std::io::Error) -> ErrorCode {
        let (code, detail) = tls_failure(err);
        tracing::debug!(target: "egress", "TLS failed: {code:?} {detail:?}");
        self.note(detail);
        code
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        match err.kind() {
            std::io::ErrorKind::ConnectionRefused => ErrorCode::ConnectionRefused,
            _ => ErrorCode::InternalError(Some(format!("connect failed: {err}"))),
        }
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        // A TLS failure after the handshake (a server refusing our client certificate, say)
        // surfaces as an I/O error inside hyper's.
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>().filter(|io| {
                io.get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>())
            }) {
                let (code, detail) = tls_failure(io);
                self.note(detail);
                return code;
            }
            source = cause.source();
        }
        if err.is_incomplete_message() || err.is_canceled() {
            return ErrorCode::ConnectionTerminated;
        }
        if err.is_parse() {
            self.note(Some(format!(
                "the answer is not HTTP ({err}); is this a TLS port that needs secure=true?"
            )));
            return ErrorCode::HttpProtocolError;
        }
        ErrorCode::InternalError(Some(format!("HTTP: {err}")))
    }
}

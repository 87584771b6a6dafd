//! [`Transport`] over `wasi:http/outgoing-handler`: blocking, one request at a time.

use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingResponse, Method, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme as WasiScheme,
};
use crate::bindings::wasi::io::streams::{OutputStream, StreamError};
use crate::config::Scheme;
use crate::http::{Request, Response, Transport, TransportError};

/// The most `blocking-write-and-flush` takes in one call.
const READ_CHUNK: u64 = 64 * 1024;
const CONNECT_TIMEOUT_NS: u64 = 10_000_000_000;
const FIRST_BYTE_TIMEOUT_NS: u64 = 60_000_000_000;
const BETWEEN_BYTES_TIMEOUT_NS: u64 = 60_000_000_000;

pub struct WasiHttp;

impl Transport for WasiHttp {
    fn send(&self, request: Request) -> Result<Response, TransportError> {
        let headers = Fields::new();
        for (name, value) in &request.headers {
            headers
                .append(name, value)
                .map_err(|e| TransportError::Unsent(format!("header {name} refused: {e:?}")))?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let scheme = match request.scheme {
            Scheme::Http => WasiScheme::Http,
            Scheme::Https => WasiScheme::Https,
        };
        let refused = |what: &str| TransportError::Unsent(format!("invalid request {what}"));
        outgoing
            .set_method(&Method::Post)
            .map_err(|()| refused("method"))?;
        outgoing
            .set_scheme(Some(&scheme))
            .map_err(|()| refused("scheme"))?;
        outgoing
            .set_authority(Some(&request.authority))
            .map_err(|()| refused("authority"))?;
        outgoing
            .set_path_with_query(Some(&request.path_and_query))
            .map_err(|()| refused("path"))?;

        let options = RequestOptions::new();
        // A host may not support a timeout; its own limits apply then.
        let _ = options.set_connect_timeout(Some(CONNECT_TIMEOUT_NS));
        let _ = options.set_first_byte_timeout(Some(FIRST_BYTE_TIMEOUT_NS));
        let _ = options.set_between_bytes_timeout(Some(BETWEEN_BYTES_TIMEOUT_NS));

        let body = outgoing.body().map_err(|()| refused("body"))?;
        if request.body.is_empty() {
            // Finished before it is sent, the request is whole: no body stream, and a host
            // need not wait for one.
            OutgoingBody::finish(body, None).map_err(error_code)?;
            let future = outgoing_handler::handle(outgoing, Some(options)).map_err(error_code)?;
            return read_response(await_response(&future)?);
        }
        // As much of the body as the host takes without waiting is written before the request
        // is handed over: a body that is whole by then goes out with its headers in one write,
        // instead of the headers first and the body after a round through the host. The rest,
        // if any, is written once the host is sending (waiting for room before would wait for
        // ever: nothing drains the body until then).
        let mut rest: &[u8] = &request.body;
        let stream = body.write().ok();
        if let Some(stream) = &stream {
            write_body(stream, &mut rest, false);
        }
        if rest.is_empty() {
            drop(stream);
            OutgoingBody::finish(body, None).map_err(error_code)?;
            let future = outgoing_handler::handle(outgoing, Some(options)).map_err(error_code)?;
            return read_response(await_response(&future)?);
        }
        let future = outgoing_handler::handle(outgoing, Some(options)).map_err(error_code)?;
        // If the host refuses the request, writing the body fails first; the response future
        // then carries the real reason, so a write failure only stops the writing.
        if let Some(stream) = stream {
            write_body(&stream, &mut rest, true);
            let _ = stream.blocking_flush();
        }
        let finished = OutgoingBody::finish(body, None);
        let response = await_response(&future)?;
        if let Err(code) = finished {
            return Err(error_code(code));
        }
        read_response(response)
    }
}

/// Writes as much of `rest` as the host permits per write (a large insert is not cut into
/// 4 KiB writes that each wait for a flush); when the host has no room, waits for it if `wait`,
/// else stops. A write failure stops the writing.
fn write_body(stream: &OutputStream, rest: &mut &[u8], wait: bool) {
    while !rest.is_empty() {
        let Ok(permit) = stream.check_write() else {
            return;
        };
        if permit == 0 {
            if !wait {
                return;
            }
            stream.subscribe().block();
            continue;
        }
        let n = usize::try_from(permit)
            .unwrap_or(usize::MAX)
            .min(rest.len());
        if stream.write(&rest[..n]).is_err() {
            return;
        }
        *rest = &rest[n..];
    }
}

fn await_response(future: &FutureIncomingResponse) -> Result<IncomingResponse, TransportError> {
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => Ok(response),
        Some(Ok(Err(code))) => Err(error_code(code)),
        Some(Err(())) => Err(TransportError::Unreachable(
            "the response was already taken".into(),
        )),
        None => Err(TransportError::Timeout("no response".into())),
    }
}

fn read_response(response: IncomingResponse) -> Result<Response, TransportError> {
    let status = response.status();
    let headers: Vec<(String, String)> = response
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    let incoming = response
        .consume()
        .map_err(|()| TransportError::Unreachable("response body unavailable".into()))?;
    let stream = incoming
        .stream()
        .map_err(|()| TransportError::Unreachable("response body unavailable".into()))?;
    // Sized from Content-Length when the server sends one, so a large answer is not copied
    // on every doubling of the buffer.
    let expected = headers_length(&headers).unwrap_or(0);
    let mut body = Vec::with_capacity(expected.min(MAX_PRESIZE));
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                // The host's debug text can carry a backtrace: keep its first line.
                let detail = e.to_debug_string();
                let first = detail.lines().next().unwrap_or("I/O error").to_string();
                return Err(TransportError::Unreachable(format!(
                    "the connection failed while reading the response: {first}"
                )));
            }
        }
    }
    drop(stream);
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Presizing trusts Content-Length only this far; the body may still grow past it.
const MAX_PRESIZE: usize = 64 << 20;

fn headers_length(headers: &[(String, String)]) -> Option<usize> {
    headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
}

fn error_code(code: ErrorCode) -> TransportError {
    match code {
        ErrorCode::HttpRequestDenied => {
            TransportError::Denied("the host does not allow this destination".into())
        }
        ErrorCode::DestinationIpProhibited => TransportError::Denied(
            "its address is refused (loopback, link-local, private network or cloud metadata)"
                .into(),
        ),
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout
        | ErrorCode::DnsTimeout => TransportError::Timeout(describe(&code)),
        ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_) => TransportError::Incompatible(describe(&code)),
        ErrorCode::HttpProtocolError => TransportError::Garbled(describe(&code)),
        ErrorCode::ConnectionRefused
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable => TransportError::Unsent(describe(&code)),
        other => TransportError::Unreachable(describe(&other)),
    }
}

fn describe(code: &ErrorCode) -> String {
    match code {
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTerminated => "connection closed by the server".into(),
        ErrorCode::ConnectionTimeout => "connect timed out".into(),
        ErrorCode::ConnectionReadTimeout | ErrorCode::HttpResponseTimeout => {
            "timed out waiting for the response".into()
        }
        ErrorCode::DnsError(e) => format!(
            "name resolution failed ({})",
            e.rcode.clone().unwrap_or_else(|| "no answer".into())
        ),
        ErrorCode::DestinationNotFound => "destination not found".into(),
        ErrorCode::DestinationUnavailable => "destination unavailable".into(),
        ErrorCode::TlsProtocolError => "TLS protocol error (is the server speaking TLS?)".into(),
        ErrorCode::TlsCertificateError => "TLS certificate not trusted".into(),
        ErrorCode::TlsAlertReceived(alert) => format!(
            "TLS alert from the server: {}",
            alert.alert_message.clone().unwrap_or_default()
        ),
        ErrorCode::HttpProtocolError => "HTTP protocol error (is it an HTTP server?)".into(),
        ErrorCode::InternalError(Some(m)) => m.clone(),
        other => format!("{other:?}"),
    }
}

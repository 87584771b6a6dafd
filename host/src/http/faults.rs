//! Fault injection, for tests only (the `faults` feature): [`Faulty`] wraps an instance's
//! sender and, where its [`FaultPlan`] says so, refuses the connection, resets it before or in
//! the middle of a response, answers with a ClickHouse error with a real body or a 200 carrying a
//! mid-stream exception, answers after the timeout, answers late, or acknowledges a request it
//! never sent. A [`FaultSchedule`] decides from a seed, so a failing run can be replayed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use std::sync::Arc;

use super::policy::AddressAllowance;
use super::sender::{Sender, Sent};
use super::{Exchange, Exchanging};

/// Decides which requests get a fault.
pub trait FaultPlan: Send + Sync + 'static {
    /// The fault for this request, if any.
    fn fault(&self, method: &http::Method, uri: &http::Uri) -> Option<Fault>;
}

/// A sender whose exchanges get the faults its plan decides.
pub struct Faulty {
    sender: Sender,
    plan: Arc<dyn FaultPlan>,
}

impl Faulty {
    pub fn new(sender: Sender, plan: Arc<dyn FaultPlan>) -> Self {
        Faulty { sender, plan }
    }
}

impl Exchange for Faulty {
    fn exchange(
        &self,
        request: http::Request<WasiBody>,
        options: RequestOptions,
        addresses: AddressAllowance,
    ) -> Exchanging {
        let Some(fault) = self.plan.fault(request.method(), request.uri()) else {
            return self.sender.exchange(request, options, addresses);
        };
        let sender = self.sender.clone();
        Box::pin(async move { apply(fault, sender, request, options, addresses).await })
    }
}

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The connection is refused; nothing is sent.
    Refused,
    /// The request reaches the server, the connection drops before the answer.
    ResetBeforeResponse,
    /// The answer starts, the connection drops in the middle of its body.
    ResetMidBody,
    /// ClickHouse answers with this error code and its HTTP status. Codes 209 and 319 (the
    /// server may have done the work) come after the real request; the others instead of it.
    Server(i32),
    /// A 200 answer whose body ends in ClickHouse's mid-stream exception block.
    MidStreamException,
    /// The request is done, the answer comes after the timeout.
    Slow,
    /// The request is done and answered; the answer is held back this long, then the connection
    /// drops without it: a server that died after the work (a test kills it meanwhile). Never
    /// drawn by a [`FaultSchedule`].
    AnswerLost(std::time::Duration),
    /// The answer comes this much later than the server sent it, over the connection it came
    /// on (a slow server, not a broken one). Never drawn by a [`FaultSchedule`].
    Late(std::time::Duration),
    /// The request never leaves, and the answer is an HTTP protocol error: how Node's WASI
    /// shim words a reset connection. Never drawn by a [`FaultSchedule`].
    Garbled,
    /// The request never leaves, and a 200 says `written_rows` were written (what the insert
    /// reports when it lands: a row through the history's view counts twice): a server that
    /// loses an insert it acknowledged, for tests that must be able to see a loss. Never drawn
    /// by a [`FaultSchedule`].
    Swallowed { written_rows: u64 },
}

const SERVER_FAULTS: [(i32, &str, u16); 5] = [
    (202, "TOO_MANY_SIMULTANEOUS_QUERIES", 500),
    (209, "SOCKET_TIMEOUT", 503),
    (242, "TABLE_IS_READ_ONLY", 500),
    (252, "TOO_MANY_PARTS", 500),
    (319, "UNKNOWN_STATUS_OF_INSERT", 500),
];

/// Seeded faults: each request is faulty with probability `per_mille / 1000`, of a kind drawn
/// from the same seed. The n-th request of a run always gets the same decision.
pub struct FaultSchedule {
    seed: u64,
    per_mille: u64,
    requests: AtomicU64,
    injected: Mutex<Vec<(u64, Fault)>>,
}

impl FaultSchedule {
    pub fn new(seed: u64, per_mille: u64) -> Self {
        FaultSchedule {
            seed,
            per_mille,
            requests: AtomicU64::new(0),
            injected: Mutex::new(Vec::new()),
        }
    }

    /// Which request got which fault so far.
    pub fn injected(&self) -> Vec<(u64, Fault)> {
        self.injected.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// The decision for request `index` (pure: the same seed and index give the same fault).
    pub fn decide(&self, index: u64) -> Option<Fault> {
        let roll = splitmix64(self.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        if roll % 1000 >= self.per_mille {
            return None;
        }
        Some(match (roll >> 20) % 10 {
            0 => Fault::Refused,
            1 | 2 => Fault::ResetBeforeResponse,
            3 => Fault::ResetMidBody,
            4..=6 => Fault::Server(SERVER_FAULTS[((roll >> 40) % 5) as usize].0),
            7 | 8 => Fault::MidStreamException,
            _ => Fault::Slow,
        })
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl FaultPlan for FaultSchedule {
    fn fault(&self, _method: &http::Method, _uri: &http::Uri) -> Option<Fault> {
        let index = self.requests.fetch_add(1, Ordering::SeqCst);
        let fault = self.decide(index)?;
        if let Ok(mut injected) = self.injected.lock() {
            injected.push((index, fault));
        }
        Some(fault)
    }
}

/// Performs `request` with `fault` applied.
async fn apply(
    fault: Fault,
    sender: Sender,
    request: http::Request<WasiBody>,
    options: RequestOptions,
    addresses: AddressAllowance,
) -> Result<Sent, HttpError> {
    match fault {
        Fault::Refused => Err(HttpError::ConnectionRefused),
        Fault::Garbled => Err(HttpError::HttpProtocolError),
        Fault::ResetBeforeResponse => {
            complete(sender.send(request, options, addresses).await?).await?;
            Err(HttpError::ConnectionTerminated)
        }
        Fault::Slow => {
            complete(sender.send(request, options, addresses).await?).await?;
            Err(HttpError::ConnectionReadTimeout)
        }
        Fault::AnswerLost(delay) => {
            complete(sender.send(request, options, addresses).await?).await?;
            tokio::time::sleep(delay).await;
            Err(HttpError::ConnectionTerminated)
        }
        Fault::Swallowed { written_rows } => {
            drop((sender, request, options, addresses));
            let response = http::Response::builder()
                .status(http::StatusCode::OK)
                .header(
                    "x-clickhouse-summary",
                    format!(
                        r#"{{"read_rows":"1","written_rows":"{written_rows}","written_bytes":"100"}}"#
                    ),
                )
                .body(full(Bytes::new()))
                .map_err(|e| HttpError::InternalError(Some(e.to_string())))?;
            Ok(answer(response))
        }
        Fault::Late(delay) => {
            let sent = sender.send(request, options, addresses).await?;
            tokio::time::sleep(delay).await;
            Ok(sent)
        }
        Fault::ResetMidBody => {
            let (parts, body) = complete(sender.send(request, options, addresses).await?).await?;
            let half = body.slice(..body.len() / 2);
            let frames: Vec<Result<Frame<Bytes>, HttpError>> =
                vec![Ok(Frame::data(half)), Err(HttpError::ConnectionTerminated)];
            let body = StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync();
            Ok(answer(http::Response::from_parts(parts, body)))
        }
        Fault::MidStreamException => {
            let (mut parts, body) =
                complete(sender.send(request, options, addresses).await?).await?;
            let tag = "injectedfaulttag";
            let text = "Code: 241. DB::Exception: Memory limit (total) exceeded (injected fault). (MEMORY_LIMIT_EXCEEDED) (version 26.9.2.1)";
            let mut bytes = body.to_vec();
            bytes.extend_from_slice(
                format!(
                    "__exception__\r\n{tag}\r\n{text}\n{} {tag}\r\n__exception__\r\n",
                    text.len()
                )
                .as_bytes(),
            );
            parts.status = http::StatusCode::OK;
            parts.headers.insert(
                "x-clickhouse-exception-tag",
                http::HeaderValue::from_static("injectedfaulttag"),
            );
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Ok(answer(http::Response::from_parts(
                parts,
                full(Bytes::from(bytes)),
            )))
        }
        Fault::Server(code) => {
            let (_, name, status) = SERVER_FAULTS
                .iter()
                .copied()
                .find(|(c, _, _)| *c == code)
                .unwrap_or((code, "UNKNOWN", 500));
            if code == 209 || code == 319 {
                complete(sender.send(request, options, addresses).await?).await?;
            }
            let body = format!(
                "Code: {code}. DB::Exception: Injected fault. ({name}) (version 26.9.2.1)\n"
            );
            let response = http::Response::builder()
                .status(status)
                .header("x-clickhouse-exception-code", code.to_string())
                .header("content-type", "text/plain; charset=UTF-8")
                .body(full(Bytes::from(body)))
                .map_err(|e| HttpError::InternalError(Some(e.to_string())))?;
            Ok(answer(response))
        }
    }
}

/// Reads the real answer to the end (the server has done its work by then).
async fn complete((response, io): Sent) -> Result<(http::response::Parts, Bytes), HttpError> {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let _ = Box::into_pin(io).await;
    Ok((parts, bytes))
}

fn full(bytes: Bytes) -> WasiBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn answer(response: http::Response<WasiBody>) -> Sent {
    (response, Box::new(async { Ok(()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let a = FaultSchedule::new(42, 200);
        let b = FaultSchedule::new(42, 200);
        let c = FaultSchedule::new(43, 200);
        let run = |s: &FaultSchedule| (0..500).map(|i| s.decide(i)).collect::<Vec<_>>();
        assert_eq!(run(&a), run(&b));
        assert_ne!(run(&a), run(&c));
        let faults = run(&a).into_iter().flatten().count();
        assert!(
            (60..=140).contains(&faults),
            "{faults} faults in 500 at 20 %"
        );
    }

    #[test]
    fn every_kind_is_drawn() {
        let s = FaultSchedule::new(7, 1000);
        let kinds: Vec<Fault> = (0..2000).filter_map(|i| s.decide(i)).collect();
        for expected in [
            Fault::Refused,
            Fault::ResetBeforeResponse,
            Fault::ResetMidBody,
            Fault::MidStreamException,
            Fault::Slow,
        ] {
            assert!(kinds.contains(&expected), "{expected:?}");
        }
        for (code, _, _) in SERVER_FAULTS {
            assert!(kinds.contains(&Fault::Server(code)), "{code}");
        }
    }
}

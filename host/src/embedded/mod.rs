//! The host inside the caller's process: the protocol `state-backend serve --stdio` speaks
//! ([`crate::serve`]), over a channel instead of a pipe, behind a small C ABI. Meltano's
//! bridge loads it with ctypes, so a call costs no pipe round trip and no wake-up of another
//! process: that round trip was most of what a call through the bridge added to ClickHouse's
//! own time (docs/benchmarks.md).
//!
//! Each open instance runs on a thread of its own, in a single-threaded async runtime, as
//! `serve` runs in its process: the instance gives back kept locks when idle on its own timer,
//! between the caller's calls. A call hands a request line to that thread and waits for the
//! answer line. Closing ends the requests: the instance gives back what it holds and closes.
//!
//! The C ABI (every function catches panics; no Rust panic crosses it):
//! - `sb_open(config, len, &out, &out_len) -> handle`: starts an instance from a JSON
//!   configuration ([`OpenConfig`]); `out` is the session's first line, ready or why not (then
//!   the handle is null).
//! - `sb_call(handle, line, len, timeout_ms, &out, &out_len) -> status`: one request line,
//!   its answer line in `out`; status 0, or [`GONE`] / [`HUNG`] with a message in `out`.
//! - `sb_set_log_sink(sink)`: where the host's log lines go (a function called with each).
//! - `sb_free(out, out_len)`: frees what the functions above gave out.
//! - `sb_close(handle, timeout_ms)`: ends the instance (held locks given back, waiting at most
//!   the timeout for that) and frees the handle.
//!
//! Secrets: the configuration carries the URI and the password; neither is logged, and
//! [`OpenConfig`] has no `Debug`.

mod logs;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::http::tls::TlsOptions;
use crate::{Error, serve};
use serde::Deserialize;

/// `sb_call`'s status: the instance's thread has ended (a panic, or it was closed).
pub const GONE: i32 = 1;
/// `sb_call`'s status: no answer within the timeout; the instance is no longer usable.
pub const HUNG: i32 = 2;

/// What `sb_open` takes: the host's options and the component's settings, as the bridge
/// passes them to `state-backend serve` as flags and variables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenConfig {
    pub uri: String,
    /// The component's settings, `password` among them.
    #[serde(default)]
    pub settings: Vec<(String, String)>,
    #[serde(default)]
    pub allow_loopback: bool,
    #[serde(default)]
    pub refuse_private: bool,
    #[serde(default)]
    pub ignore_proxy_env: bool,
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// The log level, as `state-backend --log` takes it.
    #[serde(default = "warn")]
    pub log: String,
    /// The component; else where `state-backend` would look ($STATE_BACKEND_COMPONENT).
    #[serde(default)]
    pub component: Option<PathBuf>,
}

fn warn() -> String {
    "warn".into()
}

/// One instance, served on its own thread.
pub struct Host {
    inner: Mutex<Inner>,
}

struct Inner {
    /// `None` once closed, or once the thread is known to be gone.
    requests: Option<tokio::sync::mpsc::Sender<String>>,
    answers: mpsc::Receiver<String>,
    thread: Option<JoinHandle<()>>,
}

impl Host {
    /// Starts an instance; the session's first line, ready or why not (then no host).
    pub fn open(config: OpenConfig) -> (Option<Host>, String) {
        logs::init(&config.log);
        let (request_sender, request_receiver) = tokio::sync::mpsc::channel::<String>(1);
        let (answer_sender, answers) = mpsc::channel::<String>();
        let thread = std::thread::Builder::new()
            .name("state-backend".into())
            .spawn(move || {
                let served = catch_unwind(AssertUnwindSafe(|| {
                    run(config, request_receiver, answer_sender)
                }));
                if served.is_err() {
                    tracing::error!("the state-backend host's thread panicked");
                }
            });
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                return (
                    None,
                    failure(&format!("cannot start the host's thread: {e}")),
                );
            }
        };
        match answers.recv() {
            Ok(first) if first.starts_with("{\"ready\"") => {
                let inner = Inner {
                    requests: Some(request_sender),
                    answers,
                    thread: Some(thread),
                };
                let host = Host {
                    inner: Mutex::new(inner),
                };
                (Some(host), first)
            }
            Ok(first) => {
                let _ = thread.join();
                (None, first)
            }
            Err(_) => {
                let _ = thread.join();
                (None, failure("the host's thread ended before it was ready"))
            }
        }
    }

    /// One request line and its answer line, or the status and why there is none.
    pub fn call(&self, line: String, timeout: Duration) -> Result<String, (i32, String)> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(requests) = inner.requests.as_ref() else {
            return Err((GONE, "the host has ended".into()));
        };
        if requests.blocking_send(line).is_err() {
            inner.requests = None;
            return Err((GONE, "the host's thread has ended".into()));
        }
        match inner.answers.recv_timeout(timeout) {
            Ok(answer) => Ok(answer),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                inner.requests = None;
                Err((GONE, "the host's thread ended before it answered".into()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The thread cannot be stopped; it is left to finish and is not used again.
                inner.requests = None;
                inner.thread = None;
                Err((
                    HUNG,
                    format!("no answer within {} s", timeout.as_secs_f64()),
                ))
            }
        }
    }

    /// Ends the requests and waits, at most `timeout`, for the instance to give back what it
    /// holds and close; a thread that takes longer is left to finish on its own.
    pub fn close(self, timeout: Duration) {
        let mut inner = self.inner.into_inner().unwrap_or_else(|e| e.into_inner());
        inner.requests = None;
        let Some(thread) = inner.thread.take() else {
            return;
        };
        // The thread's end drops its end of the answers: that is the signal, with a bound.
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match inner.answers.recv_timeout(left) {
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = thread.join();
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        "the host did not close within {} s; left to finish",
                        timeout.as_secs_f64()
                    );
                    return;
                }
            }
        }
    }
}

/// The thread's work: start the instance, say whether it is ready, serve until the requests end.
fn run(
    config: OpenConfig,
    requests: tokio::sync::mpsc::Receiver<String>,
    answers: mpsc::Sender<String>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = answers.send(failure(&format!("cannot start the async runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let tls = TlsOptions {
            ca_bundle: config.ca_bundle,
            client_cert: config.client_cert,
            client_key: config.client_key,
        };
        let options = match serve::single_user_options(
            tls,
            config.allow_loopback,
            config.refuse_private,
            config.ignore_proxy_env,
        ) {
            Ok(options) => options,
            Err(e) => {
                let _ = answers.send(serve::failure_line(&e, None));
                return;
            }
        };
        let component = config
            .component
            .unwrap_or_else(crate::default_component_path);
        let backend = match serve::start(&config.uri, config.settings, &component, options).await {
            Ok(backend) => backend,
            Err((error, setting)) => {
                let _ = answers.send(serve::failure_line(&error, setting.as_deref()));
                return;
            }
        };
        if answers.send(serve::ready_line(&backend)).is_err() {
            let _ = backend.close().await;
            return;
        }
        // Nothing stops it but the end of the requests: the sender is dropped at once.
        let (_, stop) = tokio::sync::watch::channel(false);
        let answer = move |line: String| answers.send(line).is_ok();
        if let Err(e) = serve::serve(backend, requests, answer, stop).await {
            tracing::warn!("closing the instance: {e}");
        }
    });
}

fn failure(message: &str) -> String {
    serve::failure_line(&Error::Component(message.into()), None)
}

/// Gives `text` out to the caller, who frees it with `sb_free`.
///
/// # Safety
/// `out` and `out_len` are valid for writes.
unsafe fn give(text: String, out: *mut *mut u8, out_len: *mut usize) {
    let bytes = text.into_bytes().into_boxed_slice();
    let len = bytes.len();
    let ptr = Box::into_raw(bytes).cast::<u8>();
    // SAFETY: the caller's promise.
    unsafe {
        *out = ptr;
        *out_len = len;
    }
}

/// # Safety
/// `ptr` is valid for `len` bytes (or `len` is 0).
unsafe fn text_of(ptr: *const u8, len: usize) -> Result<String, String> {
    if len == 0 {
        return Ok(String::new());
    }
    if ptr.is_null() {
        return Err("a null pointer with a length".into());
    }
    // SAFETY: the caller's promise.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8".to_string())
}

/// Starts an instance from the JSON configuration in `config`. Returns the handle, or null
/// when it did not start; either way `out` holds the session's first line.
///
/// # Safety
/// `config` is valid for `len` bytes; `out` and `out_len` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_open(
    config: *const u8,
    len: usize,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> *mut Host {
    let opened = catch_unwind(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { text_of(config, len) }.map_err(|e| format!("configuration: {e}"))?;
        // Where, not serde's message: that can quote a value, and the password is one.
        let config: OpenConfig = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the configuration is not what the host takes (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        Ok::<_, String>(Host::open(config))
    });
    let (host, first) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(message)) => (None, failure(&message)),
        Err(_) => (None, failure("the host panicked while starting")),
    };
    // SAFETY: the caller's promise.
    unsafe { give(first, out, out_len) };
    host.map_or(std::ptr::null_mut(), |host| Box::into_raw(Box::new(host)))
}

/// Sends one request line and waits at most `timeout_ms` for its answer, in `out`. Returns 0,
/// or [`GONE`] or [`HUNG`] with why in `out`.
///
/// # Safety
/// `host` came from `sb_open` and is not closed; `line` is valid for `len` bytes; `out` and
/// `out_len` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_call(
    host: *const Host,
    line: *const u8,
    len: usize,
    timeout_ms: u64,
    out: *mut *mut u8,
    out_len: *mut usize,
) -> i32 {
    let answered = catch_unwind(|| {
        // SAFETY: the caller's promise.
        let host = unsafe { host.as_ref() }.ok_or((GONE, "no host".to_string()))?;
        // SAFETY: the caller's promise.
        let line = unsafe { text_of(line, len) }.map_err(|e| (GONE, format!("request: {e}")))?;
        host.call(line, Duration::from_millis(timeout_ms))
    });
    let (status, text) = match answered {
        Ok(Ok(answer)) => (0, answer),
        Ok(Err((status, message))) => (status, message),
        Err(_) => (GONE, "the host panicked".to_string()),
    };
    // SAFETY: the caller's promise.
    unsafe { give(text, out, out_len) };
    status
}

/// Sends each line of the host's log to `sink` (null: to stderr), on whichever thread logged
/// it. Set it before the first `sb_open`, and to null before `sink` goes away.
#[unsafe(no_mangle)]
pub extern "C" fn sb_set_log_sink(sink: Option<logs::Sink>) {
    let _ = catch_unwind(|| logs::set_sink(sink));
}

/// Frees what `sb_open` or `sb_call` gave out.
///
/// # Safety
/// `ptr` and `len` are exactly as one of them gave out, and not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_free(ptr: *mut u8, len: usize) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: the caller's promise: a boxed slice of `len` bytes from `give`.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
}

/// Ends the instance: held locks are given back, then it closes, waiting at most `timeout_ms`
/// for that; frees the handle.
///
/// # Safety
/// `host` came from `sb_open` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sb_close(host: *mut Host, timeout_ms: u64) {
    if host.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let host = unsafe { Box::from_raw(host) };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        host.close(Duration::from_millis(timeout_ms))
    }));
}

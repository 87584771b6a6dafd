//! The host inside the caller's process: the protocol `state-backend serve --stdio` speaks
//! ([`crate::serve`]), a line at a time through a function instead of a pipe, behind a small C
//! ABI. Meltano's bridge loads it with ctypes, so a call costs no pipe round trip and no
//! wake-up of another process: that round trip was most of what a call through the bridge
//! added to ClickHouse's own time (docs/benchmarks.md).
//!
//! A call runs on the caller's thread, in the instance's single-threaded async runtime: no
//! other thread is woken, nor waited for, on its way (a hand-off to a thread and back was a
//! tenth of a call's CPU time at the floor). Between calls, a thread of the instance's own
//! runs the store's idle work, as `serve` runs it between requests: kept locks are given back
//! on its timer, with no thread of the caller's. One lock orders the two, and whichever holds
//! it drives the runtime. Closing lets that thread give back what the instance holds and close.
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
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::Clock;
use crate::http::tls::TlsOptions;
use crate::{Backend, Error, serve};
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

/// One instance. A call runs on the caller's thread; a thread of the instance's own runs only
/// its idle work (giving back kept locks when due) between calls.
pub struct Host {
    shared: Arc<Shared>,
    /// Disconnected when the idle thread has ended (after closing the instance).
    ended: mpsc::Receiver<()>,
    idler: Option<JoinHandle<()>>,
}

struct Shared {
    /// Single-threaded: driven by whoever holds `state` (a call, or the idle work).
    runtime: tokio::runtime::Runtime,
    state: Mutex<State>,
    /// Wakes the idle thread: its work falls due sooner than it sleeps, or the host is closing.
    wake: Condvar,
}

struct State {
    /// `None` once closed, or after a call that hung or panicked (its locks lapse).
    instance: Option<Instance>,
    /// When the store wants its idle work next (the instance's clock, unix ms), as the last
    /// call or idle work said.
    due: Option<u64>,
    closing: bool,
}

struct Instance {
    backend: Backend,
    session: serve::Session,
    clock: Arc<dyn Clock>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Host {
    /// Starts an instance, on the caller's thread; the session's first line, ready or why not
    /// (then no host).
    pub fn open(config: OpenConfig) -> (Option<Host>, String) {
        logs::init(&config.log);
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                return (
                    None,
                    failure(&format!("cannot start the async runtime: {e}")),
                );
            }
        };
        let backend = match runtime.block_on(start(config)) {
            Ok(backend) => backend,
            Err(first) => return (None, first),
        };
        let first = serve::ready_line(&backend);
        let clock = backend.clock();
        let shared = Arc::new(Shared {
            runtime,
            state: Mutex::new(State {
                instance: Some(Instance {
                    backend,
                    session: serve::Session::default(),
                    clock,
                }),
                due: None,
                closing: false,
            }),
            wake: Condvar::new(),
        });
        let (ended_sender, ended) = mpsc::channel::<()>();
        let idler = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("state-backend-idle".into())
                .spawn(move || {
                    let _ended = ended_sender;
                    idle_until_closed(&shared);
                })
        };
        match idler {
            Ok(idler) => {
                let host = Host {
                    shared,
                    ended,
                    idler: Some(idler),
                };
                (Some(host), first)
            }
            Err(e) => {
                if let Some(instance) = shared.state().instance.take() {
                    let _ = shared.runtime.block_on(instance.finish());
                }
                (
                    None,
                    failure(&format!("cannot start the host's thread: {e}")),
                )
            }
        }
    }

    /// One request line and its answer line, or the status and why there is none.
    pub fn call(&self, line: String, timeout: Duration) -> Result<String, (i32, String)> {
        let mut state = self.shared.state();
        if state.closing {
            return Err((GONE, "the host has ended".into()));
        }
        let Some(instance) = state.instance.as_mut() else {
            return Err((GONE, "the host has ended".into()));
        };
        let answered = catch_unwind(AssertUnwindSafe(|| {
            let answer = async {
                // Nothing drove the runtime since the last call or idle work: a yield lets it
                // take in what its sockets said meanwhile (tokio polls its driver before it
                // resumes a yielded task), so that a pooled connection the server closed is
                // seen closed before a request is written to it.
                tokio::task::yield_now().await;
                let answer =
                    serve::answer_line(&mut instance.backend, &mut instance.session, &line).await;
                // As `serve` does after each request, here rather than on the idle thread: no
                // wake-up of it per call, only when the work falls due sooner than it sleeps.
                let due = serve::idle(&mut instance.backend, &*instance.clock).await;
                (answer, due)
            };
            // The timer made inside the runtime, whose clock it needs.
            self.shared
                .runtime
                .block_on(async { tokio::time::timeout(timeout, answer).await })
        }));
        match answered {
            Ok(Ok((answer, due))) => {
                let sooner = due.is_some_and(|at| state.due.is_none_or(|was| at < was));
                state.due = due;
                if sooner {
                    self.shared.wake.notify_one();
                }
                Ok(answer)
            }
            Ok(Err(_)) => {
                // Stopped where it waited; the instance is not used again and its locks lapse.
                state.instance = None;
                Err((
                    HUNG,
                    format!("no answer within {} s", timeout.as_secs_f64()),
                ))
            }
            Err(_) => {
                state.instance = None;
                Err((GONE, "the host panicked during the call".into()))
            }
        }
    }

    /// Ends the requests and waits, at most `timeout`, for the instance to give back what it
    /// holds and close; an idle thread that takes longer is left to finish on its own.
    pub fn close(mut self, timeout: Duration) {
        self.signal_close();
        let Some(idler) = self.idler.take() else {
            return;
        };
        // The idle thread's end drops its end of `ended`: that is the signal, with a bound.
        match self.ended.recv_timeout(timeout) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = idler.join();
            }
            // Not waited for, as asked (after a call that hung, nothing is left to give back).
            Err(mpsc::RecvTimeoutError::Timeout) if timeout.is_zero() => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "the host did not close within {} s; left to finish",
                    timeout.as_secs_f64()
                );
            }
        }
    }

    fn signal_close(&self) {
        self.shared.state().closing = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for Host {
    /// A host dropped unclosed still closes, on its idle thread, unwaited.
    fn drop(&mut self) {
        self.signal_close();
    }
}

impl Instance {
    /// Gives back the locks the session holds and what the store kept, and closes.
    async fn finish(self) -> Result<(), Error> {
        serve::finish(self.backend, self.session).await
    }
}

/// Starts the instance (see [`serve::start`]); or the first line saying why not.
async fn start(config: OpenConfig) -> Result<Backend, String> {
    let tls = TlsOptions {
        ca_bundle: config.ca_bundle,
        client_cert: config.client_cert,
        client_key: config.client_key,
    };
    let options = serve::single_user_options(
        tls,
        config.allow_loopback,
        config.refuse_private,
        config.ignore_proxy_env,
    )
    .map_err(|e| serve::failure_line(&e, None))?;
    let component = config
        .component
        .unwrap_or_else(crate::default_component_path);
    serve::start(&config.uri, config.settings, &component, options)
        .await
        .map_err(|(error, setting)| serve::failure_line(&error, setting.as_deref()))
}

/// The idle thread: whenever the store said its idle work would be due, runs it (as `serve`
/// does between requests); once closing, closes the instance. A panic here ends the instance
/// as a call's would.
fn idle_until_closed(shared: &Shared) {
    let idled = catch_unwind(AssertUnwindSafe(|| {
        let mut state = shared.state();
        while !state.closing {
            let st = &mut *state;
            let Some(instance) = st.instance.as_mut() else {
                state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let now = instance.clock.now_ms();
            if st.due.is_some_and(|at| at <= now) {
                st.due = shared
                    .runtime
                    .block_on(serve::idle(&mut instance.backend, &*instance.clock));
                continue;
            }
            let due = st.due;
            state = match due {
                Some(at) => {
                    let wait = Duration::from_millis(at.saturating_sub(now));
                    shared
                        .wake
                        .wait_timeout(state, wait)
                        .map_or_else(|e| e.into_inner().0, |(state, _)| state)
                }
                None => shared.wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
        let instance = state.instance.take();
        drop(state);
        if let Some(instance) = instance
            && let Err(e) = shared.runtime.block_on(instance.finish())
        {
            tracing::warn!("closing the instance: {e}");
        }
    }));
    if idled.is_err() {
        tracing::error!("the state-backend host's idle thread panicked");
        shared.state().instance = None;
    }
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
    // A panic inside a call is caught where the instance can be given up (`Host::call`).
    let answered = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's promise.
        let host = unsafe { host.as_ref() }.ok_or((GONE, "no host".to_string()))?;
        // SAFETY: the caller's promise.
        let line = unsafe { text_of(line, len) }.map_err(|e| (GONE, format!("request: {e}")))?;
        host.call(line, Duration::from_millis(timeout_ms))
    }));
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

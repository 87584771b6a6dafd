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

mod abi;
mod logs;

pub use abi::{sb_call, sb_close, sb_free, sb_open, sb_set_log_sink};

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    ended: Mutex<mpsc::Receiver<()>>,
    idler: Option<JoinHandle<()>>,
}

struct Shared {
    /// Single-threaded: driven by whoever holds `state` (a call, or the idle work).
    runtime: tokio::runtime::Runtime,
    state: Mutex<State>,
    /// Wakes the idle thread: its work falls due sooner than it sleeps, or the host is closing.
    wake: Condvar,
    /// Set without the lock, so that closing never waits for idle work in progress; the idle
    /// thread reads it under the lock, and sleeps at most `CLOSE_CHECK` at a time.
    closing: AtomicBool,
}

/// The longest the idle thread sleeps before it looks whether the host is closing (a close
/// that came between its look and its sleep is seen then).
const CLOSE_CHECK: Duration = Duration::from_secs(1);

struct State {
    /// `None` once closed, or after a call that hung or panicked (its locks lapse).
    instance: Option<Instance>,
    /// When the store wants its idle work next (the instance's clock, unix ms), as the last
    /// call or idle work said.
    due: Option<u64>,
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

    fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Runs `work` on the runtime, on this thread. Nothing drove the runtime since the last
    /// call or idle work: a yield first lets it take in what its sockets said meanwhile (tokio
    /// polls its driver before it resumes a yielded task), so that a pooled connection the
    /// server closed is seen closed before a request is written to it.
    fn drive<F: std::future::Future>(&self, work: F) -> F::Output {
        self.runtime.block_on(async {
            tokio::task::yield_now().await;
            work.await
        })
    }

    /// Gives up the instance (its locks lapse), dropped where the runtime's handle is current.
    fn give_up(&self, state: &mut State) {
        let _entered = self.runtime.enter();
        state.instance = None;
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
            }),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
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
                    ended: Mutex::new(ended),
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
        if self.shared.closing() {
            return Err((GONE, "the host has ended".into()));
        }
        let Some(instance) = state.instance.as_mut() else {
            return Err((GONE, "the host has ended".into()));
        };
        let answered = catch_unwind(AssertUnwindSafe(|| {
            let answer = async {
                let answer =
                    serve::answer_line(&mut instance.backend, &mut instance.session, &line).await;
                // As `serve` does after each request, here rather than on the idle thread: no
                // wake-up of it per call, only when the work falls due sooner than it sleeps.
                let due = if instance.backend.trapped() {
                    None
                } else {
                    serve::idle(&mut instance.backend, &*instance.clock).await
                };
                (answer, due)
            };
            // The timer made inside the runtime, whose clock it needs.
            self.shared
                .drive(async { tokio::time::timeout(timeout, answer).await })
        }));
        let trapped = state.instance.as_ref().is_some_and(|i| i.backend.trapped());
        match answered {
            Ok(Ok((answer, _))) if trapped => {
                // Stopped (its deadline, its CPU budget, a panic): the instance can answer
                // nothing more, so it is given up now and the caller opens another.
                self.shared.give_up(&mut state);
                Err((
                    GONE,
                    format!("the instance was stopped and cannot be used again: {answer}"),
                ))
            }
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
                self.shared.give_up(&mut state);
                Err((
                    HUNG,
                    format!("no answer within {} s", timeout.as_secs_f64()),
                ))
            }
            Err(_) => {
                self.shared.give_up(&mut state);
                Err((GONE, "the host panicked during the call".into()))
            }
        }
    }

    /// Ends the requests and waits, at most `timeout`, for the instance to give back what it
    /// holds and close; an idle thread that takes longer is left to finish on its own.
    pub fn close(mut self, timeout: Duration) {
        self.signal_close();
        let Some(idler) = self.idler.take() else {
            crate::telemetry::flush_process(timeout);
            return;
        };
        // The idle thread's end drops its end of `ended`: that is the signal, with a bound.
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        match ended.recv_timeout(timeout) {
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
        crate::telemetry::flush_process(timeout);
    }

    /// Never waits for the lock: idle work in progress sees the flag when it ends.
    fn signal_close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
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
        while !shared.closing() {
            let st = &mut *state;
            let wait = match st.instance.as_mut() {
                None => CLOSE_CHECK,
                Some(instance) => {
                    let now = instance.clock.now_ms();
                    if st.due.is_some_and(|at| at <= now) {
                        st.due = shared.drive(serve::idle(&mut instance.backend, &*instance.clock));
                        continue;
                    }
                    st.due.map_or(CLOSE_CHECK, |at| {
                        Duration::from_millis(at.saturating_sub(now)).min(CLOSE_CHECK)
                    })
                }
            };
            state = shared
                .wake
                .wait_timeout(state, wait)
                .map_or_else(|e| e.into_inner().0, |(state, _)| state);
        }
        let instance = state.instance.take();
        drop(state);
        if let Some(instance) = instance
            && let Err(e) = shared.drive(instance.finish())
        {
            tracing::warn!("closing the instance: {e}");
        }
    }));
    if idled.is_err() {
        tracing::error!("the state-backend host's idle thread panicked");
        shared.give_up(&mut shared.state());
    }
}

fn failure(message: &str) -> String {
    serve::failure_line(&Error::Component(message.into()), None)
}

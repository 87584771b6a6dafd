//! What each guest instance's `Store` holds, and the imports it answers: clock, log, WASI.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::meltano::state_backend::{clock, log, types};
use crate::clock::{Clock, Registration};
use crate::http::hook::OutgoingHook;

pub struct HostState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    egress: OutgoingHook,
    clock: Arc<dyn Clock>,
    /// Membership in the clock, for as long as this instance lives.
    _registration: Registration,
    /// Names this instance in the log.
    label: String,
    pub(crate) limits: Limits,
}

/// Per-instance limits and what the instance ran into, so a trap can say why it happened.
pub(crate) struct Limits {
    memory_bytes: usize,
    /// The largest linear memory the instance grew to (memory never shrinks).
    pub(crate) peak_memory_bytes: usize,
    /// How long one call may run, waits included.
    pub(crate) call_deadline: Duration,
    pub(crate) call_started: Option<Instant>,
    pub(crate) deadline_hit: bool,
    pub(crate) memory_denied: bool,
    /// The message of the guest's last panic (its panic hook logs `panic: ...`).
    pub(crate) last_panic: Option<String>,
    /// What the guest wrote to stderr (bounded; further writes fail).
    pub(crate) stderr: MemoryOutputPipe,
}

impl Limits {
    pub(crate) fn new(memory_bytes: usize, call_deadline: Duration) -> Self {
        Limits {
            memory_bytes,
            peak_memory_bytes: 0,
            call_deadline,
            call_started: None,
            deadline_hit: false,
            memory_denied: false,
            last_panic: None,
            stderr: MemoryOutputPipe::new(64 * 1024),
        }
    }

    /// The panic message a guest without a panic hook of its own wrote to stderr.
    pub(crate) fn panic_from_stderr(&self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.stderr.contents()).into_owned();
        let at = text.rfind("panicked at ")?;
        let rest = &text[at + "panicked at ".len()..];
        // "src/lib.rs:10:5:\n<message>\nnote: ..." -> "<message> (src/lib.rs:10:5)"
        let (place, message) = rest.split_once('\n').unwrap_or((rest, ""));
        let message: Vec<&str> = message
            .lines()
            .take_while(|l| !l.starts_with("note:"))
            .collect();
        Some(format!(
            "{} (at {})",
            message.join(" ").trim(),
            place.trim_end_matches(':')
        ))
    }
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.memory_bytes;
        if allowed {
            self.peak_memory_bytes = self.peak_memory_bytes.max(desired);
        } else {
            self.memory_denied = true;
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl HostState {
    pub fn new(egress: OutgoingHook, clock: Arc<dyn Clock>, label: String, limits: Limits) -> Self {
        HostState {
            _registration: clock.register(),
            // No env, no args, no preopens, no sockets, stdout discarded: wasi:http is the only
            // way out, and the egress policy decides where it leads. Stderr goes to a small
            // buffer, where Rust's default panic handler writes a panic's message.
            wasi: WasiCtx::builder().stderr(limits.stderr.clone()).build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            egress,
            clock,
            limits,
            label,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.egress,
        }
    }
}

impl types::Host for HostState {}

impl clock::Host for HostState {
    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(self.clock.now_ms())
    }

    async fn sleep_ms(&mut self, ms: u64) -> wasmtime::Result<()> {
        self.clock.sleep(ms).await;
        Ok(())
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        if level == log::Level::Error
            && let Some(panic) = message.strip_prefix("panic: ")
        {
            self.limits.last_panic = Some(panic.to_string());
        }
        let instance = self.label.as_str();
        match level {
            log::Level::Debug => tracing::debug!(target: "guest", instance, "{message}"),
            log::Level::Info => tracing::info!(target: "guest", instance, "{message}"),
            log::Level::Warn => tracing::warn!(target: "guest", instance, "{message}"),
            log::Level::Error => tracing::error!(target: "guest", instance, "{message}"),
        }
        Ok(())
    }
}

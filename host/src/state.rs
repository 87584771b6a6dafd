//! What each guest instance's `Store` holds, and the imports it answers: clock, log, WASI.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::meltano::state_backend::{clock, log, types};
use crate::clock::{Clock, Registration};
use crate::http::hook::OutgoingHook;
use crate::limits::Limits;
use crate::telemetry::recorder::Recorder;

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
    /// Its calls' spans and metrics, when the host exports them.
    pub(crate) recorder: Option<Arc<Recorder>>,
}

impl HostState {
    /// The clock this instance runs on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// Whether the egress policy refused an address since the last time this was asked.
    pub(crate) fn took_refusal(&self) -> bool {
        self.egress.took_refusal()
    }

    /// The host's account of the last request's failure, if it has one to add.
    pub(crate) fn took_detail(&self) -> Option<String> {
        self.egress.took_detail()
    }

    pub fn new(
        egress: OutgoingHook,
        clock: Arc<dyn Clock>,
        label: String,
        limits: Limits,
        recorder: Option<Arc<Recorder>>,
    ) -> Self {
        HostState {
            recorder,
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
        let wait = self
            .recorder
            .as_ref()
            .and_then(|r| r.pause(ms, self.clock.now_ms()));
        self.clock.sleep(ms).await;
        if let Some(wait) = wait {
            wait.end(self.clock.now_ms());
        }
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
        if let Some(recorder) = &self.recorder {
            recorder.log(&message);
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

//! What one instance may use: linear memory (a `ResourceLimiter`), and per call a CPU budget
//! and a deadline (both checked on epoch ticks); and what it ran into, so that a trap can say
//! why it happened.
//!
//! **CPU budget.** The time a call spends running the guest's code: a call hook starts the clock
//! when the host enters wasm (or a host function returns to it) and stops it when wasm calls the
//! host (or returns), so the time a guest waits in a host call (the lock's sleep, an HTTP
//! request) is not charged; neither is the time it stands yielded on an epoch tick while other
//! tenants' tasks run (measured by the yield itself). A guest that spins is stopped once over
//! budget, with its neighbours charged nothing. **Deadline.** Wall time per call, waits included.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wasmtime::{CallHook, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

/// Per-instance limits and what the instance ran into, so a trap can say why it happened.
pub(crate) struct Limits {
    memory_bytes: usize,
    /// The largest linear memory the instance grew to (memory never shrinks).
    pub(crate) peak_memory_bytes: usize,
    /// How long one call may run, waits included.
    pub(crate) call_deadline: Duration,
    pub(crate) call_started: Option<Instant>,
    pub(crate) deadline_hit: bool,
    /// How long one call may run the guest's code.
    pub(crate) cpu_budget: Duration,
    pub(crate) cpu: CpuClock,
    pub(crate) cpu_hit: bool,
    pub(crate) memory_denied: bool,
    /// The message of the guest's last panic (its panic hook logs `panic: ...`).
    pub(crate) last_panic: Option<String>,
    /// What the guest wrote to stderr (bounded; further writes fail).
    pub(crate) stderr: MemoryOutputPipe,
}

impl Limits {
    pub(crate) fn new(memory_bytes: usize, call_deadline: Duration, cpu_budget: Duration) -> Self {
        Limits {
            memory_bytes,
            peak_memory_bytes: 0,
            call_deadline,
            call_started: None,
            deadline_hit: false,
            cpu_budget,
            cpu: CpuClock::default(),
            cpu_hit: false,
            memory_denied: false,
            last_panic: None,
            stderr: MemoryOutputPipe::new(64 * 1024),
        }
    }

    /// A call begins: its deadline and its CPU clock start.
    pub(crate) fn begin_call(&mut self) {
        self.call_started = Some(Instant::now());
        self.cpu = CpuClock::default();
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

/// The guest's running time in one call: closed stretches inside wasm, the open one, less the
/// time spent yielded inside them.
#[derive(Debug, Default)]
pub(crate) struct CpuClock {
    closed: Duration,
    running_since: Option<Instant>,
    /// Nanoseconds spent yielded on epoch ticks (written by the yield's own future).
    yielded_ns: Arc<AtomicU64>,
}

impl CpuClock {
    fn enter(&mut self, now: Instant) {
        self.running_since = Some(now);
    }

    fn leave(&mut self, now: Instant) {
        if let Some(since) = self.running_since.take() {
            self.closed += now.saturating_duration_since(since);
        }
    }

    /// The running time so far, as of `now`.
    pub(crate) fn used(&self, now: Instant) -> Duration {
        let open = self
            .running_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        let yielded = Duration::from_nanos(self.yielded_ns.load(Ordering::Relaxed));
        (self.closed + open).saturating_sub(yielded)
    }
}

/// Puts `store` under the limits `limits_of` finds in its data: the memory limiter, the CPU
/// clock (a call hook), and the CPU budget and deadline checked on every epoch tick (see
/// `engine`), at which a busy guest also yields so that other tenants' tasks run.
pub(crate) fn apply<T: 'static>(store: &mut Store<T>, limits_of: fn(&mut T) -> &mut Limits) {
    store.limiter(move |data| limits_of(data));
    store.call_hook(move |mut context, hook| {
        let cpu = &mut limits_of(context.data_mut()).cpu;
        match hook {
            CallHook::CallingWasm | CallHook::ReturningFromHost => cpu.enter(Instant::now()),
            CallHook::CallingHost | CallHook::ReturningFromWasm => cpu.leave(Instant::now()),
        }
        Ok(())
    });
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut context| {
        let limits = limits_of(context.data_mut());
        let now = Instant::now();
        if limits.cpu.used(now) > limits.cpu_budget {
            limits.cpu_hit = true;
            return Err(wasmtime::Error::msg("the call ran past its CPU budget"));
        }
        let overdue = limits
            .call_started
            .is_some_and(|started| now.saturating_duration_since(started) > limits.call_deadline);
        if overdue {
            limits.deadline_hit = true;
            return Err(wasmtime::Error::msg("the call ran past its deadline"));
        }
        // Within both: let other tenants' tasks run, then check again. The time standing aside
        // is not the guest's.
        let yielded = Arc::clone(&limits.cpu.yielded_ns);
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                let started = Instant::now();
                tokio::task::yield_now().await;
                let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                yielded.fetch_add(ns, Ordering::Relaxed);
            }),
        ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_clock_counts_only_time_inside_wasm_and_not_yielded() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut cpu = CpuClock::default();
        cpu.enter(at(0));
        cpu.leave(at(30)); // 30 ms of guest code, then a host call (a sleep, a request)
        assert_eq!(cpu.used(at(1_000)), Duration::from_millis(30));
        cpu.enter(at(1_000)); // back in wasm after the host call
        assert_eq!(cpu.used(at(1_050)), Duration::from_millis(80));
        cpu.yielded_ns.fetch_add(20_000_000, Ordering::Relaxed); // 20 ms yielded on a tick
        assert_eq!(cpu.used(at(1_050)), Duration::from_millis(60));
        cpu.leave(at(1_100));
        assert_eq!(cpu.used(at(5_000)), Duration::from_millis(110));
    }
}

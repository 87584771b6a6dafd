//! What one instance may use: linear memory (a `ResourceLimiter`) and time per call (an epoch
//! deadline); and what it ran into, so that a trap can say why it happened.

use std::time::{Duration, Instant};

use wasmtime::{Store, UpdateDeadline};
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

/// Puts `store` under the limits `limits_of` finds in its data: the memory limiter, and a
/// deadline checked on every epoch tick (see `engine`), at which a busy guest also yields so
/// that other tenants' tasks run.
pub(crate) fn apply<T: 'static>(store: &mut Store<T>, limits_of: fn(&mut T) -> &mut Limits) {
    store.limiter(move |data| limits_of(data));
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut context| {
        let limits = limits_of(context.data_mut());
        let overdue = limits
            .call_started
            .is_some_and(|started| started.elapsed() > limits.call_deadline);
        if overdue {
            limits.deadline_hit = true;
            return Err(wasmtime::Error::msg("the call ran past its deadline"));
        }
        // Still within the deadline: let other tenants' tasks run, then check again.
        Ok(UpdateDeadline::Yield(1))
    });
}

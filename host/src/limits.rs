//! What one instance may use: linear memory (a `ResourceLimiter`), and per call a CPU budget
//! and a deadline (both checked on epoch ticks); and what it ran into, so that a trap can say
//! why it happened.
//!
//! **CPU budget.** The CPU a call's guest code gets: a call hook starts the clock when the host
//! enters wasm (or a host function returns to it) and stops it when wasm calls the host (or
//! returns), so the time a guest waits in a host call (the lock's sleep, an HTTP request) is not
//! charged; neither is the time it stands yielded on an epoch tick while other tenants' tasks
//! run, nor, in a long stretch of guest code, the time the OS runs something else on its thread
//! (see [`CpuClock`]). A guest that spins is stopped once over budget, with its neighbours
//! charged nothing; past a first stretch it may be held to a share of a core ([`CpuShare`]).
//! **Deadline.** Wall time per call, waits included.

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
    /// How much of a core a busy call may keep taking (none: all it gets).
    pub(crate) cpu_share: Option<CpuShare>,
    pub(crate) cpu: CpuClock,
    /// The call's CPU at the previous epoch tick.
    cpu_at_last_tick: Duration,
    pub(crate) cpu_hit: bool,
    /// What the CPU share held back in the current (or last) call.
    pub(crate) held_back: HeldBack,
    pub(crate) memory_denied: bool,
    /// The message of the guest's last panic (its panic hook logs `panic: ...`).
    pub(crate) last_panic: Option<String>,
    /// What the guest wrote to stderr (bounded; further writes fail).
    pub(crate) stderr: MemoryOutputPipe,
    /// A call trapped (stopped, panicked, out of memory): wasmtime enters the instance no more.
    pub(crate) trapped: bool,
}

impl Limits {
    pub(crate) fn new(
        memory_bytes: usize,
        call_deadline: Duration,
        cpu_budget: Duration,
        cpu_share: Option<CpuShare>,
    ) -> Self {
        Limits {
            memory_bytes,
            peak_memory_bytes: 0,
            call_deadline,
            call_started: None,
            deadline_hit: false,
            cpu_budget,
            cpu_share,
            cpu: CpuClock::default(),
            cpu_at_last_tick: Duration::ZERO,
            cpu_hit: false,
            held_back: HeldBack::default(),
            memory_denied: false,
            last_panic: None,
            stderr: MemoryOutputPipe::new(64 * 1024),
            trapped: false,
        }
    }

    /// A call begins: its deadline and its CPU clock start.
    pub(crate) fn begin_call(&mut self) {
        self.call_started = Some(Instant::now());
        self.cpu = CpuClock::default();
        self.cpu_at_last_tick = Duration::ZERO;
        self.held_back = HeldBack::default();
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

/// How much of one core a call may keep taking once it has run `after` of CPU: past that, at
/// each epoch tick the guest stands aside (sleeps) long enough that it runs at most `share` of
/// the time. A runner's tenants share its cores and, often, the machine with other services;
/// a guest that spins up to its CPU budget would otherwise take a whole core from them for as
/// long. Ordinary calls run a few milliseconds of guest code and never reach `after`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuShare {
    pub after: Duration,
    /// Between 0.01 and 1 (outside, the nearer bound is taken).
    pub share: f64,
}

impl CpuShare {
    /// A runner's default for its tenants: a quarter of a core after 100 ms.
    pub const TENANT: CpuShare = CpuShare {
        after: Duration::from_millis(100),
        share: 0.25,
    };

    /// How long to stand aside after running `slice` of CPU since the previous tick, with
    /// `used` in the call so far.
    pub(crate) fn pause(&self, used: Duration, slice: Duration) -> Duration {
        if used <= self.after {
            return Duration::ZERO;
        }
        let share = self.share.clamp(0.01, 1.0);
        // A tick can come late; one pause never stands aside for more than a second.
        slice
            .mul_f64((1.0 - share) / share)
            .min(Duration::from_secs(1))
    }
}

/// What a call's CPU share held it back by: counted, so that a test (or a metric) sees the
/// share at work without timing the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldBack {
    /// The pauses the call stood aside for.
    pub pauses: u32,
    /// How long they were, in all.
    pub stood_aside: Duration,
    /// The call's CPU time at the last of them.
    pub cpu_at_last_pause: Duration,
}

/// The CPU the guest's code got in one call: closed stretches inside wasm plus the open one.
/// A stretch runs from entering wasm to leaving it (a host call, a return, a yield) and stays on
/// one thread, though a call may move between threads at its waits. Most stretches are short
/// and are measured in wall time, which costs next to nothing on every host call; once a
/// stretch is seen at an epoch tick it is long, and from there on it is measured in the
/// thread's CPU time, which (unlike wall time) does not charge a busy guest for the time the OS
/// gave its core to someone else. So a spinning guest is charged the CPU it got, give or take
/// its first tick.
///
/// Shared with the future a busy guest yields on, which opens the next stretch where the guest
/// resumes.
#[derive(Debug, Clone)]
pub(crate) struct CpuClock(Arc<Stretches>);

#[derive(Debug)]
struct Stretches {
    closed_ns: AtomicU64,
    /// Wall time ([`wall_now`]) at the start of the open stretch, or [`UNSET`].
    open_since_ns: AtomicU64,
    /// The thread's CPU time at the last tick in the open stretch, or [`UNSET`].
    cpu_mark_ns: AtomicU64,
}

const UNSET: u64 = u64::MAX;

impl Default for CpuClock {
    fn default() -> Self {
        CpuClock(Arc::new(Stretches {
            closed_ns: AtomicU64::new(0),
            open_since_ns: AtomicU64::new(UNSET),
            cpu_mark_ns: AtomicU64::new(UNSET),
        }))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(UNSET - 1)
}

impl CpuClock {
    /// The guest starts running, at `wall`.
    fn enter(&self, wall: Duration) {
        self.0.cpu_mark_ns.store(UNSET, Ordering::Relaxed);
        self.0.open_since_ns.store(nanos(wall), Ordering::Relaxed);
    }

    /// The guest stops running (a host call, a return), at `wall`, on the thread it ran on.
    fn leave(&self, wall: Duration, thread_cpu: impl FnOnce() -> Duration) {
        let since = self.0.open_since_ns.swap(UNSET, Ordering::Relaxed);
        if since == UNSET {
            return;
        }
        let mark = self.0.cpu_mark_ns.swap(UNSET, Ordering::Relaxed);
        let ran = if mark == UNSET {
            nanos(wall).saturating_sub(since)
        } else {
            nanos(thread_cpu()).saturating_sub(mark)
        };
        self.0.closed_ns.fetch_add(ran, Ordering::Relaxed);
    }

    /// An epoch tick inside the open stretch, at `wall` and the thread's CPU time `cpu`: counts
    /// the stretch so far and measures the rest of it in CPU time. Returns the call's CPU.
    fn tick(&self, wall: Duration, cpu: Duration) -> Duration {
        let since = self.0.open_since_ns.load(Ordering::Relaxed);
        if since != UNSET {
            let mark = self.0.cpu_mark_ns.swap(nanos(cpu), Ordering::Relaxed);
            let ran = if mark == UNSET {
                nanos(wall).saturating_sub(since)
            } else {
                nanos(cpu).saturating_sub(mark)
            };
            self.0.open_since_ns.store(nanos(wall), Ordering::Relaxed);
            self.0.closed_ns.fetch_add(ran, Ordering::Relaxed);
        }
        self.used()
    }

    /// Ends the open stretch right after a tick (the guest yields): nothing more to count.
    fn suspend(&self) {
        self.0.open_since_ns.store(UNSET, Ordering::Relaxed);
        self.0.cpu_mark_ns.store(UNSET, Ordering::Relaxed);
    }

    /// The CPU counted so far (up to the last time the guest left, or the last tick).
    pub(crate) fn used(&self) -> Duration {
        Duration::from_nanos(self.0.closed_ns.load(Ordering::Relaxed))
    }
}

/// The CPU time of the calling thread so far.
#[cfg(unix)]
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the call writes only into it.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return wall_now();
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Where thread CPU time cannot be read, the wall time inside wasm stands in for it.
#[cfg(not(unix))]
fn thread_cpu() -> Duration {
    wall_now()
}

/// Monotonic wall time, from the first reading in the process.
fn wall_now() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Puts `store` under the limits `limits_of` finds in its data: the memory limiter, the CPU
/// clock (a call hook), and the CPU budget and deadline checked on every epoch tick (see
/// `engine`), at which a busy guest also yields so that other tenants' tasks run.
pub(crate) fn apply<T: 'static>(store: &mut Store<T>, limits_of: fn(&mut T) -> &mut Limits) {
    store.limiter(move |data| limits_of(data));
    store.call_hook(move |mut context, hook| {
        let cpu = &limits_of(context.data_mut()).cpu;
        match hook {
            CallHook::CallingWasm | CallHook::ReturningFromHost => cpu.enter(wall_now()),
            CallHook::CallingHost | CallHook::ReturningFromWasm => {
                cpu.leave(wall_now(), thread_cpu)
            }
        }
        Ok(())
    });
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut context| {
        let limits = limits_of(context.data_mut());
        let used = limits.cpu.tick(wall_now(), thread_cpu());
        if used > limits.cpu_budget {
            limits.cpu_hit = true;
            return Err(wasmtime::Error::msg("the call ran past its CPU budget"));
        }
        let overdue = limits.call_started.is_some_and(|started| {
            Instant::now().saturating_duration_since(started) > limits.call_deadline
        });
        if overdue {
            limits.deadline_hit = true;
            return Err(wasmtime::Error::msg("the call ran past its deadline"));
        }
        // Within both: let other tenants' tasks run (for longer if the call is past its share),
        // then check again. The stretch ends here and the next begins where the guest resumes
        // (perhaps on another thread).
        let slice = used.saturating_sub(limits.cpu_at_last_tick);
        limits.cpu_at_last_tick = used;
        let pause = limits
            .cpu_share
            .map_or(Duration::ZERO, |share| share.pause(used, slice));
        if !pause.is_zero() {
            let held = &mut limits.held_back;
            held.pauses += 1;
            held.stood_aside += pause;
            held.cpu_at_last_pause = used;
        }
        limits.cpu.suspend();
        let cpu = limits.cpu.clone();
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                if pause.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(pause).await;
                }
                cpu.enter(wall_now());
            }),
        ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_clock_counts_only_stretches_inside_wasm() {
        let ms = Duration::from_millis;
        let no_cpu = || -> Duration { panic!("a short stretch reads no CPU time") };
        let cpu = CpuClock::default();
        assert_eq!(cpu.used(), Duration::ZERO, "not started");
        // 30 ms of guest code, then a host call (a sleep, a request): wall time, no CPU read.
        cpu.enter(ms(100));
        cpu.leave(ms(130), no_cpu);
        assert_eq!(cpu.used(), ms(30));
        cpu.leave(ms(900), no_cpu);
        assert_eq!(cpu.used(), ms(30), "nothing counts while it is out");
        // A long stretch: wall time to its first tick, then the thread's CPU time, which on a
        // busy machine runs slower than the wall.
        cpu.enter(ms(1_000));
        assert_eq!(cpu.tick(ms(1_010), ms(5_000)), ms(40));
        assert_eq!(
            cpu.tick(ms(1_030), ms(5_004)),
            ms(44),
            "4 ms of CPU in 20 ms"
        );
        cpu.leave(ms(1_050), || ms(5_010));
        assert_eq!(cpu.used(), ms(50));
        // A tick, a yield, and the yield's future opening the next stretch elsewhere.
        cpu.enter(ms(2_000));
        assert_eq!(cpu.tick(ms(2_010), ms(9_000)), ms(60));
        cpu.suspend();
        let resumed = cpu.clone();
        resumed.enter(ms(2_500));
        resumed.leave(ms(2_502), no_cpu);
        assert_eq!(cpu.used(), ms(62));
    }

    #[test]
    fn a_call_past_its_share_stands_aside_in_proportion() {
        let ms = Duration::from_millis;
        let quarter = CpuShare::TENANT;
        assert_eq!(
            quarter.pause(ms(100), ms(10)),
            Duration::ZERO,
            "within `after`"
        );
        assert_eq!(quarter.pause(ms(110), ms(10)), ms(30), "runs 1 part in 4");
        let half = CpuShare {
            after: ms(0),
            share: 0.5,
        };
        assert_eq!(half.pause(ms(1), ms(10)), ms(10));
        let whole = CpuShare {
            after: ms(0),
            share: 1.0,
        };
        assert_eq!(whole.pause(ms(500), ms(10)), Duration::ZERO);
        let silly = CpuShare {
            after: ms(0),
            share: 0.0,
        };
        assert_eq!(
            silly.pause(ms(500), ms(100)),
            Duration::from_secs(1),
            "bounded"
        );
    }

    #[test]
    fn a_thread_is_charged_its_cpu_and_not_its_sleep() {
        let before = thread_cpu();
        std::thread::sleep(Duration::from_millis(200));
        let slept = thread_cpu() - before;
        let before = thread_cpu();
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            n = std::hint::black_box(n.wrapping_add(1));
        }
        let spun = thread_cpu() - before;
        assert!(
            slept < Duration::from_millis(50),
            "sleeping counted {slept:?}"
        );
        assert!(spun > slept, "spinning {spun:?}, sleeping {slept:?}");
    }
}

//! The clock the guest sees. The guest never reads time on its own: every timestamp and every
//! wait of its lock goes through this trait, so a host can run it on a clock of its choosing.
//!
//! [`SystemClock`] is wall time. [`VirtualClock`] is for tests: time stands still while any
//! registered instance is working (HTTP calls to ClickHouse happen in real time), and when every
//! registered instance is blocked in `sleep`, it jumps straight to the earliest wake-up. A 1 s
//! settle, a 300 s lease or a 30 s lock timeout then costs no wall time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

/// Time for guests: now, a way to wait, and membership of the instances that use it.
pub trait Clock: Send + Sync + 'static {
    /// Unix milliseconds.
    fn now_ms(&self) -> u64;
    /// Completes after `ms` milliseconds of this clock's time.
    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
    /// An instance starts using this clock; dropping the registration ends that.
    fn register(&self) -> Registration {
        Registration(None)
    }
}

/// Membership of one instance in a clock; dropped with the instance.
pub struct Registration(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(leave) = self.0.take() {
            leave();
        }
    }
}

fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The system clock, with tokio's timer for sleeping.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_now_ms()
    }

    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(tokio::time::sleep(Duration::from_millis(ms)))
    }
}

/// Test time: advances only when every registered instance sleeps.
#[derive(Clone, Default)]
pub struct VirtualClock {
    inner: Arc<Mutex<Virtual>>,
}

#[derive(Default)]
struct Virtual {
    now_ms: u64,
    members: usize,
    sleepers: Vec<(u64, oneshot::Sender<()>)>,
    /// Total virtual time skipped, for reports.
    advanced_ms: u64,
}

impl Virtual {
    /// When everyone sleeps, jump to the earliest wake-up and wake whoever is due.
    fn advance_if_idle(&mut self) {
        while self.members > 0 && self.sleepers.len() >= self.members {
            let Some(earliest) = self.sleepers.iter().map(|(at, _)| *at).min() else {
                return;
            };
            if earliest > self.now_ms {
                self.advanced_ms += earliest - self.now_ms;
                self.now_ms = earliest;
            }
            let now = self.now_ms;
            let (due, waiting): (Vec<_>, Vec<_>) =
                self.sleepers.drain(..).partition(|(at, _)| *at <= now);
            self.sleepers = waiting;
            for (_, wake) in due {
                let _ = wake.send(());
            }
        }
    }
}

impl VirtualClock {
    /// A virtual clock that starts at the current wall time.
    pub fn new() -> Self {
        Self::starting_at(system_now_ms())
    }

    pub fn starting_at(now_ms: u64) -> Self {
        VirtualClock {
            inner: Arc::new(Mutex::new(Virtual {
                now_ms,
                ..Virtual::default()
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Virtual> {
        // A panic while holding this lock leaves plain numbers behind; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How much virtual time has been skipped so far.
    pub fn advanced_ms(&self) -> u64 {
        self.lock().advanced_ms
    }

    /// Registered instances right now.
    pub fn members(&self) -> usize {
        self.lock().members
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.lock().now_ms
    }

    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        if ms == 0 {
            return Box::pin(std::future::ready(()));
        }
        let (wake, woken) = oneshot::channel();
        {
            let mut inner = self.lock();
            let at = inner.now_ms.saturating_add(ms);
            inner.sleepers.push((at, wake));
            inner.advance_if_idle();
        }
        Box::pin(async move {
            let _ = woken.await;
        })
    }

    fn register(&self) -> Registration {
        self.lock().members += 1;
        let inner = Arc::clone(&self.inner);
        Registration(Some(Box::new(move || {
            let mut inner = inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.members -= 1;
            inner.advance_if_idle();
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn time_jumps_only_when_every_member_sleeps() {
        let clock = VirtualClock::starting_at(1_000);
        let a = clock.register();
        let b = clock.register();
        let a_sleeps = tokio::spawn(clock.sleep(5_000));
        tokio::task::yield_now().await;
        assert_eq!(clock.now_ms(), 1_000, "b is still working");
        assert!(!a_sleeps.is_finished());
        let b_sleeps = tokio::spawn(clock.sleep(60_000));
        a_sleeps.await.unwrap(); // both slept: time jumped to a's wake-up
        assert_eq!(clock.now_ms(), 6_000);
        tokio::task::yield_now().await;
        assert!(!b_sleeps.is_finished(), "a is awake and working again");
        drop(a); // a is done: only b is left, asleep
        b_sleeps.await.unwrap();
        assert_eq!(clock.now_ms(), 61_000);
        drop(b);
    }

    #[tokio::test]
    async fn leaving_members_let_time_move() {
        let clock = VirtualClock::starting_at(0);
        let a = clock.register();
        let b = clock.register();
        let waiter = tokio::spawn(clock.sleep(300_000));
        tokio::task::yield_now().await;
        assert_eq!(clock.now_ms(), 0);
        drop(b); // the other instance is gone (crashed): only a sleeper is left
        waiter.await.unwrap();
        assert_eq!(clock.now_ms(), 300_000);
        assert_eq!(clock.advanced_ms(), 300_000);
        drop(a);
    }
}

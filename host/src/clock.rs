//! The clock the guest sees. The guest never reads time on its own: every timestamp and every
//! wait of its lock goes through this trait, so a host can run it on a clock of its choosing.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time for a guest: now, and a way to wait.
pub trait Clock: Send + Sync + 'static {
    /// Unix milliseconds.
    fn now_ms(&self) -> u64;
    /// Completes after `ms` milliseconds of this clock's time.
    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// The system clock, with tokio's timer for sleeping.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(tokio::time::sleep(Duration::from_millis(ms)))
    }
}

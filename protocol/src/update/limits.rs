//! An update's timings, from the configuration.

use crate::config::Config;
use crate::retry;

/// The lock's timings, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The lease of the update's grant (see [`update_lease`]).
    pub lease_ms: u64,
    pub timeout_ms: u64,
    pub retry_ms: u64,
    pub linger_ms: u64,
    /// The longest pause of the driver's retries of a statement ([`retry::MAX_PAUSE_MS`]): a
    /// transient failure received less than this before a retry bound came from that bound.
    pub retry_pause_ms: u64,
}

impl Limits {
    pub fn of(config: &Config) -> Self {
        Limits {
            lease_ms: update_lease(
                config.lock_lease_ms,
                config.lock_timeout_ms,
                MIN_UPDATE_LEASE_MS,
            ),
            timeout_ms: config.lock_timeout_ms,
            retry_ms: config.lock_retry_ms,
            linger_ms: config.lock_linger_ms,
            retry_pause_ms: retry::MAX_PAUSE_MS,
        }
    }
}

/// The shortest lease of an update's grant: its margin for clock skew is a tenth of it (1 s).
pub const MIN_UPDATE_LEASE_MS: u64 = 10_000;

/// The lease of an update's grant: the lock timeout (Meltano's meaning of
/// `lock_timeout_seconds`: how long a lock stays valid once its holder goes quiet), at least
/// `min` ([`MIN_UPDATE_LEASE_MS`]; the model's ticks are not milliseconds) and at most the
/// lock's lease (`lock_lease_seconds`, for explicit locks, held across calls). An update takes
/// milliseconds and a kept grant is renewed by use once past half its lease, so the lease only
/// has to outlast the pause between two updates. A holder that was killed holds the id this
/// long at most, so a waiter that starts after the kill and waits the same timeout gets it.
pub fn update_lease(lock_lease: u64, lock_timeout: u64, min: u64) -> u64 {
    lock_timeout.max(min).min(lock_lease)
}

//! Advisory locks on state ids, in two protocols behind one interface.
//!
//! - [`fenced`] (the default): generations in an append-only lock log. No sleep when nobody
//!   contends, a renewable lease, and a fencing token per grant that bounds the versions its
//!   holder may write.
//! - [`settle`]: the original Python backend's protocol on its `<table>_lock` table, for fleets
//!   that still run the Python backend.
//!
//! Both run the same wait loop here: try, and while another holds the lock, sleep with the
//! host's sleep ([`wait`]: `lock_retry_seconds`, longer while others win the hand-offs) until
//! `lock_timeout_seconds`.

pub mod fenced;
pub mod settle;
pub mod update;
pub mod wait;

use std::cell::RefCell;
use std::collections::HashMap;

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::exec::{Exec, Host, Level};
use crate::http::Transport;

/// A granted lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHandle {
    pub state_id: String,
    /// Who holds it: a random id per grant.
    pub owner: String,
    /// The fencing token: the generation (fenced mode), 0 in settle mode.
    pub token: u64,
    pub acquired_at_ms: u64,
    /// The holder may act (and write) until then; `renew` moves it.
    pub lease_until_ms: u64,
    /// Writes under this grant use versions at least this high (fenced mode).
    pub floor_ms: u64,
    /// The highest version written under this grant.
    pub last_written_ms: u64,
    pub mode: LockMode,
}

/// A claim whose read-back failed, and the generation it followed: whether it won is decided by
/// the same rule as a read-back's (`fenced::decide_claim`), once the log can be read.
#[derive(Debug, Clone)]
pub(crate) struct Doubt {
    pub handle: LockHandle,
    pub followed: fenced::Newest,
}

/// What the lock remembers of this instance between calls.
#[derive(Default)]
pub struct Locks {
    /// The generations this instance released last, per state id: the next acquire of the same
    /// id tries to claim the following generation without reading first.
    pub(crate) released: RefCell<HashMap<String, fenced::Newest>>,
    /// Claims this instance made whose read-back failed, per state id: the claim may have won,
    /// so the next try looks in the log whether it did (see `fenced`).
    pub(crate) in_doubt: RefCell<HashMap<String, Doubt>>,
    /// Grants kept between updates, and the state written last (see `update`).
    pub(crate) update: RefCell<update::Memory>,
}

/// A state read together with the grant (see `rows::StoredTuple`).
pub use crate::rows::StoredTuple as StoredRow;

/// The outcome of one try.
pub(crate) enum Attempt {
    Granted(LockHandle),
    Held(LockInfo),
}

pub fn acquire<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<LockHandle> {
    let config = &exec.config;
    let deadline = exec.host.now_ms().saturating_add(config.lock_timeout_ms);
    let mut wait = wait::Wait::default();
    loop {
        let attempt = match config.lock_mode {
            LockMode::Fenced => fenced::attempt(exec, locks, state_id)?,
            LockMode::Settle => settle::attempt(exec, state_id)?,
        };
        let holder = match attempt {
            Attempt::Granted(handle) => {
                exec.host.log(
                    Level::Debug,
                    &format!(
                        "lock on {state_id:?} granted to {} (token {})",
                        handle.owner, handle.token
                    ),
                );
                return Ok(handle);
            }
            Attempt::Held(info) => info,
        };
        pause(exec, locks, state_id, deadline, &mut wait, holder)?;
    }
}

/// One pause of the wait loop while `holder` has the lock (see [`wait`]): `Locked` once
/// `deadline` has passed.
pub fn pause<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    state_id: &str,
    deadline: u64,
    wait: &mut wait::Wait,
    holder: LockInfo,
) -> Result<()> {
    let now = exec.host.now_ms();
    if now >= deadline {
        if exec.config.lock_mode == LockMode::Fenced {
            fenced::withdraw_doubt(exec, locks, state_id);
        }
        return Err(Error::Locked(holder));
    }
    let jitter = 80 + (exec.host.random_u128() % 41) as u64;
    let pause = wait
        .pause_ms(holder.token, exec.config.lock_retry_ms, jitter)
        .clamp(1, deadline - now);
    exec.host.sleep_ms(pause);
    Ok(())
}

pub fn release<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    lock: &LockHandle,
) -> Result<()> {
    match lock.mode {
        LockMode::Fenced => fenced::release(exec, locks, lock),
        LockMode::Settle => settle::release(exec, lock),
    }
}

/// Runs `f`, a write under `lock`, with no retry starting once a contender may see the lease
/// ended: the retry budget never stretches a lock past its lease.
pub fn within_lease<T: Transport, H: Host, R>(
    exec: &Exec<T, H>,
    lock: &LockHandle,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let margin = fenced::lease_margin_ms(exec.config.lock_lease_ms);
    exec.retrying_until(lock.lease_until_ms.saturating_sub(margin), f)
}

/// Extends the lease from now. Fails with `lock-lost` when the lock is no longer this grant's.
pub fn renew<T: Transport, H: Host>(exec: &Exec<T, H>, lock: &mut LockHandle) -> Result<()> {
    match lock.mode {
        LockMode::Fenced => fenced::renew(exec, lock),
        LockMode::Settle => settle::renew(exec, lock),
    }
}

/// Who holds the lock of an id now, if anyone.
pub fn info<T: Transport, H: Host>(exec: &Exec<T, H>, state_id: &str) -> Result<Option<LockInfo>> {
    match exec.config.lock_mode {
        LockMode::Fenced => fenced::info(exec, state_id),
        LockMode::Settle => settle::info(exec, state_id),
    }
}

/// Breaks the lock of an id, whoever holds it; returns whether one was held.
pub fn force_unlock<T: Transport, H: Host>(exec: &Exec<T, H>, state_id: &str) -> Result<bool> {
    match exec.config.lock_mode {
        LockMode::Fenced => fenced::force_unlock(exec, state_id),
        LockMode::Settle => settle::force_unlock(exec, state_id),
    }
}

/// A version for a write under a lock, before the fence decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposed {
    /// Within the grant's lease: safe to write.
    Within(u64),
    /// Above the lease end because something stored is newer than the lease: either a later
    /// holder wrote it (the lock is lost) or a writer whose clock is ahead did; the lock log
    /// tells which.
    AboveLease(u64),
}

/// The version for a state write under `lock`: the host's clock, above what is stored and above
/// the grant's floor. A holder whose lease has run out has lost the lock.
pub fn propose_version(lock: &LockHandle, now_ms: u64, stored_ms: u64) -> Result<Proposed> {
    let version = now_ms.max(stored_ms.saturating_add(1)).max(lock.floor_ms);
    if lock.mode == LockMode::Settle {
        return Ok(Proposed::Within(version));
    }
    if now_ms > lock.lease_until_ms {
        return Err(Error::LockLost(format!(
            "the lease on {:?} (token {}) ended at {} ms; renew it before writing",
            lock.state_id, lock.token, lock.lease_until_ms
        )));
    }
    Ok(if version > lock.lease_until_ms {
        Proposed::AboveLease(version)
    } else {
        Proposed::Within(version)
    })
}

/// The fenced version for a state write under `lock` (see `fenced` for why this is safe).
pub fn write_version<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    lock: &mut LockHandle,
    stored_ms: u64,
) -> Result<u64> {
    let version = match propose_version(lock, exec.host.now_ms(), stored_ms)? {
        Proposed::Within(v) => v,
        Proposed::AboveLease(v) => {
            fenced::confirm_held(exec, lock)?;
            v
        }
    };
    lock.last_written_ms = lock.last_written_ms.max(version);
    Ok(version)
}

/// Call after a write under `lock` was acknowledged. Near or past the lease's end, a contender
/// may have taken the lock and read the state before the write landed (the write stalled, or
/// was retried); its own write would then bury this one, acknowledged or not. The log says
/// whether the write was in time: if the grant is still the newest, no contender has claimed
/// yet, and any later one reads the state after the write.
pub fn confirm_write<T: Transport, H: Host>(exec: &Exec<T, H>, lock: &LockHandle) -> Result<()> {
    let late = fenced::near_lease_end(
        exec.host.now_ms(),
        lock.lease_until_ms,
        exec.config.lock_lease_ms,
    );
    if lock.mode != LockMode::Fenced || !late {
        return Ok(());
    }
    fenced::confirm_held(exec, lock).map_err(|e| match e {
        Error::LockLost(why) => Error::LockLost(format!(
            "the write was acknowledged after the lease ended and may not count: {why}"
        )),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(floor: u64, until: u64) -> LockHandle {
        LockHandle {
            state_id: "s".into(),
            owner: "me".into(),
            token: 7,
            acquired_at_ms: 1_000,
            lease_until_ms: until,
            floor_ms: floor,
            last_written_ms: 0,
            mode: LockMode::Fenced,
        }
    }

    #[test]
    fn versions_follow_the_clock_above_what_is_stored_and_the_floor() {
        let lock = handle(0, 10_000);
        assert_eq!(
            propose_version(&lock, 2_000, 1_500).unwrap(),
            Proposed::Within(2_000)
        );
        assert_eq!(
            propose_version(&lock, 2_000, 2_500).unwrap(),
            Proposed::Within(2_501)
        );
        let lock = handle(5_000, 10_000);
        assert_eq!(
            propose_version(&lock, 2_000, 0).unwrap(),
            Proposed::Within(5_000)
        );
    }

    #[test]
    fn a_write_past_the_lease_is_refused() {
        let lock = handle(0, 10_000);
        assert!(matches!(
            propose_version(&lock, 10_001, 0),
            Err(Error::LockLost(_))
        ));
    }

    #[test]
    fn a_newer_stored_version_needs_the_log_to_decide() {
        let lock = handle(0, 10_000);
        assert_eq!(
            propose_version(&lock, 5_000, 10_000).unwrap(),
            Proposed::AboveLease(10_001)
        );
    }

    #[test]
    fn settle_mode_has_no_fence() {
        let mut lock = handle(0, 10_000);
        lock.mode = LockMode::Settle;
        assert_eq!(
            propose_version(&lock, 20_000, 0).unwrap(),
            Proposed::Within(20_000)
        );
    }
}

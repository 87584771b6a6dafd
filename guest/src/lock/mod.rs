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

pub mod drive;
pub mod fenced;
pub mod settle;
pub mod update;
pub mod wait;

use std::cell::RefCell;
use std::collections::HashMap;

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::http::Transport;
use crate::session::{Level, Platform, Session};

/// A granted lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Doubt {
    pub handle: LockHandle,
    pub followed: fenced::NewestGeneration,
}

/// A grant kept between updates (linger), with the state its last write stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Kept {
    pub handle: LockHandle,
    pub basis: Option<StoredRow>,
    pub last_used_ms: u64,
    /// When `idle` last looked in the log whether another instance wants the grant.
    pub checked_ms: u64,
}

/// What the lock remembers of one state id between calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Memory {
    /// The grant `update` kept for the next update (linger).
    pub kept: Option<Kept>,
    /// The generation this instance released last: the next claim follows it without reading
    /// first (an `update`'s, unless the id is shared).
    pub released: Option<fenced::NewestGeneration>,
    /// A claim whose fate is unknown (its read-back or a write under it failed): the claim may
    /// have won, so the next try looks in the log whether it did (see `fenced`).
    pub doubt: Option<Doubt>,
    /// The state this instance last wrote under a grant it then released: the basis of the
    /// next claim's first write (the guard refuses it if it is stale).
    pub last_written: Option<StoredRow>,
    /// Until then the id is shared with another instance (see [`Memory::shared`]).
    pub shared_until_ms: u64,
}

impl Memory {
    /// Whether another instance wrote the id lately: an `update` of this one waited for it or
    /// lost a claim to it less than a lease ago, or has found its generations the newest since.
    /// `update` then keeps no grant (linger) and reads the log before it claims: a kept grant
    /// would make the other wait until the keeper sees its `want` (a look or a renewal away),
    /// and a claim without reading would follow a generation that is no longer the newest.
    pub fn shared(&self, now_ms: u64) -> bool {
        now_ms < self.shared_until_ms
    }

    fn is_empty(&self) -> bool {
        self == &Memory::default()
    }
}

/// What the lock remembers of this instance between calls, per state id.
#[derive(Default)]
pub struct Locks {
    ids: RefCell<HashMap<String, Memory>>,
}

impl Locks {
    /// Takes what is remembered of `state_id` (the caller puts back what is left).
    pub(crate) fn take(&self, state_id: &str) -> Memory {
        self.ids.borrow_mut().remove(state_id).unwrap_or_default()
    }

    pub(crate) fn put(&self, state_id: &str, memory: Memory) {
        if memory.is_empty() {
            self.ids.borrow_mut().remove(state_id);
        } else {
            self.ids.borrow_mut().insert(state_id.to_string(), memory);
        }
    }

    /// Changes what is remembered of `state_id`.
    pub(crate) fn with<R>(&self, state_id: &str, f: impl FnOnce(&mut Memory) -> R) -> R {
        let mut memory = self.take(state_id);
        let result = f(&mut memory);
        self.put(state_id, memory);
        result
    }

    /// Takes the kept grants idle since `before_ms` (all of them with `None`).
    pub(crate) fn take_kept(&self, before_ms: Option<u64>) -> Vec<Kept> {
        let ids: Vec<String> = self
            .ids
            .borrow()
            .iter()
            .filter(|(_, m)| {
                m.kept
                    .as_ref()
                    .is_some_and(|k| before_ms.is_none_or(|b| k.last_used_ms <= b))
            })
            .map(|(id, _)| id.clone())
            .collect();
        ids.iter()
            .filter_map(|id| self.with(id, |m| m.kept.take()))
            .collect()
    }

    /// The ids whose kept grant nobody has used or looked at for `every_ms`, and which its
    /// linger does not give back anyway.
    fn kept_unlooked(&self, now_ms: u64, every_ms: u64, linger_ms: u64) -> Vec<String> {
        self.ids
            .borrow()
            .iter()
            .filter(|(_, m)| {
                m.kept.as_ref().is_some_and(|k| {
                    k.last_used_ms.max(k.checked_ms).saturating_add(every_ms) <= now_ms
                        && k.last_used_ms.saturating_add(linger_ms) > now_ms
                })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// When `idle` is due next: a kept grant's linger ends, or it is time to look whether it
    /// is wanted.
    fn next_idle(&self, linger_ms: u64, look_ms: u64) -> Option<u64> {
        self.ids
            .borrow()
            .values()
            .filter_map(|m| m.kept.as_ref())
            .map(|k| {
                let ends = k.last_used_ms.saturating_add(linger_ms);
                let look = k.last_used_ms.max(k.checked_ms).saturating_add(look_ms);
                ends.min(look)
            })
            .min()
    }
}

/// A state read together with the grant (see `rows::StoredTuple`).
pub use crate::rows::StoredTuple as StoredRow;

/// The outcome of one try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Granted(LockHandle),
    Held(LockInfo),
}

pub fn acquire<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<LockHandle> {
    let config = &session.config;
    let deadline = session.host.now_ms().saturating_add(config.lock_timeout_ms);
    let mut wait = wait::Wait::default();
    loop {
        let attempt = match config.lock_mode {
            LockMode::Fenced => fenced::attempt(session, locks, state_id)?,
            LockMode::Settle => settle::attempt(session, state_id)?,
        };
        let holder = match attempt {
            Attempt::Granted(handle) => {
                session.host.log(
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
        pause(session, locks, state_id, deadline, &mut wait, holder)?;
    }
}

/// One pause of the wait loop while `holder` has the lock (see [`wait`]): `Locked` once
/// `deadline` has passed.
pub fn pause<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    deadline: u64,
    wait: &mut wait::Wait,
    holder: LockInfo,
) -> Result<()> {
    let now = session.host.now_ms();
    if now >= deadline {
        if session.config.lock_mode == LockMode::Fenced {
            fenced::withdraw_doubt(session, locks, state_id);
        }
        return Err(Error::Locked(holder));
    }
    let jitter = 80 + (session.host.random_u128() % 41) as u64;
    let pause = wait
        .pause_ms(holder.token, session.config.lock_retry_ms, jitter)
        .clamp(1, deadline - now);
    if session.config.lock_mode == LockMode::Fenced && wait.should_want(holder.token) {
        // A hint for a keeper (see `idle`): one try, and its failure changes nothing.
        let row = fenced::want(&holder, now);
        if let Err(e) = fenced::say_wanted(session, &row) {
            session.host.log(
                Level::Debug,
                &format!("saying that the lock of {state_id:?} is wanted failed: {e}"),
            );
        }
    }
    session.host.sleep_ms(pause);
    Ok(())
}

pub fn release<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    lock: &LockHandle,
) -> Result<()> {
    match lock.mode {
        LockMode::Fenced => fenced::release(session, locks, lock),
        LockMode::Settle => settle::release(session, lock),
    }
}

/// Runs `f`, a write under `lock`, with no retry starting once a contender may see the lease
/// ended: the retry budget never stretches a lock past its lease.
pub fn within_lease<T: Transport, H: Platform, R>(
    session: &Session<T, H>,
    lock: &LockHandle,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let margin = fenced::lease_margin_ms(session.config.lock_lease_ms);
    session.retrying_until(lock.lease_until_ms.saturating_sub(margin), f)
}

/// Extends the lease from now. Fails with `lock-lost` when the lock is no longer this grant's.
pub fn renew<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &mut LockHandle,
) -> Result<()> {
    match lock.mode {
        LockMode::Fenced => fenced::renew(session, lock),
        LockMode::Settle => settle::renew(session, lock),
    }
}

/// Who holds the lock of an id now, if anyone.
pub fn info<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<Option<LockInfo>> {
    match session.config.lock_mode {
        LockMode::Fenced => fenced::info(session, state_id),
        LockMode::Settle => settle::info(session, state_id),
    }
}

/// Breaks the lock of an id, whoever holds it; returns whether one was held.
pub fn force_unlock<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<bool> {
    match session.config.lock_mode {
        LockMode::Fenced => fenced::force_unlock(session, state_id),
        LockMode::Settle => settle::force_unlock(session, state_id),
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

/// The fenced version for a state write under `lock` (see `fenced` for why this is safe),
/// recorded in the grant before the write is sent: the write may land after its sender gave up,
/// and the release cap must cover it. A version above the lease is first covered by a renewal
/// to it (see `update`).
pub fn write_version<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &mut LockHandle,
    stored_ms: u64,
) -> Result<u64> {
    let now = match lock.mode {
        // The server's clock, as the original's writes (see `Session::version_clock_ms`).
        LockMode::Settle => session.version_clock_ms()?,
        LockMode::Fenced => session.host.now_ms(),
    };
    let version = match propose_version(lock, now, stored_ms)? {
        Proposed::Within(v) => v,
        Proposed::AboveLease(v) => {
            let until = now.saturating_add(session.config.lock_lease_ms).max(v);
            drive::renew(session, lock, until)?;
            v
        }
    };
    lock.last_written_ms = lock.last_written_ms.max(version);
    Ok(version)
}

/// Releases the grants `update` kept that were idle for the linger, or that another instance
/// wants (all of them with `all`); returns when to be called next, if any grant is left.
///
/// A grant idle for a retry interval (`lock_retry_seconds`) is looked up in the log once per
/// interval: a waiter that found it held appended a `want` row (`fenced::want`), and it is given
/// back at once, so that the waiter waits about one interval rather than the linger. A stream
/// faster than the interval never looks (its renewals read the log instead; see `update`).
pub fn idle<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    all: bool,
) -> Result<Option<u64>> {
    let now = session.host.now_ms();
    let linger = session.config.lock_linger_ms;
    // Not more often than 10 times a second, whatever the retry interval.
    let look = session.config.lock_retry_ms.max(100);
    let mut wanted = Vec::new();
    if !all {
        for state_id in locks.kept_unlooked(now, look, linger) {
            // A look, not a decision: one try, no retry.
            let newest = session.retrying_until(now, || fenced::newest(session, &state_id));
            // From when the answer came: a slow look does not make the next one due at once.
            let looked = session.host.now_ms();
            locks.with(&state_id, |m| {
                let Some(kept) = m.kept.as_mut() else { return };
                kept.checked_ms = looked;
                match &newest {
                    Ok(n) if n.wanted != 0 || !n.still_held_by(&kept.handle) => {
                        m.shared_until_ms =
                            now.saturating_add(update::Limits::of(&session.config).lease_ms);
                        wanted.extend(m.kept.take());
                    }
                    Ok(_) => {}
                    Err(e) => session.host.log(
                        Level::Debug,
                        &format!("looking whether the lock of {state_id:?} is wanted failed: {e}"),
                    ),
                }
            });
        }
    }
    let mut due = locks.take_kept((!all).then(|| now.saturating_sub(linger)));
    due.extend(wanted);
    let mut first_error = None;
    for kept in due {
        if let Err(e) = release_kept_grant(session, locks, kept) {
            session.host.log(
                Level::Warn,
                &format!("releasing a kept lock failed; it ends with its lease: {e}"),
            );
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(locks.next_idle(linger, look))
}

/// Releases the kept grant of one id, if any (before the instance takes its lock another way).
pub fn release_kept<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<()> {
    match locks.with(state_id, |m| m.kept.take()) {
        Some(kept) => release_kept_grant(session, locks, kept),
        None => Ok(()),
    }
}

/// Releases a kept grant, remembering what it wrote last for the next claim's basis.
fn release_kept_grant<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    kept: Kept,
) -> Result<()> {
    fenced::release(session, locks, &kept.handle)?;
    session.host.log(
        Level::Debug,
        &format!("gave back the kept lock of {:?}", kept.handle.state_id),
    );
    if let Some(written) = kept.basis {
        locks.with(&kept.handle.state_id, |m| m.last_written = Some(written));
    }
    Ok(())
}

/// Call after a write under `lock` was acknowledged. Near or past the lease's end, a contender
/// may have taken the lock and read the state before the write landed (the write stalled, or
/// was retried); its own write would then bury this one, acknowledged or not. The log says
/// whether the write was in time: if the grant is still the newest, no contender has claimed
/// yet, and any later one reads the state after the write.
pub fn confirm_write<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &LockHandle,
) -> Result<()> {
    let late = fenced::near_lease_end(
        session.host.now_ms(),
        lock.lease_until_ms,
        session.config.lock_lease_ms,
    );
    if lock.mode != LockMode::Fenced || !late {
        return Ok(());
    }
    fenced::confirm_held(session, lock).map_err(|e| match e {
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

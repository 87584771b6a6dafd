//! Advisory locks on state ids, in two protocols behind one interface, over a session (the
//! protocols themselves, sans IO: `protocol::{fenced, settle, update}`).
//!
//! - [`fenced`] (the default): generations in an append-only lock log. No sleep when nobody
//!   contends, a renewable lease, and a fencing token per grant that bounds the versions its
//!   holder may write.
//! - [`settle`]: the original Python backend's protocol on its `<table>_lock` table, for fleets
//!   that still run the Python backend.
//!
//! Both run the same wait loop here: try, and while another holds the lock, sleep with the
//! host's sleep ([`Wait`]: `lock_retry_seconds`, longer while others win the hand-offs) until
//! `lock_timeout_seconds`.

pub mod drive;
pub mod fenced;
pub mod run;
pub mod settle;

use std::cell::RefCell;
use std::collections::HashMap;

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::events;
use crate::http::Transport;
use crate::session::{Level, Platform, Session};
use protocol::fenced::{lease_margin_ms, near_lease_end, want};
use protocol::grant::{Attempt, Kept, LockHandle, Memory, Proposed, propose_version};
use protocol::update::Limits;
use protocol::wait::Wait;

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

    /// Takes the kept grants idle since `before_ms`, a run's holds apart (all of them, holds
    /// too, with `None`: the holds end with the host's use of the store).
    pub(crate) fn take_kept(&self, before_ms: Option<u64>) -> Vec<Kept> {
        let ids: Vec<String> = self
            .ids
            .borrow()
            .iter()
            .filter(|(_, m)| {
                m.kept.as_ref().is_some_and(|k| match before_ms {
                    None => true,
                    Some(b) => !m.run_hold && k.last_used_ms <= b,
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        ids.iter()
            .filter_map(|id| {
                self.with(id, |m| {
                    m.run_hold &= before_ms.is_some();
                    m.kept.take()
                })
            })
            .collect()
    }

    /// Takes the run's held grants that `due` says to renew, with their ids.
    pub(crate) fn holds_due(&self, due: impl Fn(&Kept) -> bool) -> Vec<(String, Kept)> {
        let ids: Vec<String> = self
            .ids
            .borrow()
            .iter()
            .filter(|(_, m)| m.run_hold && m.kept.as_ref().is_some_and(&due))
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| self.with(&id, |m| m.kept.take()).map(|k| (id, k)))
            .collect()
    }

    /// The ids whose kept grant nobody has used or looked at for `every_ms`, and which its
    /// linger does not give back anyway.
    fn kept_unlooked(&self, now_ms: u64, every_ms: u64, linger_ms: u64) -> Vec<String> {
        self.ids
            .borrow()
            .iter()
            .filter(|(_, m)| {
                // a run's hold is never given to a waiter: nothing to look for
                !m.run_hold
                    && m.kept.as_ref().is_some_and(|k| {
                        k.last_used_ms.max(k.checked_ms).saturating_add(every_ms) <= now_ms
                            && k.last_used_ms.saturating_add(linger_ms) > now_ms
                    })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// When `idle` is due next: a kept grant's linger ends, or it is time to look whether it
    /// is wanted; a run's hold is due for renewal (see [`run::renewal_due`]).
    fn next_idle(&self, linger_ms: u64, look_ms: u64, lease_ms: u64) -> Option<u64> {
        self.ids
            .borrow()
            .values()
            .filter_map(|m| m.kept.as_ref().map(|k| (k, m.run_hold)))
            .map(|(k, held)| {
                if held {
                    return run::renewal_due(k, lease_ms, look_ms);
                }
                let ends = k.last_used_ms.saturating_add(linger_ms);
                let look = k.last_used_ms.max(k.checked_ms).saturating_add(look_ms);
                ends.min(look)
            })
            .min()
    }
}

pub fn acquire<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<LockHandle> {
    let config = &session.config;
    let deadline = session.host.now_ms().saturating_add(config.lock_timeout_ms);
    let mut wait = Wait::default();
    loop {
        let attempt = match config.lock_mode {
            LockMode::Fenced => fenced::attempt(session, locks, state_id, config.lock_lease_ms)?,
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

/// One pause of the wait loop while `holder` has the lock (see [`Wait`]): `Locked` once
/// `deadline` has passed.
pub fn pause<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    deadline: u64,
    wait: &mut Wait,
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
        let row = want(&holder, now);
        if let Err(e) = fenced::say_wanted(session, &row) {
            session.host.log(
                Level::Debug,
                &format!("saying that the lock of {state_id:?} is wanted failed: {e}"),
            );
        }
    }
    session
        .host
        .log(Level::Debug, &events::lock_wait(&holder, pause));
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
    let margin = lease_margin_ms(session.config.lock_lease_ms);
    session.retrying_until(lock.lease_until_ms.saturating_sub(margin), f)
}

/// Extends the lease from now. Fails with `lock-lost` when the lock is no longer this grant's.
pub fn renew<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &mut LockHandle,
) -> Result<()> {
    match lock.mode {
        LockMode::Fenced => {
            let until = session
                .host
                .now_ms()
                .saturating_add(session.config.lock_lease_ms);
            drive::renew(session, lock, until, session.config.lock_lease_ms)
        }
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
            drive::renew(session, lock, until, session.config.lock_lease_ms)?;
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
/// interval: a waiter that found it held appended a `want` row ([`want`]), and it is given
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
                            now.saturating_add(Limits::of(&session.config).lease_ms);
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
    if !all {
        run::renew_due(session, locks);
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
    Ok(locks.next_idle(linger, look, Limits::of(&session.config).lease_ms))
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
    session
        .host
        .log(Level::Debug, &events::hand_off(&kept.handle.state_id));
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
    let late = near_lease_end(
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

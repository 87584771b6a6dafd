//! The lock side of `update` in fenced mode: one round trip per update in steady state.
//!
//! An update needs the lock, the stored state, and a write. Done one step at a time that is
//! four round trips (claim, read back, write, release). Here:
//!
//! - **Guarded writes.** The state write is an `INSERT ... SELECT ... FROM <lock log> HAVING
//!   guard`: the server writes the row only if the grant is the newest generation, claimed by this
//!   owner alone, neither released nor forced, and the stored version is still the one the update
//!   merged into (see [`Guard`]; [`fenced::admits`] is the same rule in Rust, which the model
//!   runs). `written_rows` says whether it wrote. The first write of a claim thereby also confirms
//!   the claim (the read-back's rule: the second of two contenders to check sees the other), so a
//!   first update is three round trips: read the newest generation with the state, claim, write.
//! - **Linger.** With `lock_linger_seconds`, the grant is kept after the update, with the
//!   state it wrote. The next update of the id merges into that state locally and sends one
//!   guarded write. A stale cache (someone wrote or deleted meanwhile) or a lost grant (forced
//!   open) makes the guard refuse: the update then reads what is there and tries again, or
//!   takes the lock anew. The lease is renewed once past its half; the host calls `idle` so
//!   that a grant idle for the linger is released, and `close` at exit.
//!
//! A refused write is never silent: its outcome is read back before anything is reported.

use std::collections::HashMap;

use super::fenced::{self, ClaimOutcome, Newest};
use super::{Doubt, LockHandle, Locks, StoredRow};
use crate::error::{Error, LockInfo, Result};
use crate::exec::{Exec, Host, Level};
use crate::http::Transport;
use crate::rows::{self, Claim, Outlook};
use crate::sql::{Guard, StateRow};

/// A grant kept between updates, with the state its last write stored.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub handle: LockHandle,
    pub basis: Option<StoredRow>,
    pub last_used_ms: u64,
}

/// What the lock remembers for updates, per state id.
#[derive(Default)]
pub(crate) struct Memory {
    /// Grants kept for the next update (linger).
    pub kept: HashMap<String, Kept>,
    /// The state this instance last wrote under a grant it then released: the basis of the
    /// next claim's first write (the guard refuses it if it is stale).
    pub last_written: HashMap<String, StoredRow>,
}

/// A grant an update may write under.
#[derive(Debug)]
pub struct Ready {
    pub handle: LockHandle,
    /// The state the write merges into (partial, completed, version), none when none is stored.
    pub basis: Option<StoredRow>,
    /// The generation the claim replaced, while the claim is not yet confirmed (its first
    /// write confirms it); `None` once confirmed.
    claimed_after: Option<Newest>,
}

impl Ready {
    fn basis_version(&self) -> u64 {
        self.basis.as_ref().map_or(0, |(_, _, v)| *v)
    }

    fn guard(&self) -> Guard {
        Guard {
            state_id: self.handle.state_id.clone(),
            generation: self.handle.token,
            owner: self.handle.owner.clone(),
            confirmed: self.claimed_after.is_none(),
            previous_until: match &self.claimed_after {
                // Only a generation that ended by its lease can be renewed after it was read
                // (see `fenced::renewed_since`).
                Some(current) if current.released == 0 && current.forced == 0 => {
                    current.lease_until_ms
                }
                _ => u64::MAX,
            },
            expected_version: self.basis_version(),
        }
    }
}

/// What preparing an update found.
pub enum Prepared {
    Ready(Ready),
    /// Another holder has the lock.
    Held(LockInfo),
}

/// The outcome of a guarded write.
pub enum Written {
    /// Stored.
    Done,
    /// Not stored: the stored state changed since the basis was read; here is what is stored
    /// now (the grant is confirmed).
    Stale,
    /// Not stored: the grant is not (or no longer) this update's.
    Lost(LockInfo),
}

/// Finds a grant for an update of `state_id`: the kept one, a claim in doubt that won, or a
/// new claim (after reading the newest generation with the state, unless this instance
/// released the newest generation itself).
pub fn prepare<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<Prepared> {
    let kept = locks.update.borrow_mut().kept.remove(state_id);
    if let Some(kept) = kept
        && let Some(ready) = resume(exec, locks, kept)?
    {
        return Ok(Prepared::Ready(ready));
    }
    let doubt = locks.in_doubt.borrow_mut().remove(state_id);
    let now = exec.host.now_ms();
    let last = locks.released.borrow_mut().remove(state_id);
    let outlook = match (doubt, last) {
        (Some(doubt), _) => {
            let outlook = read_outlook(exec, state_id).inspect_err(|_| {
                locks
                    .in_doubt
                    .borrow_mut()
                    .insert(state_id.to_string(), doubt.clone());
            })?;
            if outlook.newest.is_claim_of(&doubt.handle) && now <= doubt.handle.lease_until_ms {
                // The claim landed and is the newest grant. Whether it won is left to the
                // guarded write, which holds it to the read-back rule (every claim on its
                // generation ours, the one it followed not renewed since): not confirmed yet.
                exec.host.log(
                    Level::Info,
                    &format!(
                        "the claim in doubt on {state_id:?} (token {}) is the newest grant",
                        doubt.handle.token
                    ),
                );
                return Ok(Prepared::Ready(Ready {
                    handle: doubt.handle,
                    basis: outlook.stored,
                    claimed_after: Some(doubt.followed),
                }));
            }
            outlook
        }
        // This instance released the newest generation itself (Meltano's pattern: one process
        // after another on one id): claim the next one without reading, with the state it
        // wrote last as the basis. If anyone else got in between, the guard refuses.
        (None, Some(last)) => Outlook {
            stored: locks.update.borrow_mut().last_written.remove(state_id),
            newest: last,
        },
        (None, None) => read_outlook(exec, state_id)?,
    };
    if !outlook.newest.is_free(now) {
        return Ok(Prepared::Held(outlook.newest.info(state_id)));
    }
    let handle = fenced::append_claim(exec, state_id, &outlook.newest)?;
    Ok(Prepared::Ready(Ready {
        handle,
        basis: outlook.stored,
        claimed_after: Some(outlook.newest),
    }))
}

fn read_outlook<T: Transport, H: Host>(exec: &Exec<T, H>, state_id: &str) -> Result<Outlook> {
    Ok(exec
        .fetch_first(&exec.sql.log_outlook(state_id))?
        .unwrap_or_default())
}

/// A kept grant, if it can still be written under: renewed once past half its lease; given
/// up (released) when too close to its end to renew, dropped when the log says it is lost.
fn resume<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    kept: Kept,
) -> Result<Option<Ready>> {
    let Kept {
        mut handle, basis, ..
    } = kept;
    let now = exec.host.now_ms();
    let lease = exec.config.lock_lease_ms;
    if fenced::near_lease_end(now, handle.lease_until_ms, lease) {
        // Too late to renew safely: hand it back and claim anew.
        if let Err(e) = release(exec, locks, &handle, basis) {
            exec.host.log(
                Level::Warn,
                &format!("releasing an expiring kept lock failed: {e}"),
            );
        }
        return Ok(None);
    }
    if handle.lease_until_ms.saturating_sub(now) < lease / 2 {
        match fenced::renew(exec, &mut handle) {
            Ok(()) => {}
            Err(Error::LockLost(why)) => {
                exec.host
                    .log(Level::Info, &format!("a kept lock was lost: {why}"));
                return Ok(None);
            }
            Err(e) => {
                // Keep it: nothing says it is lost.
                let kept = Kept {
                    handle,
                    basis,
                    last_used_ms: now,
                };
                locks
                    .update
                    .borrow_mut()
                    .kept
                    .insert(kept.handle.state_id.clone(), kept);
                return Err(e);
            }
        }
    }
    Ok(Some(Ready {
        handle,
        basis,
        claimed_after: None,
    }))
}

/// Writes `partial`/`completed` at `version` under `ready`'s guard, and finds out why when it
/// was refused. On `Stale`, `ready.basis` is what is stored now and the grant is confirmed.
pub fn write<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    ready: &mut Ready,
    partial: &str,
    completed: &str,
    version: u64,
) -> Result<Written> {
    let row = StateRow {
        state_id: &ready.handle.state_id,
        partial,
        completed,
        version_ms: version,
    };
    let guard = ready.guard();
    let written = if row.fits_in_params() {
        exec.run_written(&exec.sql.write_guarded(row, &guard, &exec.new_token()))?
    } else {
        // Too large for query parameters: check, then insert (what the guard does, in two).
        if rows::number(&exec.run(&exec.sql.guard_holds(&guard))?)? == 1 {
            let mut data = Vec::new();
            row.encode(&mut data)?;
            exec.run(&exec.sql.insert_states(data, &exec.new_token()))?;
            Some(1)
        } else {
            Some(0)
        }
    };
    if written == Some(1) {
        ready.handle.last_written_ms = ready.handle.last_written_ms.max(version);
        ready.claimed_after = None;
        return Ok(Written::Done);
    }
    // Refused (or the server did not say): read what decides it.
    recheck(exec, ready, partial, completed, version)
}

/// After a refused (or unconfirmed) guarded write: is the grant ours, and what is stored?
fn recheck<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    ready: &mut Ready,
    partial: &str,
    completed: &str,
    version: u64,
) -> Result<Written> {
    let handle = &ready.handle;
    let stored = if let Some(current) = &ready.claimed_after {
        let read = exec.sql.log_claims(&handle.state_id, handle.token, true);
        let mut claims: Vec<Claim> = exec.fetch(&read)?;
        match fenced::decide_claim(current, &claims, &handle.owner, handle.token) {
            ClaimOutcome::Mine => claims.first_mut().and_then(|c| c.stored.pop()),
            ClaimOutcome::GivesWay => {
                let mut info = current.info(&handle.state_id);
                info.expires_at_ms = claims.first().map_or(0, |c| c.previous_until);
                return Ok(Written::Lost(info));
            }
            ClaimOutcome::Lost => return Ok(Written::Lost(fenced::rival(&claims, handle))),
        }
    } else {
        let outlook = read_outlook(exec, &handle.state_id)?;
        let now = exec.host.now_ms();
        if !outlook.newest.is_claim_of(handle) || now > handle.lease_until_ms {
            return Ok(Written::Lost(outlook.newest.info(&handle.state_id)));
        }
        outlook.stored
    };
    ready.claimed_after = None;
    // The write itself may have landed (its answer was lost and the retry was refused): then
    // what is stored is exactly it.
    if let Some((p, c, v)) = &stored
        && *v == version
        && p.as_deref() == Some(partial)
        && c.as_deref() == Some(completed)
    {
        ready.handle.last_written_ms = ready.handle.last_written_ms.max(version);
        ready.basis = stored;
        return Ok(Written::Done);
    }
    ready.basis = stored;
    Ok(Written::Stale)
}

/// After a successful update: keep the grant for the linger, or release it.
pub fn keep<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    ready: Ready,
    written: StoredRow,
) -> Result<()> {
    let now = exec.host.now_ms();
    if exec.config.lock_linger_ms > 0 {
        let state_id = ready.handle.state_id.clone();
        locks.update.borrow_mut().kept.insert(
            state_id,
            Kept {
                handle: ready.handle,
                basis: Some(written),
                last_used_ms: now,
            },
        );
        return Ok(());
    }
    release(exec, locks, &ready.handle, Some(written))
}

/// Releases a grant, remembering what it wrote last for the next claim's basis.
fn release<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    handle: &LockHandle,
    written: Option<StoredRow>,
) -> Result<()> {
    fenced::release(exec, locks, handle)?;
    if let Some(written) = written {
        locks
            .update
            .borrow_mut()
            .last_written
            .insert(handle.state_id.clone(), written);
    }
    Ok(())
}

/// After a failed update: a confirmed grant is released; a claim whose fate is unknown is kept
/// in doubt, so that the next try (or giving up) settles it. Best effort: the update's own
/// error is what the caller sees.
pub fn abandon<T: Transport, H: Host>(exec: &Exec<T, H>, locks: &Locks, ready: Ready) {
    if let Some(followed) = ready.claimed_after {
        locks.in_doubt.borrow_mut().insert(
            ready.handle.state_id.clone(),
            Doubt {
                handle: ready.handle,
                followed,
            },
        );
        return;
    }
    if let Err(e) = fenced::release(exec, locks, &ready.handle) {
        exec.host.log(
            Level::Warn,
            &format!(
                "releasing the lock on {:?} after a failed update failed; it ends with its lease: {e}",
                ready.handle.state_id
            ),
        );
    }
}

/// Releases the kept grants idle for the linger (all of them with `all`); returns when the
/// next one falls due, if any is left.
pub fn idle<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    all: bool,
) -> Result<Option<u64>> {
    let now = exec.host.now_ms();
    let linger = exec.config.lock_linger_ms;
    let due: Vec<Kept> = {
        let mut memory = locks.update.borrow_mut();
        let ids: Vec<String> = memory
            .kept
            .iter()
            .filter(|(_, k)| all || k.last_used_ms.saturating_add(linger) <= now)
            .map(|(id, _)| id.clone())
            .collect();
        ids.iter().filter_map(|id| memory.kept.remove(id)).collect()
    };
    let mut first_error = None;
    for kept in due {
        if let Err(e) = release(exec, locks, &kept.handle, kept.basis) {
            exec.host.log(
                Level::Warn,
                &format!(
                    "releasing the kept lock on {:?} failed; it ends with its lease: {e}",
                    kept.handle.state_id
                ),
            );
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(locks
        .update
        .borrow()
        .kept
        .values()
        .map(|k| k.last_used_ms.saturating_add(linger))
        .min())
}

/// Releases the kept grant of one id, if any (before the instance takes its lock another way).
pub fn release_kept<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    state_id: &str,
) -> Result<()> {
    let kept = locks.update.borrow_mut().kept.remove(state_id);
    match kept {
        Some(kept) => release(exec, locks, &kept.handle, kept.basis),
        None => Ok(()),
    }
}

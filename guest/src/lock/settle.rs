//! Settle mode: the original Python backend's protocol on its `<table>_lock` table, so that a
//! fleet still running the Python backend stays mutually excluded with this one.
//!
//! 1. Remove candidates older than the lease and read the live ones; if any, wait.
//! 2. Insert a candidate with a fresh random id, then settle (1 s by default, the host's sleep).
//! 3. Read the candidates again: the lowest id wins; a loser withdraws and retries.
//!
//! Kept from the original: the table, the rule (lowest id wins), the settle time, the 300 s
//! staleness. Fixed where it cannot break exclusion with a Python process: every time decision
//! uses the host's clock; the deciding reads are sequentially consistent; Meltano's timeout and
//! retry settings are honoured; a candidate never wins over one that was established a settle
//! window before its own insert was acknowledged (a late insert yields, where the original would
//! let a lower id win); the lease can be renewed; the `locked` error names the holder.
//!
//! Not fixable without changing the table the Python backend uses: a background merge can
//! collapse candidates (they share the sort key), and a Python contender whose insert lands late
//! can still pick itself. There are no fencing tokens (the token is 0).

use serde::Serialize;

use super::{Attempt, LockHandle};
use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::exec::{Exec, Host};
use crate::http::Transport;
pub use crate::rows::Candidate;

#[derive(Serialize)]
struct CandidateRow<'a> {
    state_id: &'a str,
    lock_id: &'a str,
    locked_at: u64,
}

impl Candidate {
    fn info(&self, state_id: &str, lease_ms: u64) -> LockInfo {
        let acquired_at_ms = self.locked_at_s * 1000;
        LockInfo {
            state_id: state_id.to_string(),
            owner: self.lock_id.clone(),
            token: 0,
            acquired_at_ms,
            expires_at_ms: acquired_at_ms + lease_ms,
        }
    }
}

fn cutoff_s(now_ms: u64, lease_ms: u64) -> u64 {
    now_ms.saturating_sub(lease_ms) / 1000
}

/// A candidate that was in the table a whole settle window before ours was deciding, or had
/// decided, before ours existed: it goes first even with a higher id. `inserted_ms` is when our
/// insert was acknowledged, not when we began it: a candidate whose insert stalled must still
/// yield to a holder that decided while it was in flight, whose row is older than its
/// acknowledgement by more than a settle window (the original compared with the time before the
/// insert, and a late insert with a lower id won against the established holder).
pub fn established<'a>(
    all: &'a [Candidate],
    lock_id: &str,
    inserted_ms: u64,
    settle_ms: u64,
) -> Option<&'a Candidate> {
    // `locked_at` has whole seconds: a window of at least one second covers the rounding.
    let window = settle_ms.max(1000);
    all.iter()
        .find(|c| c.lock_id != lock_id && c.locked_at_s * 1000 + window <= inserted_ms)
}

/// Who goes first among `all` (sorted by id), for the candidate `lock_id` whose insert was
/// acknowledged at `inserted_ms`: an established candidate, else the lowest id. Pure, so that
/// the model checker (`model/`) runs it.
pub fn winner<'a>(
    all: &'a [Candidate],
    lock_id: &str,
    inserted_ms: u64,
    settle_ms: u64,
) -> Option<&'a Candidate> {
    established(all, lock_id, inserted_ms, settle_ms).or_else(|| all.first())
}

pub(crate) fn attempt<T: Transport, H: Host>(exec: &Exec<T, H>, state_id: &str) -> Result<Attempt> {
    let lease = exec.config.lock_lease_ms;
    let now = exec.host.now_ms();
    let cutoff = cutoff_s(now, lease);
    exec.run(&exec.sql.lock_delete_stale(state_id, cutoff))?;
    if let Some(holder) = candidates(exec, state_id, cutoff)?.into_iter().next() {
        return Ok(Attempt::Held(holder.info(state_id, lease)));
    }
    let lock_id = exec.new_token();
    insert(exec, state_id, &lock_id, now)?;
    // Our candidate exists from some moment before this one on; it may have landed long after
    // `now` (a stalled insert, a retry).
    let inserted = exec.host.now_ms();
    exec.host.sleep_ms(exec.config.lock_settle_ms);
    let all = candidates(exec, state_id, cutoff)?;
    match winner(&all, &lock_id, inserted, exec.config.lock_settle_ms) {
        Some(w) if w.lock_id == lock_id => Ok(Attempt::Granted(LockHandle {
            state_id: state_id.to_string(),
            owner: lock_id,
            token: 0,
            acquired_at_ms: now,
            lease_until_ms: now + lease,
            floor_ms: 0,
            last_written_ms: 0,
            mode: LockMode::Settle,
        })),
        other => {
            // Lost the draw: withdraw and let the winner go first.
            exec.run(&exec.sql.lock_delete(state_id, &lock_id))?;
            let info = other.map(|w| w.info(state_id, lease)).unwrap_or(LockInfo {
                state_id: state_id.to_string(),
                owner: "unknown".into(),
                token: 0,
                acquired_at_ms: now,
                expires_at_ms: now + lease,
            });
            Ok(Attempt::Held(info))
        }
    }
}

fn insert<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    state_id: &str,
    lock_id: &str,
    now_ms: u64,
) -> Result<()> {
    let row = CandidateRow {
        state_id,
        lock_id,
        locked_at: now_ms / 1000,
    };
    let mut data = serde_json::to_vec(&row)
        .map_err(|e| Error::InvalidInput(format!("cannot encode lock row: {e}")))?;
    data.push(b'\n');
    let token = format!("{lock_id}/{now_ms}");
    exec.run(&exec.sql.lock_insert(data, &token)).map(drop)
}

pub(crate) fn release<T: Transport, H: Host>(exec: &Exec<T, H>, lock: &LockHandle) -> Result<()> {
    exec.run(&exec.sql.lock_delete(&lock.state_id, &lock.owner))
        .map(drop)
}

/// A fresh row for our candidate id: the Python backend sees a live candidate and waits, and its
/// staleness check starts over.
pub(crate) fn renew<T: Transport, H: Host>(exec: &Exec<T, H>, lock: &mut LockHandle) -> Result<()> {
    let now = exec.host.now_ms();
    let lease = exec.config.lock_lease_ms;
    let still_ours = candidates(exec, &lock.state_id, cutoff_s(now, lease))?
        .iter()
        .any(|c| c.lock_id == lock.owner);
    if !still_ours || now >= lock.lease_until_ms {
        return Err(Error::LockLost(format!(
            "the lock on {:?} is no longer held (its candidate is gone or stale)",
            lock.state_id
        )));
    }
    insert(exec, &lock.state_id, &lock.owner, now)?;
    lock.lease_until_ms = now + lease;
    Ok(())
}

pub(crate) fn info<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    state_id: &str,
) -> Result<Option<LockInfo>> {
    let lease = exec.config.lock_lease_ms;
    let now = exec.host.now_ms();
    Ok(candidates(exec, state_id, cutoff_s(now, lease))?
        .first()
        .map(|c| c.info(state_id, lease)))
}

pub(crate) fn force_unlock<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    state_id: &str,
) -> Result<bool> {
    let held = info(exec, state_id)?.is_some();
    exec.run(&exec.sql.lock_delete_all(state_id))?;
    Ok(held)
}

fn candidates<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    state_id: &str,
    cutoff_s: u64,
) -> Result<Vec<Candidate>> {
    exec.fetch(&exec.sql.lock_candidates(state_id, cutoff_s))
}

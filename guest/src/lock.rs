//! The lock: the original backend's settle-then-decide protocol, on its `<table>_lock` table.
//!
//! 1. Remove candidates older than the 300 s lease and read the live ones; if any, wait.
//! 2. Insert a candidate with a fresh random id, then settle for 1 s (the host's sleep).
//! 3. Read the candidates again: the lowest id wins. A loser withdraws and retries.
//! 4. Give up after the lock timeout with a `locked` error that names the holder.
//!
//! Every time decision uses the host's clock. This protocol is known to be unsafe in corner
//! cases (a background merge can collapse candidates; a late insert can still win) and costs
//! the settle time on every lock; it is kept whole behind `acquire`/`release` so that a better
//! protocol can replace it without touching the rest.

use serde::{Deserialize, Serialize};

use crate::error::{Error, LockInfo, Result};
use crate::http::Transport;
use crate::store::{Host, Level, Store};

/// How long a candidate waits before deciding.
pub const SETTLE_MS: u64 = 1_000;
/// Candidates older than this are stale and removed.
pub const LEASE_MS: u64 = 300_000;

/// A granted lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHandle {
    pub state_id: String,
    pub lock_id: String,
    /// This protocol has no fencing tokens.
    pub token: u64,
    pub acquired_at_ms: u64,
}

#[derive(Deserialize)]
struct Candidate {
    lock_id: String,
    locked_at_s: u64,
}

#[derive(Serialize)]
struct CandidateRow<'a> {
    state_id: &'a str,
    lock_id: &'a str,
    locked_at: u64,
}

impl Candidate {
    fn info(&self, state_id: &str) -> LockInfo {
        let acquired_at_ms = self.locked_at_s * 1000;
        LockInfo {
            state_id: state_id.to_string(),
            owner: self.lock_id.clone(),
            token: 0,
            acquired_at_ms,
            expires_at_ms: acquired_at_ms + LEASE_MS,
        }
    }
}

pub fn acquire<T: Transport, H: Host>(store: &Store<T, H>, state_id: &str) -> Result<LockHandle> {
    let timeout_ms = store.config.lock_timeout_ms;
    let retry_ms = store.config.lock_retry_ms;
    let deadline = store.host.now_ms().saturating_add(timeout_ms);
    loop {
        let now = store.host.now_ms();
        let cutoff_s = now.saturating_sub(LEASE_MS) / 1000;
        store.run(&store.sql.lock_delete_stale(state_id, cutoff_s))?;
        let mut holder = candidates(store, state_id, cutoff_s)?.into_iter().next();
        if holder.is_none() {
            let lock_id = store.new_token();
            let row = CandidateRow {
                state_id,
                lock_id: &lock_id,
                locked_at: now / 1000,
            };
            let mut data = serde_json::to_vec(&row)
                .map_err(|e| Error::InvalidInput(format!("cannot encode lock row: {e}")))?;
            data.push(b'\n');
            store.run(&store.sql.lock_insert(data, &lock_id))?;
            store.host.sleep_ms(SETTLE_MS);
            let winner = candidates(store, state_id, cutoff_s)?.into_iter().next();
            match winner {
                Some(w) if w.lock_id == lock_id => {
                    store.host.log(
                        Level::Debug,
                        &format!("lock on {state_id:?} granted to {lock_id}"),
                    );
                    return Ok(LockHandle {
                        state_id: state_id.to_string(),
                        lock_id,
                        token: 0,
                        acquired_at_ms: now,
                    });
                }
                other => {
                    // Lost the draw: withdraw and let the winner go first.
                    store.run(&store.sql.lock_delete(state_id, &lock_id))?;
                    holder = other;
                }
            }
        }
        let now = store.host.now_ms();
        if now >= deadline {
            let info = holder.map(|h| h.info(state_id)).unwrap_or(LockInfo {
                state_id: state_id.to_string(),
                owner: "unknown".into(),
                token: 0,
                acquired_at_ms: 0,
                expires_at_ms: 0,
            });
            return Err(Error::Locked(info));
        }
        store.host.sleep_ms(retry_ms.min(deadline - now).max(1));
    }
}

pub fn release<T: Transport, H: Host>(store: &Store<T, H>, lock: &LockHandle) -> Result<()> {
    store
        .run(&store.sql.lock_delete(&lock.state_id, &lock.lock_id))
        .map(drop)
}

fn candidates<T: Transport, H: Host>(
    store: &Store<T, H>,
    state_id: &str,
    cutoff_s: u64,
) -> Result<Vec<Candidate>> {
    let body = store.run(&store.sql.lock_candidates(state_id, cutoff_s))?;
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            serde_json::from_slice(line).map_err(|e| {
                Error::Server(crate::error::ServerError {
                    code: 0,
                    name: "UNEXPECTED_RESPONSE".into(),
                    message: format!("cannot read a lock row: {e}"),
                })
            })
        })
        .collect()
}

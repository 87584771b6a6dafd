//! A lock's grant and what the lock remembers of an id between calls: the values the
//! fenced and settle machines decide on, and the fence on a write's version.

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::rows::NewestGeneration;

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
    pub followed: NewestGeneration,
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
    pub released: Option<NewestGeneration>,
    /// A claim whose fate is unknown (its read-back or a write under it failed): the claim may
    /// have won, so the next try looks in the log whether it did (see `fenced`).
    pub doubt: Option<Doubt>,
    /// The state this instance last wrote under a grant it then released: the basis of the
    /// next claim's first write (the guard refuses it if it is stale).
    pub last_written: Option<StoredRow>,
    /// Until then the id is shared with another instance (see [`Memory::shared`]).
    pub shared_until_ms: u64,
    /// A run holds the id through `kept` until it ends (see `lock::run` in the guest): the
    /// grant is kept after every update, renewed while idle, never given to a waiter, and a
    /// grant lost to another instance fails the update instead of being taken anew.
    pub run_hold: bool,
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

    /// Nothing is remembered: the id can be forgotten.
    pub fn is_empty(&self) -> bool {
        self == &Memory::default()
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

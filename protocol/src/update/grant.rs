//! A grant an update may write under, and the guard its writes carry.

use crate::grant::{LockHandle, StoredRow};
use crate::guard::Guard;
use crate::rows::NewestGeneration;

/// A grant an update may write under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    pub handle: LockHandle,
    /// The state the write merges into (partial, completed, version), none when none is stored.
    pub basis: Option<StoredRow>,
    /// The generation the claim replaced, while the claim is not yet confirmed (its first
    /// write confirms it); `None` once confirmed.
    pub claimed_after: Option<NewestGeneration>,
}

impl Grant {
    pub(super) fn basis_version(&self) -> u64 {
        self.basis.as_ref().map_or(0, |(_, _, v)| *v)
    }

    pub fn guard(&self) -> Guard {
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

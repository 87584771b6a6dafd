//! The guard of a state write under the fenced lock: what the server checks before the row
//! lands (the guest's `sql/guard.rs` is its SQL), and the same rule in Rust ([`admits`]).

use crate::fenced::all_mine;
use crate::rows::{Claim, NewestGeneration};

/// What a guarded state write requires when the server evaluates it: the lock's grant is the
/// newest generation, neither released nor forced open, and, while it is a claim not yet
/// confirmed, claimed by its owner alone, with the grant it replaced not renewed past
/// `previous_until` (`u64::MAX`: no such check); and the stored version is still
/// `expected_version` (what the write merged into: 0 for none). [`admits`] is the same rule in
/// Rust.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Guard {
    pub state_id: String,
    pub generation: u64,
    pub owner: String,
    /// The grant was confirmed (by an earlier write or read-back): a late rival claim on its
    /// generation, which lost, does not matter any more.
    pub confirmed: bool,
    pub previous_until: u64,
    pub expected_version: u64,
}

/// Whether a guarded write's condition holds (`Statements::write_guarded` evaluates it in the
/// server), from the newest generation of the id, the claims on the guard's generation and
/// the stored version: the grant is the newest, claimed by its owner alone, neither released
/// nor forced, while unconfirmed claimed by its owner alone and the generation it replaced not
/// renewed past `previous_until`, and what is stored is what the write merged into.
pub fn admits(
    guard: &Guard,
    newest: &NewestGeneration,
    claims: &[Claim],
    stored_version: u64,
) -> bool {
    stored_version == guard.expected_version
        && newest.generation == guard.generation
        && newest.released == 0
        && newest.forced == 0
        && (guard.confirmed || all_mine(claims, &guard.owner, guard.generation))
        && claims
            .first()
            .is_none_or(|c| c.previous_until <= guard.previous_until)
}

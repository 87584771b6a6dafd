//! The inserts every write ends in: rows of states, and tombstones for deletes, with their
//! origin for the history.

use super::{State, Store};
use crate::config::LockMode;
use crate::error::Result;
use crate::http::Transport;
use crate::session::Platform;
use crate::sql::Origin;

/// What a row of `insert` takes besides its texts, at most: the column names, the version and
/// the origin columns (about 200 bytes with the history on).
const ROW_OVERHEAD: usize = 512;

impl<T: Transport, H: Platform> Store<T, H> {
    /// Deletes the ids of `live` (each with the version stored), each by a tombstone above that
    /// version (see `bury`); in settle mode by the original's `DELETE`, with no version to take
    /// (so no read of the server's clock).
    pub(super) fn bury_above(&self, live: &[(&str, u64)], origin: &Origin<'_>) -> Result<()> {
        if self.session.config.lock_mode == LockMode::Settle {
            return self.bury(live, origin);
        }
        let now = self.clock_ms()?;
        let tombstones: Vec<(&str, u64)> = live
            .iter()
            .map(|(id, version)| (*id, now.max(version.saturating_add(1))))
            .collect();
        self.bury(&tombstones, origin)
    }

    /// One INSERT of tombstones, each at its version, under a fresh deduplication token; in
    /// settle mode, the original's delete of the ids' rows instead (see
    /// `Statements::delete_states`: the original would list a tombstone's id and read it as
    /// an empty state, and its next write, at the server's clock, could land below it).
    pub(super) fn bury(&self, tombstones: &[(&str, u64)], origin: &Origin<'_>) -> Result<()> {
        if self.session.config.lock_mode == LockMode::Settle {
            let ids: Vec<&str> = tombstones.iter().map(|(id, _)| *id).collect();
            return self
                .session
                .run(&self.session.sql.delete_states(&ids))
                .map(drop);
        }
        let mut data = Vec::with_capacity(tombstones.iter().map(|(id, _)| id.len() + 160).sum());
        let ids: Vec<&str> = tombstones.iter().map(|(id, _)| *id).collect();
        let seqs = self.session.ordinals(&ids)?;
        for ((state_id, version_ms), seq) in tombstones.iter().zip(seqs) {
            self.session
                .sql
                .encode_tombstone(state_id, *version_ms, origin, seq, &mut data)?;
        }
        let token = self.session.new_token();
        let lands = tombstones
            .iter()
            .map(|(id, version)| ((*id).to_string(), *version))
            .collect();
        self.session
            .insert(&self.session.sql.insert_states(data, &token).landing(lands))
    }

    pub(super) fn write(
        &self,
        states: &[State],
        version_ms: u64,
        origin: &Origin<'_>,
    ) -> Result<()> {
        let rows: Vec<(&State, u64)> = states.iter().map(|s| (s, version_ms)).collect();
        self.insert(&rows, origin)
    }

    /// One INSERT of JSON rows, each with its version, under a fresh deduplication token.
    pub(super) fn insert(&self, rows: &[(&State, u64)], origin: &Origin<'_>) -> Result<()> {
        let ids: Vec<&str> = rows.iter().map(|(s, _)| s.state_id.as_str()).collect();
        let seqs = self.session.ordinals(&ids)?;
        drop(ids);
        // The buffer is sized once, so that it never doubles (at 100,000 states a doubling is
        // tens of MiB of the instance's memory): each row's text as JSON escapes it, and what
        // the first row encoded took besides (names, version, origin), with room for longer
        // numbers. Only an estimate: a reservation that fails leaves the buffer to grow.
        let text =
            |s: &State| json_len(&s.partial) + json_len(&s.completed) + json_len(&s.state_id);
        let mut data = Vec::new();
        if let Some((first, _)) = rows.first() {
            let _ = data.try_reserve_exact(text(first).saturating_add(ROW_OVERHEAD));
        }
        for (index, ((state, version_ms), seq)) in rows.iter().zip(seqs).enumerate() {
            self.session
                .sql
                .encode_state(state.row(*version_ms), origin, seq, &mut data)?;
            if index == 0 {
                let besides = data.len().saturating_sub(text(state)).min(ROW_OVERHEAD) + 32;
                let rest = rows[1..]
                    .iter()
                    .fold(0usize, |sum, (s, _)| sum.saturating_add(text(s) + besides));
                let _ = data.try_reserve_exact(rest);
            }
        }
        let token = self.session.new_token();
        let lands = rows
            .iter()
            .map(|(state, version)| (state.state_id.clone(), *version))
            .collect();
        self.session
            .insert(&self.session.sql.insert_states(data, &token).landing(lands))
    }
}

/// The length of `text` as a JSON string's contents: serde_json writes `"`, `\` and the
/// control characters with a short escape (two bytes) or as `\u00XX` (six).
pub(super) fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

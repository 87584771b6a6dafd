//! Many states at once: listing, export (`get_all`), import (`set_all`) and `clear_all`.

use std::collections::HashMap;

use super::validate::validate_state;
use super::{State, Store};
use crate::error::Result;
use crate::glob;
use crate::http::Transport;
use crate::merge::or_empty;
use crate::session::Platform;
use crate::sql::Op;

impl<T: Transport, H: Platform> Store<T, H> {
    pub fn state_ids(&self, pattern: Option<&str>) -> Result<Vec<String>> {
        let filter = glob::filter(pattern)?;
        Ok(self
            .session
            .fetch(&self.session.sql.state_ids(&filter))?
            .into_iter()
            .map(|id| id.0)
            .collect())
    }

    pub fn get_all(&self, pattern: Option<&str>) -> Result<Vec<State>> {
        let filter = glob::filter(pattern)?;
        Ok(self
            .session
            .fetch(&self.session.sql.get_all(&filter))?
            .into_iter()
            .map(|row| State {
                state_id: row.state_id,
                partial: or_empty(Some(row.partial_state)),
                completed: or_empty(Some(row.completed_state)),
            })
            .collect())
    }

    /// One insert for all states; a state id given twice is written once, the last one wins.
    pub fn set_all(&self, states: &[State]) -> Result<u64> {
        for state in states {
            validate_state(state)?;
        }
        if states.is_empty() {
            return Ok(0);
        }
        // Each id's own newest version, so each write lands above it (one read, one insert).
        // The maps are dropped before the insert is encoded: at 100,000 states each is MiBs
        // of the instance's memory.
        let rows = {
            let mut last_index: HashMap<&str, usize> = HashMap::with_capacity(states.len());
            for (index, state) in states.iter().enumerate() {
                last_index.insert(&state.state_id, index);
            }
            let mut stored: HashMap<String, u64> = HashMap::new();
            for row in self.session.fetch(&self.session.sql.versions())? {
                stored.insert(row.state_id, row.version);
            }
            let now = self.clock_ms()?;
            states
                .iter()
                .enumerate()
                .filter(|(index, state)| last_index[state.state_id.as_str()] == *index)
                .map(|(_, s)| {
                    let above = stored.get(&s.state_id).map_or(0, |v| v.saturating_add(1));
                    (s, now.max(above))
                })
                .collect::<Vec<(&State, u64)>>()
        };
        self.insert(&rows, &self.origin(Op::SetAll))?;
        Ok(rows.len() as u64)
    }

    /// Deletes every live state, each by a tombstone above its version (as `delete`); returns
    /// how many.
    pub fn clear_all(&self) -> Result<u64> {
        let live = self.session.fetch(&self.session.sql.live_versions())?;
        let tombstones: Vec<(&str, u64)> = live
            .iter()
            .map(|row| (row.state_id.as_str(), row.version))
            .collect();
        if !tombstones.is_empty() {
            self.bury_above(&tombstones, &self.origin(Op::ClearAll))?;
        }
        Ok(tombstones.len() as u64)
    }
}

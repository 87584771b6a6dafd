//! Settle mode's statements, on the original backend's lock table.

use super::{Query, Read, Statements};
use crate::rows;

impl Statements {
    /// Removes candidates older than `cutoff_s` (unix seconds).
    pub fn lock_delete_stale(&self, state_id: &str, cutoff_s: u64) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE state_id = {{id:String}} AND locked_at < toDateTime({{cutoff:UInt32}})",
            self.lock
        ))
        .param("id", state_id)
        .param("cutoff", cutoff_s.to_string())
        .delete(true)
    }

    /// Live candidates, lowest lock id first, as JSONEachRow `{"lock_id", "locked_at_s"}`.
    pub fn lock_candidates(&self, state_id: &str, cutoff_s: u64) -> Read<rows::Candidate> {
        Query::new(format!(
            "SELECT lock_id, toUInt64(toUnixTimestamp(locked_at)) AS locked_at_s FROM {} \
             WHERE state_id = {{id:String}} AND locked_at >= toDateTime({{cutoff:UInt32}}) \
             ORDER BY lock_id FORMAT JSONEachRow",
            self.lock
        ))
        .param("id", state_id)
        .param("cutoff", cutoff_s.to_string())
        .deciding()
        .read()
    }

    /// Every candidate of an id (force-unlock).
    pub fn lock_delete_all(&self, state_id: &str) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE state_id = {{id:String}}",
            self.lock
        ))
        .param("id", state_id)
        .delete(true)
    }

    /// Inserts a candidate; `row` is one JSONEachRow line (`state_id`, `lock_id`, `locked_at`).
    pub fn lock_insert(&self, row: Vec<u8>, token: &str) -> Query {
        let mut query = Query::new(format!(
            "INSERT INTO {} (state_id, lock_id, locked_at) FORMAT JSONEachRow",
            self.lock
        ))
        .insert(token);
        query.data = Some(row.into());
        query
    }

    pub fn lock_delete(&self, state_id: &str, lock_id: &str) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE state_id = {{id:String}} AND lock_id = {{lock:String}}",
            self.lock
        ))
        .param("id", state_id)
        .param("lock", lock_id)
        .delete(true)
    }
}

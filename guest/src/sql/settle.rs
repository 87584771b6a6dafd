//! Settle mode's statements, on the original backend's lock table.

use super::{Query, Read, Statements};

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
    pub fn lock_candidates(
        &self,
        state_id: &str,
        cutoff_s: u64,
    ) -> Read<protocol::rows::Candidate> {
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

impl Statements {
    /// Deletes the rows of `ids` from the state table, as the original backend deletes: settle
    /// mode's delete, which the original then neither lists nor reads (a tombstone it would),
    /// and which leaves no version above the original's next write. The ids travel as one
    /// parameter, a JSON array; done on every replica before it returns.
    pub fn delete_states(&self, ids: &[&str]) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE has(JSONExtract({{ids:String}}, 'Array(String)'), state_id)",
            self.state
        ))
        .param("ids", serde_json::Value::from(ids).to_string())
        .delete(true)
    }

    /// The server's clock, unix milliseconds, one number: settle mode's versions, so that none
    /// of ours is above a write the original makes after it (the original's versions are the
    /// server's `now64(3)`).
    pub fn server_now(&self) -> Query {
        Query::new("SELECT toUnixTimestamp64Milli(now64(3))".to_string())
    }
}

//! The fenced protocol's statements on its lock log.

use super::{Query, Read, Statements};

impl Statements {
    /// The newest generation of an id, folded into one row (none when the id was never locked):
    /// `{"generation", "holder", "acquired_at", "lease_until", "grant_floor", "released",
    /// "release_cap", "forced", "wanted"}` (times in unix milliseconds).
    pub fn log_state(&self, state_id: &str) -> Read<protocol::rows::NewestGeneration> {
        Query::new(format!(
            "SELECT generation, {NEWEST_FOLD}, {wanted} FROM {log} WHERE state_id = {{id:String}} \
             AND generation = (SELECT max(generation) FROM {log} WHERE state_id = {{id:String}}) \
             GROUP BY generation FORMAT JSONEachRow",
            log = self.log,
            wanted = self.wanted_column()
        ))
        .param("id", state_id)
        .deciding()
        .read()
    }

    /// What an `update` needs before it claims, in one row: the newest generation as
    /// `log_state` folds it (generation 0 when the id was never locked) and the stored state
    /// (`"stored": [[partial, completed, version]]`, or `[]`).
    pub fn log_outlook(&self, state_id: &str) -> Read<protocol::rows::Outlook> {
        Query::new(format!(
            // No GROUP BY: one row even for an id never locked (its aggregates are zeros).
            // The table is aliased so that `l.generation` is the column, not the result.
            "SELECT max(l.generation) AS generation, {NEWEST_FOLD}, {wanted}{stored} FROM {log} AS l \
             WHERE l.state_id = {{id:String}} \
             AND l.generation = (SELECT max(generation) FROM {log} WHERE state_id = {{id:String}}) \
             FORMAT JSONEachRow",
            log = self.log,
            wanted = self.wanted_column(),
            stored = self.stored_column()
        ))
        .param("id", state_id)
        .deciding()
        .one_row_of_nothing()
        .read()
    }

    /// A column `wanted`: whether a waiter asked for the newest generation of `{id}` (a `want`
    /// row, in generation 0 with the generation it wants in `until_ms`; see `fenced::want`).
    /// The event is compared as text: a log created by an older version has no `want` value in
    /// its `Enum8`, and a literal of it there would fail the whole read.
    fn wanted_column(&self) -> String {
        format!(
            "(SELECT count() > 0 FROM {log} WHERE state_id = {{id:String}} AND generation = 0 \
             AND toString(event) = 'want' AND until_ms = (SELECT max(generation) FROM {log} \
             WHERE state_id = {{id:String}})) AS wanted",
            log = self.log
        )
    }

    /// A column `stored` with the stored state of `{id}`: `[[partial, completed, version]]`,
    /// or `[]`.
    fn stored_column(&self) -> String {
        format!(
            ", (SELECT groupArray(tuple(partial_state, completed_state, \
             toUnixTimestamp64Milli(updated_at))) FROM (SELECT partial_state, completed_state, \
             updated_at FROM {} FINAL WHERE state_id = {{id:String}} LIMIT 1)) AS stored",
            self.state
        )
    }

    /// Who asked for generation `generation` of an id, the newest generation now, and the lease
    /// end of the generation before it as the log has it now (renewals included):
    /// `{"owner", "at_ms", "until_ms", "newest", "previous_until"}` per acquire row. With `with_state`, each row
    /// also carries the stored state of the id (`"stored": [[partial, completed, version]]`, or
    /// `[]`), so that `update` reads it in the same round trip that confirms its claim.
    pub fn log_claims(
        &self,
        state_id: &str,
        generation: u64,
        with_state: bool,
    ) -> Read<protocol::rows::Claim> {
        let stored = if with_state {
            self.stored_column()
        } else {
            String::new()
        };
        Query::new(format!(
            "SELECT owner, at_ms, until_ms, \
             (SELECT max(generation) FROM {log} WHERE state_id = {{id:String}}) AS newest, \
             (SELECT maxIf(until_ms, event IN ('acquire', 'renew')) FROM {log} \
             WHERE state_id = {{id:String}} AND generation = {{previous:UInt64}}) AS previous_until{stored} \
             FROM {log} WHERE state_id = {{id:String}} AND generation = {{generation:UInt64}} \
             AND event = 'acquire' FORMAT JSONEachRow",
            log = self.log
        ))
        .param("id", state_id)
        .param("generation", generation.to_string())
        .param("previous", generation.saturating_sub(1).to_string())
        .deciding()
        .read()
    }

    /// Appends one row; `row` is a JSONEachRow line. `token` names the logical event, so a
    /// retry is deduplicated and two contenders for one generation cannot both land twice.
    pub fn log_insert(&self, row: Vec<u8>, token: &str) -> Query {
        let mut query = Query::new(format!(
            "INSERT INTO {} (state_id, generation, event, owner, at_ms, until_ms, floor_ms) FORMAT JSONEachRow",
            self.log
        ))
        .insert(token);
        query.data = Some(row.into());
        query
    }

    /// Drops the rows of generations older than `below` (they no longer decide anything).
    /// A want (in generation 0) goes with the generation it names: one for a generation still
    /// kept stays.
    pub fn log_prune(&self, state_id: &str, below: u64) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE state_id = {{id:String}} \
             AND if(generation = 0, until_ms, generation) < {{below:UInt64}}",
            self.log
        ))
        .param("id", state_id)
        .param("below", below.to_string())
        .delete(false)
    }
}

/// The folded columns of the newest generation (`log_state`, `log_outlook`).
pub(super) const NEWEST_FOLD: &str = "argMinIf(owner, at_ms, event = 'acquire') AS holder, \
     minIf(at_ms, event = 'acquire') AS acquired_at, \
     maxIf(until_ms, event IN ('acquire', 'renew')) AS lease_until, \
     maxIf(floor_ms, event = 'acquire') AS grant_floor, \
     countIf(event = 'release') > 0 AS released, \
     maxIf(until_ms, event = 'release') AS release_cap, \
     countIf(event = 'force') > 0 AS forced";

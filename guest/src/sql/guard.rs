//! The condition under which a state write under the fenced lock lands.

use super::{Query, Statements};

/// What a guarded state write requires when the server evaluates it: the lock's grant is the
/// newest generation, neither released nor forced open, and, while it is a claim not yet
/// confirmed, claimed by its owner alone, with the grant it replaced not renewed past
/// `previous_until` (`u64::MAX`: no such check); and the stored version is still
/// `expected_version` (what the write merged into: 0 for none). `lock::fenced::admits` is the
/// same rule in Rust.
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

/// The guard as an aggregate condition over the id's lock log (the statement's own table,
/// read `FROM log AS l WHERE state_id = {id:String}`), and the query carrying its parameters.
pub(super) fn guard_condition(statements: &Statements, guard: &Guard) -> (String, Query) {
    let condition = format!(
        "(SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {state} \
         WHERE state_id = {{id:String}}) = {{expected:UInt64}} \
         AND max(l.generation) = {{generation:UInt64}} \
         AND countIf(l.generation = {{generation:UInt64}} AND l.event IN ('release', 'force')) = 0 \
         AND ({{confirmed:UInt8}} = 1 OR (countIf(l.generation = {{generation:UInt64}} \
         AND l.event = 'acquire' AND l.owner = {{owner:String}}) > 0 \
         AND countIf(l.generation = {{generation:UInt64}} AND l.event = 'acquire' \
         AND l.owner != {{owner:String}}) = 0)) \
         AND maxIf(l.until_ms, l.generation = {{previous:UInt64}} AND l.event IN ('acquire', 'renew')) \
         <= {{previous_until:UInt64}}",
        state = statements.state,
    );
    let query = Query::new(String::new())
        .param("id", guard.state_id.clone())
        .param("expected", guard.expected_version.to_string())
        .param("generation", guard.generation.to_string())
        .param("owner", guard.owner.clone())
        .param("confirmed", u8::from(guard.confirmed).to_string())
        .param("previous", guard.generation.saturating_sub(1).to_string())
        .param("previous_until", guard.previous_until.to_string());
    (condition, query)
}

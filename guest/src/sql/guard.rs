//! The condition under which a state write under the fenced lock lands.

use super::{Query, Statements};
use protocol::guard::Guard;

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

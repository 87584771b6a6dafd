//! The state table's statements, and the rows they write.

use super::guard::guard_condition;
use super::history::{ORIGIN_COLUMNS, Origin, bind_origin};
use super::query::PARAMS_MAX_BYTES;
use super::{Query, Read, Statements};
use crate::glob::Filter;
use crate::rows;
use protocol::guard::Guard;
use protocol::role::Role;

impl Statements {
    /// One state, with its version: `{"partial_state", "completed_state", "updated_at_ms"}`
    /// (a deleted id's tombstone too: both parts NULL). A deciding read (`update` merges into it), so sequentially consistent.
    pub fn get(&self, state_id: &str) -> Read<rows::Stored> {
        Query::new(format!(
            "SELECT partial_state, completed_state, toUnixTimestamp64Milli(updated_at) AS updated_at_ms \
             FROM {} FINAL WHERE state_id = {{id:String}} LIMIT 1 FORMAT JSONEachRow",
            self.state
        ))
        .param("id", state_id)
        .deciding()
        .read()
    }

    /// The newest version stored for one id (0 when none), one number in TSV. Deciding: the
    /// next write's version must be above it.
    pub fn version_of(&self, state_id: &str) -> Query {
        Query::new(format!(
            "SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {} WHERE state_id = {{id:String}}",
            self.state
        ))
        .param("id", state_id)
        .deciding()
    }

    /// The newest version of every id, as JSONEachRow `{"state_id", "version"}`. Deciding, as
    /// `version_of`.
    pub fn versions(&self) -> Read<rows::Version> {
        Query::new(format!(
            "SELECT state_id, toUnixTimestamp64Milli(max(updated_at)) AS version FROM {} \
             GROUP BY state_id FORMAT JSONEachRow",
            self.state
        ))
        .deciding()
        .read()
    }

    /// Where a state write goes: the history (whose view passes it on to the state table) when
    /// it is on, else the state table; the columns it names; and how many tables a row lands in.
    fn write_target(&self) -> (&str, &'static str, u64) {
        match &self.history {
            Some(history) => (&history.table, ORIGIN_COLUMNS, 2),
            None => (&self.state, "", 1),
        }
    }

    /// The values of the write target's origin columns in an `INSERT ... SELECT` ("" with no
    /// history).
    fn origin_values(&self) -> String {
        self.history
            .as_ref()
            .map_or_else(String::new, |history| history.origin_values())
    }

    /// Writes rows given as JSONEachRow (encoded by [`Statements::encode_state`] and
    /// [`Statements::encode_tombstone`]). `token` makes the insert unique for insert
    /// deduplication: a retry of the same write reuses it, a new write never does. The caller
    /// names the rows' ids and versions with [`Query::landing`], for the session's check.
    pub fn insert_states(&self, rows: Vec<u8>, token: &str) -> Query {
        let (table, origin, fanout) = self.write_target();
        let mut query = Query::new(format!(
            "INSERT INTO {table} (state_id, partial_state, completed_state, updated_at{origin}) \
             FORMAT JSONEachRow"
        ))
        .insert(token)
        .fanned_out(fanout);
        query.data = Some(rows.into());
        query
    }

    /// Writes one state only if `guard` holds when the server evaluates it (see [`Guard`]):
    /// `written_rows` in the summary says whether it did. The state travels as query
    /// parameters, so this is for states up to [`PARAMS_MAX_BYTES`]; `guard_holds` is the
    /// same condition as a read, for larger ones.
    pub fn write_guarded(
        &self,
        state: StateRow<'_>,
        origin: &Origin<'_>,
        guard: &Guard,
        token: &str,
    ) -> Query {
        let (condition, query) = guard_condition(self, guard);
        let (table, columns, fanout) = self.write_target();
        let values = self.origin_values();
        // The id's lock log is the statement's own table and the guard its HAVING: one scalar
        // subquery fewer than a WHERE over two (about 2 ms of 20 on the local engine).
        let query = Query {
            sql: format!(
                "INSERT INTO {table} (state_id, partial_state, completed_state, updated_at{columns}) \
                 SELECT {{id:String}}, {{partial:String}}, {{completed:String}}, \
                 fromUnixTimestamp64Milli(toInt64({{version:UInt64}})){values} \
                 FROM {} AS l WHERE state_id = {{id:String}} HAVING {condition}",
                self.log
            ),
            ..query
        };
        self.bind_origin(state.bind(query), origin)
            .param("version", state.version_ms.to_string())
            .insert(token)
            .role(Role::GuardedInsert)
            .fanned_out(fanout)
            .one_row_of_nothing()
            .landing(vec![(state.state_id.to_string(), state.version_ms)])
    }

    /// Whether `guard` holds now, as one number (1 or 0): the guarded write's condition for a
    /// state too large for query parameters, which then goes as a plain insert.
    pub fn guard_holds(&self, guard: &Guard) -> Query {
        let (condition, query) = guard_condition(self, guard);
        Query {
            sql: format!(
                "SELECT toUInt8({condition}) FROM {} AS l WHERE state_id = {{id:String}}",
                self.log
            ),
            ..query
        }
        .deciding()
        .one_row_of_nothing()
    }

    /// Writes one state at its version unless something stored is at or above it (`set`, see
    /// `protocol::set`, whose `lands` is the same rule in Rust). Sent again, it lands at most once:
    /// its first landing put its version in the table, and merges keep an id's highest
    /// version. For states up to [`PARAMS_MAX_BYTES`].
    pub fn set_unless_newer(&self, state: StateRow<'_>, origin: &Origin<'_>, token: &str) -> Query {
        let (table, columns, fanout) = self.write_target();
        let values = self.origin_values();
        // An aggregate over the id's rows: with no rows it still gives one (`max` of nothing is
        // the epoch), which `one_row_of_nothing` makes sure of.
        let query = Query::new(format!(
            "INSERT INTO {table} (state_id, partial_state, completed_state, updated_at{columns}) \
             SELECT {{id:String}}, {{partial:String}}, {{completed:String}}, \
             fromUnixTimestamp64Milli(toInt64({{version:UInt64}})){values} \
             FROM {state} WHERE state_id = {{id:String}} \
             HAVING max(updated_at) < fromUnixTimestamp64Milli(toInt64({{version:UInt64}}))",
            state = self.state
        ))
        .param("id", state.state_id);
        self.bind_origin(state.bind(query), origin)
            .param("version", state.version_ms.to_string())
            .insert(token)
            .role(Role::GuardedInsert)
            .fanned_out(fanout)
            .one_row_of_nothing()
            .landing(vec![(state.state_id.to_string(), state.version_ms)])
    }

    /// Binds who wrote, when the history is on.
    fn bind_origin(&self, query: Query, origin: &Origin<'_>) -> Query {
        match self.history {
            Some(_) => bind_origin(query, origin),
            None => query,
        }
    }

    /// Appends a state row as a line of JSONEachRow for `insert_states`, with who wrote it and
    /// its ordinal (`seq`, see `history_seqs`; 0 with no count) when the history is on.
    pub fn encode_state(
        &self,
        row: StateRow<'_>,
        origin: &Origin<'_>,
        seq: u64,
        data: &mut Vec<u8>,
    ) -> crate::error::Result<()> {
        encode_row(
            JsonRow {
                state_id: row.state_id,
                partial_state: Some(row.partial),
                completed_state: Some(row.completed),
                updated_at: json_time(row.version_ms),
                origin: self.json_origin(origin, seq, row.version_ms),
            },
            data,
        )
    }

    /// Appends the tombstone of `state_id` at `version_ms` as a line of JSONEachRow for
    /// `insert_states`. A deleted id keeps its highest version as a row without parts, so that
    /// no write below it (a `set` sent again, see `protocol::set`) lands over the delete, and
    /// every write after it goes above. Reads skip it ([`LIVE`]); a merge keeps only it.
    pub fn encode_tombstone(
        &self,
        state_id: &str,
        version_ms: u64,
        origin: &Origin<'_>,
        seq: u64,
        data: &mut Vec<u8>,
    ) -> crate::error::Result<()> {
        encode_row(
            JsonRow {
                state_id,
                partial_state: None,
                completed_state: None,
                updated_at: json_time(version_ms),
                origin: self.json_origin(origin, seq, version_ms),
            },
            data,
        )
    }

    /// A JSON row's history columns, when the history is on.
    fn json_origin<'a>(
        &self,
        origin: &Origin<'a>,
        seq: u64,
        version_ms: u64,
    ) -> Option<JsonOrigin<'a>> {
        self.history.as_ref().map(|history| JsonOrigin {
            op: origin.op.name(),
            writer: origin.writer,
            lock_owner: origin.lock_owner,
            token: origin.token,
            seq,
            slot: history.slot(seq, version_ms),
        })
    }

    /// Matching live ids, sorted, as RowBinary.
    pub fn state_ids(&self, filter: &Filter) -> Read<rows::Id> {
        let (condition, query) = where_live(filter);
        Query {
            sql: format!(
                "SELECT state_id FROM {} FINAL{condition} ORDER BY state_id FORMAT RowBinary",
                self.state
            ),
            ..query
        }
        .where_after_final()
        .read_binary()
    }

    /// Matching live states, sorted by id, as RowBinary (id, partial, completed; NULL as empty).
    pub fn get_all(&self, filter: &Filter) -> Read<rows::ListedState> {
        let (condition, query) = where_live(filter);
        Query {
            sql: format!(
                "SELECT state_id, ifNull(partial_state, ''), ifNull(completed_state, '') \
                 FROM {} FINAL{condition} ORDER BY state_id FORMAT RowBinary",
                self.state
            ),
            ..query
        }
        .where_after_final()
        .read_binary()
    }

    /// The version of every live id, as JSONEachRow `{"state_id", "version"}`. Deciding: what
    /// `clear_all` deletes goes above it.
    pub fn live_versions(&self) -> Read<rows::Version> {
        Query::new(format!(
            "SELECT state_id, toUnixTimestamp64Milli(updated_at) AS version FROM {} FINAL \
             WHERE {LIVE} FORMAT JSONEachRow",
            self.state
        ))
        .where_after_final()
        .deciding()
        .read()
    }
}

/// A state row that is not a tombstone (a delete's row, both parts NULL; no writer of this
/// backend or of the original writes a NULL part).
pub const LIVE: &str = "NOT (partial_state IS NULL AND completed_state IS NULL)";

/// One state row to write, with its version.
#[derive(Debug, Clone, Copy)]
pub struct StateRow<'a> {
    pub state_id: &'a str,
    pub partial: &'a str,
    pub completed: &'a str,
    pub version_ms: u64,
}

/// A state row as a line of JSONEachRow for `insert_states` (parts `None`: a tombstone).
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    state_id: &'a str,
    partial_state: Option<&'a str>,
    completed_state: Option<&'a str>,
    /// See [`json_time`].
    updated_at: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    origin: Option<JsonOrigin<'a>>,
}

/// The history's columns of a row (see `history::Origin`).
#[derive(serde::Serialize)]
struct JsonOrigin<'a> {
    op: &'static str,
    writer: &'a str,
    lock_owner: &'a str,
    token: u64,
    seq: u64,
    slot: u64,
}

impl StateRow<'_> {
    /// Whether it is small enough for query parameters (see [`PARAMS_MAX_BYTES`]).
    pub fn fits_in_params(&self) -> bool {
        self.state_id.len() + self.partial.len() + self.completed.len() <= PARAMS_MAX_BYTES
    }

    /// Binds the parts; the id is bound by the guard's condition or by the caller.
    fn bind(&self, query: Query) -> Query {
        query
            .param("partial", self.partial)
            .param("completed", self.completed)
    }
}

/// Unix seconds with milliseconds, e.g. "1732895527.123": unambiguous in any server timezone.
fn json_time(version_ms: u64) -> String {
    format!("{}.{:03}", version_ms / 1000, version_ms % 1000)
}

fn encode_row(row: JsonRow<'_>, data: &mut Vec<u8>) -> crate::error::Result<()> {
    serde_json::to_writer(&mut *data, &row)
        .map_err(|e| crate::error::Error::InvalidInput(format!("cannot encode state: {e}")))?;
    data.push(b'\n');
    Ok(())
}

/// A `WHERE` clause for the ids `filter` matches whose newest row is not a tombstone (under
/// `FINAL`, with `where_after_final`).
fn where_live(filter: &Filter) -> (String, Query) {
    let query = Query::new(String::new());
    match filter {
        Filter::All => (format!(" WHERE {LIVE}"), query),
        Filter::Exact(id) => (
            format!(" WHERE state_id = {{pattern:String}} AND {LIVE}"),
            query.param("pattern", id.clone()),
        ),
        Filter::Match { prefix, regex } if prefix.is_empty() => (
            format!(" WHERE match(state_id, {{regex:String}}) AND {LIVE}"),
            query.param("regex", regex.clone()),
        ),
        Filter::Match { prefix, regex } => (
            format!(
                " WHERE startsWith(state_id, {{prefix:String}}) AND match(state_id, {{regex:String}}) \
                 AND {LIVE}"
            ),
            query
                .param("prefix", prefix.clone())
                .param("regex", regex.clone()),
        ),
    }
}

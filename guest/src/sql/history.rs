//! The history: an append-only table of every state this backend writes, which a materialized
//! view copies into the state table.
//!
//! A write goes to `<table>_history` with who wrote it and how; the view `<table>_history_to_state`
//! passes its state columns on to the state table within the same INSERT. So the history costs
//! no request, a write the guard refused writes no row to either table (the guarded INSERT's
//! SELECT gives none), and the state table stays the original backend's. ClickHouse writes the
//! source table's part before the view's: a write that reached the state table is in the
//! history; a server failing between the two leaves a history row whose write was not
//! acknowledged, which its retry writes again (reads show each version once).
//!
//! Retention is ClickHouse's: a TTL by age, and a count per id by slots. Each row has a slot,
//! the table's key after the id, and ReplacingMergeTree keeps the newest row of each slot. With
//! no count, a row's slot is its version, so nothing is replaced but a version written twice;
//! with a count N, a row's slot is its ordinal within the id (`seq`, one more than the id's
//! highest) modulo N, so a write replaces the version N before it. With a count, reads are
//! `FINAL`, so they show what merges will keep before they run; with none, the only rows a
//! merge replaces are a version written twice, which reads show once anyway.

use super::{Query, Read, Statements, quote_identifier};
use crate::config::Config;
use crate::rows;

/// How a state was written: the history's `op` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Set,
    Update,
    Delete,
    Clear,
    SetAll,
    ClearAll,
    Restore,
    ClearStream,
}

impl Op {
    /// Every operation with its name in the history and its Enum8 value (append only: the
    /// column's type is altered to add one, never to renumber).
    pub const ALL: [(Op, &'static str, i8); 8] = [
        (Op::Set, "set", 1),
        (Op::Update, "update", 2),
        (Op::Delete, "delete", 3),
        (Op::Clear, "clear", 4),
        (Op::SetAll, "set-all", 5),
        (Op::ClearAll, "clear-all", 6),
        (Op::Restore, "restore", 7),
        (Op::ClearStream, "clear-stream", 8),
    ];

    pub fn name(self) -> &'static str {
        Op::ALL
            .iter()
            .find(|(op, _, _)| *op == self)
            .map_or("set", |(_, name, _)| name)
    }
}

/// Who wrote a state and how, for its history row.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub op: Op,
    /// The writing instance (a random id per opened store).
    pub writer: &'a str,
    /// The lock grant's owner and fencing token, when the write was made under one ("", 0
    /// otherwise).
    pub lock_owner: &'a str,
    pub token: u64,
}

/// A point in a state's history: one version, or the newest version at or before a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    Version(u64),
    Time(u64),
}

/// The history's table and view, quoted, and its retention.
#[derive(Debug, Clone)]
pub(super) struct History {
    pub table: String,
    pub view: String,
    pub days: u32,
    /// Versions kept per id (0: no limit).
    pub versions: u32,
    pub view_name: String,
}

impl History {
    pub(super) fn of(config: &Config, schema: &str) -> Option<History> {
        config.history.then(|| History {
            table: format!("{schema}.{}", quote_identifier(&config.history_table())),
            view: format!("{schema}.{}", quote_identifier(&config.history_view())),
            days: config.history_days,
            versions: config.history_versions,
            view_name: config.history_view(),
        })
    }
}

/// The `op` column's type, from [`Op::ALL`].
fn op_type() -> String {
    let values: Vec<String> = Op::ALL
        .iter()
        .map(|(_, name, number)| format!("'{name}' = {number}"))
        .collect();
    format!("Enum8({})", values.join(", "))
}

/// The columns a write names when the history is on, after the state's own.
pub(super) const ORIGIN_COLUMNS: &str = ", op, writer, lock_owner, token, seq, slot";

impl History {
    /// The values of [`ORIGIN_COLUMNS`] in an `INSERT ... SELECT` of one state, bound by
    /// [`bind_origin`] and by the statement's `{id}` and `{version}`. With a count, the ordinal
    /// is read in the same statement: no request more.
    pub(super) fn origin_values(&self) -> String {
        let who = ", {op:String}, {writer:String}, {lock_owner:String}, {token:UInt64}";
        match self.versions {
            0 => format!("{who}, 0, {{version:UInt64}}"),
            n => {
                let next = format!(
                    "(SELECT max(seq) + 1 FROM {} WHERE state_id = {{id:String}})",
                    self.table
                );
                format!("{who}, {next}, {next} % {n}")
            }
        }
    }

    /// `FINAL` for reads when a count is kept (see the module's comment), else nothing.
    fn final_clause(&self) -> &'static str {
        if self.versions > 0 { " FINAL" } else { "" }
    }

    /// A row's slot: its version with no count, else its ordinal modulo the count.
    pub(super) fn slot(&self, seq: u64, version_ms: u64) -> u64 {
        match self.versions {
            0 => version_ms,
            n => seq % u64::from(n),
        }
    }
}

pub(super) fn bind_origin(query: Query, origin: &Origin<'_>) -> Query {
    query
        .param("op", origin.op.name())
        .param("writer", origin.writer)
        .param("lock_owner", origin.lock_owner)
        .param("token", origin.token.to_string())
}

/// The columns of a history row that the state table has too.
const STATE_COLUMNS: &str = "state_id, partial_state, completed_state, updated_at";

impl Statements {
    /// The history table, when the history is on: ordered by id and slot, so an id's versions
    /// are one range of the index, and ReplacingMergeTree by version, so a slot keeps its
    /// newest row. The TTL drops rows past `history_days` as parts merge. Unpartitioned, so
    /// that a slot's rows of different months meet in a merge.
    pub fn create_history_table(&self) -> Option<Query> {
        let history = self.history.as_ref()?;
        let mut settings = vec![];
        if !self.replicated {
            // As the lock log: a retried insert lands once on a single server too.
            settings.push("non_replicated_deduplication_window = 10000");
        }
        let settings = match settings.is_empty() {
            true => String::new(),
            false => format!(" SETTINGS {}", settings.join(", ")),
        };
        Some(Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (state_id String, partial_state Nullable(String), \
             completed_state Nullable(String), updated_at DateTime64(3), op {}, writer String, \
             lock_owner String, token UInt64, seq UInt64, slot UInt64) ENGINE = {} \
             ORDER BY (state_id, slot){}{settings}",
            history.table,
            self.on_cluster,
            op_type(),
            self.engine("ReplacingMergeTree", "updated_at"),
            history_ttl(history.days),
        )))
    }

    /// Sets the history's TTL to `history_days`, for a table made with another: applied as
    /// parts merge, not by rewriting them now. None when the history keeps every version, since
    /// ClickHouse refuses to remove a TTL a table does not have (`docs/history.md` says how to
    /// remove one by hand).
    pub fn alter_history_ttl(&self) -> Option<Query> {
        let history = self.history.as_ref().filter(|h| h.days > 0)?;
        // The setting in the statement, so that `migrate --print`'s copy is the same.
        Some(Query::new(format!(
            "ALTER TABLE {}{} MODIFY{} SETTINGS materialize_ttl_after_modify = 0",
            history.table,
            self.on_cluster,
            history_ttl(history.days)
        )))
    }

    /// The view that copies each history row into the state table, within the INSERT.
    pub fn create_history_view(&self) -> Option<Query> {
        let history = self.history.as_ref()?;
        Some(Query::new(format!(
            "CREATE MATERIALIZED VIEW IF NOT EXISTS {}{} TO {} AS SELECT {STATE_COLUMNS} FROM {}",
            history.view, self.on_cluster, self.state, history.table
        )))
    }

    /// Whether the history's view exists: one number, 1 or 0. A store whose history is on writes
    /// nowhere else, so it creates the view (`migrate`) before its first write when this is 0.
    pub fn history_view_exists(&self) -> Option<Query> {
        let history = self.history.as_ref()?;
        Some(
            Query::new(
                "SELECT count() FROM system.tables WHERE database = {schema:String} \
                 AND name = {view:String}"
                    .to_string(),
            )
            .param("schema", self.schema_name.clone())
            .param("view", history.view_name.clone()),
        )
    }

    /// The newest `limit` versions of one id, newest first (a version written twice, by a
    /// retry, once).
    pub fn history(&self, state_id: &str, limit: u32) -> Option<Read<rows::HistoryEntry>> {
        let history = self.history.as_ref()?;
        Some(
            Query::new(format!(
                "SELECT {ENTRY_COLUMNS} FROM {}{} WHERE state_id = {{id:String}} \
                 ORDER BY updated_at DESC LIMIT 1 BY updated_at LIMIT {{limit:UInt32}} \
                 FORMAT JSONEachRow",
                history.table,
                history.final_clause()
            ))
            .param("id", state_id)
            .param("limit", limit.to_string())
            .where_after_final()
            .deciding()
            .read(),
        )
    }

    /// The version of one id at `point`: that version exactly, or the newest at or before the
    /// time. No row when there is none.
    pub fn history_at(&self, state_id: &str, point: Point) -> Option<Read<rows::HistoryEntry>> {
        let history = self.history.as_ref()?;
        let (condition, at) = match point {
            Point::Version(v) => ("=", v),
            Point::Time(t) => ("<=", t),
        };
        Some(
            Query::new(format!(
                "SELECT {ENTRY_COLUMNS} FROM {}{} WHERE state_id = {{id:String}} \
                 AND updated_at {condition} fromUnixTimestamp64Milli(toInt64({{at:UInt64}})) \
                 ORDER BY updated_at DESC LIMIT 1 FORMAT JSONEachRow",
                history.table,
                history.final_clause()
            ))
            .param("id", state_id)
            .param("at", at.to_string())
            .where_after_final()
            .deciding()
            .read(),
        )
    }

    /// The highest ordinal of each of `ids` that the history has, as JSONEachRow
    /// `{"state_id", "seq"}`: where a JSON insert's rows go on from, when the history keeps a
    /// count (None otherwise: no ordinal is kept). The ids travel as one parameter, a JSON
    /// array (an `Array(String)` parameter is not unescaped as other parameters are), so a
    /// caller sends at most [`SEQ_IDS_MAX_BYTES`] of them at a time.
    pub fn history_seqs(&self, ids: &[&str]) -> Option<Read<rows::Seq>> {
        let history = self.history.as_ref().filter(|h| h.versions > 0)?;
        Some(
            Query::new(format!(
                "SELECT state_id, max(seq) AS seq FROM {} WHERE state_id IN \
                 (SELECT arrayJoin(JSONExtract({{ids:String}}, 'Array(String)'))) \
                 GROUP BY state_id FORMAT JSONEachRow",
                history.table
            ))
            .param("ids", serde_json::Value::from(ids).to_string())
            .deciding()
            .read(),
        )
    }

    /// How many versions of one id the history has, and its oldest and newest: one row, for
    /// an error that says what there is and for whether a time is in the future. Deciding, so
    /// that a write just made counts.
    pub fn history_extent(&self, state_id: &str) -> Option<Read<rows::HistoryExtent>> {
        let history = self.history.as_ref()?;
        Some(
            Query::new(format!(
                "SELECT count(DISTINCT updated_at) AS versions, \
                 toUnixTimestamp64Milli(min(updated_at)) AS oldest, \
                 toUnixTimestamp64Milli(max(updated_at)) AS newest \
                 FROM {}{} WHERE state_id = {{id:String}} FORMAT JSONEachRow",
                history.table,
                history.final_clause()
            ))
            .param("id", state_id)
            .one_row_of_nothing()
            .deciding()
            .read(),
        )
    }
}

impl Statements {
    /// Removes from the history the rows `writer` wrote of `rows` (each an id and a version):
    /// writes found to have reached the history and not the state table (see
    /// `crate::landing`), so that the history lists no version that no reader of the state
    /// saw. None with no history. The pairs travel as one parameter, a JSON array of
    /// `[id, version]` (versions as `Int64`, the type `toUnixTimestamp64Milli` gives); done on
    /// every replica before it returns.
    pub fn history_withdraw(&self, writer: &str, rows: &[(String, u64)]) -> Option<Query> {
        let history = self.history.as_ref()?;
        Some(
            Query::new(format!(
                // `has` over the bound array rather than `IN (SELECT ...)`: a replicated table
                // takes deterministic mutations only, and a subquery is not one.
                "DELETE FROM {} WHERE writer = {{writer:String}} AND \
                 has(JSONExtract({{rows:String}}, 'Array(Tuple(String, Int64))'), \
                 (state_id, toUnixTimestamp64Milli(updated_at)))",
                history.table
            ))
            .param("writer", writer)
            .param(
                "rows",
                serde_json::Value::from(
                    rows.iter()
                        .map(|(id, v)| serde_json::json!([id, v]))
                        .collect::<Vec<_>>(),
                )
                .to_string(),
            )
            .delete(true),
        )
    }
}

/// Ids per `history_seqs` request, at most, in bytes: as a guarded write's state, well within
/// the URL a server accepts.
pub const SEQ_IDS_MAX_BYTES: usize = super::query::PARAMS_MAX_BYTES;

/// The table's TTL clause, with its leading space ("" for none).
fn history_ttl(days: u32) -> String {
    match days {
        0 => String::new(),
        days => format!(" TTL toDateTime(updated_at) + INTERVAL {days} DAY"),
    }
}

/// What a history read returns of each version, by name (see `rows::HistoryEntry`).
const ENTRY_COLUMNS: &str = "toUnixTimestamp64Milli(updated_at) AS version, toString(op) AS op, \
     writer, lock_owner, token, partial_state, completed_state";

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
    pub view_name: String,
}

impl History {
    pub(super) fn of(config: &Config, schema: &str) -> Option<History> {
        config.history.then(|| History {
            table: format!("{schema}.{}", quote_identifier(&config.history_table())),
            view: format!("{schema}.{}", quote_identifier(&config.history_view())),
            days: config.history_days,
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
pub(super) const ORIGIN_COLUMNS: &str = ", op, writer, lock_owner, token";
/// The same as values of an `INSERT ... SELECT`, bound by [`bind_origin`].
pub(super) const ORIGIN_VALUES: &str =
    ", {op:String}, {writer:String}, {lock_owner:String}, {token:UInt64}";

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
    /// The history table, when the history is on. Plain MergeTree ordered by id and version, so
    /// an id's versions are one range of the index; the TTL drops rows past `history_days`,
    /// whole parts at a time (a month's partition ages out as one).
    pub fn create_history_table(&self) -> Option<Query> {
        let history = self.history.as_ref()?;
        let ttl = match history.days {
            0 => String::new(),
            days => format!(" TTL toDateTime(updated_at) + INTERVAL {days} DAY"),
        };
        let mut settings = vec!["ttl_only_drop_parts = 1"];
        if !self.replicated {
            // As the lock log: a retried insert lands once on a single server too.
            settings.push("non_replicated_deduplication_window = 10000");
        }
        Some(Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (state_id String, partial_state Nullable(String), \
             completed_state Nullable(String), updated_at DateTime64(3), op {}, writer String, \
             lock_owner String, token UInt64) ENGINE = {} PARTITION BY toYYYYMM(updated_at) \
             ORDER BY (state_id, updated_at){ttl} SETTINGS {}",
            history.table,
            self.on_cluster,
            op_type(),
            self.engine("MergeTree", ""),
            settings.join(", ")
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
                "SELECT {ENTRY_COLUMNS} FROM {} WHERE state_id = {{id:String}} \
                 ORDER BY updated_at DESC LIMIT 1 BY updated_at LIMIT {{limit:UInt32}} \
                 FORMAT JSONEachRow",
                history.table
            ))
            .param("id", state_id)
            .param("limit", limit.to_string())
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
                "SELECT {ENTRY_COLUMNS} FROM {} WHERE state_id = {{id:String}} \
                 AND updated_at {condition} fromUnixTimestamp64Milli(toInt64({{at:UInt64}})) \
                 ORDER BY updated_at DESC LIMIT 1 FORMAT JSONEachRow",
                history.table
            ))
            .param("id", state_id)
            .param("at", at.to_string())
            .deciding()
            .read(),
        )
    }

    /// How many versions of one id the history has, and its oldest and newest: one row, for
    /// an error that says what there is.
    pub fn history_extent(&self, state_id: &str) -> Option<Read<rows::HistoryExtent>> {
        let history = self.history.as_ref()?;
        Some(
            Query::new(format!(
                "SELECT count(DISTINCT updated_at) AS versions, \
                 toUnixTimestamp64Milli(min(updated_at)) AS oldest, \
                 toUnixTimestamp64Milli(max(updated_at)) AS newest \
                 FROM {} WHERE state_id = {{id:String}} FORMAT JSONEachRow",
                history.table
            ))
            .param("id", state_id)
            .one_row_of_nothing()
            .read(),
        )
    }
}

/// What a history read returns of each version, by name (see `rows::HistoryEntry`).
const ENTRY_COLUMNS: &str = "toUnixTimestamp64Milli(updated_at) AS version, toString(op) AS op, \
     writer, lock_owner, token, partial_state, completed_state";

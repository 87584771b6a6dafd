//! What `migrate` creates, per deployment kind, and the check of what exists.

use super::{Query, Read, Statements};
use protocol::rows::Event;

/// The lock log's `event` column type, from [`Event::ALL`].
fn event_type() -> String {
    let values: Vec<String> = Event::ALL
        .iter()
        .map(|(_, name, number)| format!("'{name}' = {number}"))
        .collect();
    format!("Enum8({})", values.join(", "))
}

/// Where a Replicated table keeps its replication log in Keeper: the server's default path,
/// written out (`{uuid}` is one UUID for all replicas under ON CLUSTER).
const REPLICA_PATH: &str = "'/clickhouse/tables/{uuid}/{shard}', '{replica}'";

impl Statements {
    /// Everything `migrate` creates, in order. On one server and on ClickHouse Cloud the
    /// statements are the same (Cloud makes every MergeTree a SharedMergeTree); with a
    /// `cluster`, they run ON CLUSTER with Replicated engines, so every replica has the tables
    /// and they share their rows.
    pub fn migration(&self) -> Vec<Query> {
        // The view after its table, and after the state table it writes to; the history's TTL as
        // set now, on a table made with another.
        [
            Some(self.create_schema()),
            Some(self.create_state_table()),
            Some(self.create_lock_table()),
            Some(self.create_lock_log_table()),
            self.create_history_table(),
            self.create_history_view(),
            self.alter_history_ttl(),
            Some(self.create_writers_table()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// `engine` with its arguments, Replicated on a cluster.
    pub(super) fn engine(&self, engine: &str, args: &str) -> String {
        match (self.replicated, args.is_empty()) {
            (false, true) => engine.to_string(),
            (false, false) => format!("{engine}({args})"),
            (true, true) => format!("Replicated{engine}({REPLICA_PATH})"),
            (true, false) => format!("Replicated{engine}({REPLICA_PATH}, {args})"),
        }
    }

    pub fn create_schema(&self) -> Query {
        Query::new(format!(
            "CREATE DATABASE IF NOT EXISTS {}{}",
            self.schema, self.on_cluster
        ))
    }

    /// The original backend's table (on one server exactly, so tables it created work
    /// unchanged).
    pub fn create_state_table(&self) -> Query {
        Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (state_id String, partial_state Nullable(String), \
             completed_state Nullable(String), updated_at DateTime64(3) DEFAULT now64(3)) \
             ENGINE = {} ORDER BY state_id",
            self.state,
            self.on_cluster,
            self.engine("ReplacingMergeTree", "updated_at")
        ))
    }

    /// The original backend's lock table.
    pub fn create_lock_table(&self) -> Query {
        Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (state_id String, lock_id String, \
             locked_at DateTime DEFAULT now()) ENGINE = {} \
             ORDER BY state_id TTL locked_at + INTERVAL 300 SECOND",
            self.lock,
            self.on_cluster,
            self.engine("ReplacingMergeTree", "locked_at")
        ))
    }

    /// The fenced protocol's append-only lock log. Plain MergeTree, so no merge ever collapses
    /// rows; every row is unique (state id, generation, event, owner). Deduplication by token
    /// (on by default on replicated and Cloud tables, atomic across replicas; switched on here
    /// for a single server) makes a retried insert land once.
    pub fn create_lock_log_table(&self) -> Query {
        let settings = if self.replicated {
            ""
        } else {
            " SETTINGS non_replicated_deduplication_window = 10000"
        };
        Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (state_id String, generation UInt64, \
             event {}, owner String, at_ms UInt64, until_ms UInt64, floor_ms UInt64) \
             ENGINE = {} ORDER BY (state_id, generation, event, owner){settings}",
            self.log,
            self.on_cluster,
            event_type(),
            self.engine("MergeTree", "")
        ))
    }

    /// 1 when the lock log exists and its `event` column lacks the `want` event (a log created
    /// by an older version), 0 otherwise (and when the user may not read `system.columns`).
    pub fn lock_log_lacks_want(&self) -> Query {
        Query::new(
            "SELECT count() FROM system.columns WHERE database = {schema:String} \
             AND table = {log:String} AND name = 'event' AND position(type, '''want''') = 0"
                .to_string(),
        )
        .param("schema", self.schema_name.clone())
        .param("log", self.table_names[2].clone())
    }

    /// Gives a lock log created by an older version every event of this one (Enum8 values added
    /// at the end: a change of metadata only).
    pub fn lock_log_events(&self) -> Query {
        Query::new(format!(
            "ALTER TABLE {}{} MODIFY COLUMN event {}",
            self.log,
            self.on_cluster,
            event_type()
        ))
    }

    /// What the deployment check needs, in one row: the engines of this store's tables, whether
    /// the server is configured as a replica (a `replica` macro), and the clusters it knows
    /// with their largest replica count, whether the server knows the `deduplicate_insert`
    /// setting, whether the history's view exists, and which of the settings `pinnable` it
    /// knows. `{"tables": [[name, engine]], "history_view", "replica_macro", "dedup_setting",
    /// "pinnable": [[name]], "clusters": [[name, replicas]]}`.
    pub fn deployment(&self, pinnable: &[&str]) -> Read<protocol::rows::Observation> {
        Query::new(
            "SELECT (SELECT groupArray(tuple(name, engine)) FROM system.tables \
             WHERE database = {schema:String} AND name IN ({t0:String}, {t1:String}, {t2:String}, {t3:String})) AS tables, \
             (SELECT count() FROM system.tables WHERE database = {schema:String} AND name = {view:String}) AS history_view, \
             (SELECT count() FROM system.macros WHERE macro = 'replica') > 0 AS replica_macro, \
             (SELECT count() FROM system.settings WHERE name = 'deduplicate_insert') > 0 AS dedup_setting, \
             (SELECT groupArray(tuple(name)) FROM system.settings \
             WHERE has(JSONExtract({pinnable:String}, 'Array(String)'), name)) AS pinnable, \
             (SELECT groupArray(tuple(cluster, replicas)) FROM (SELECT cluster, max(replica_num) AS replicas \
             FROM system.clusters GROUP BY cluster ORDER BY cluster)) AS clusters \
             FORMAT JSONEachRow"
                .to_string(),
        )
        .param("schema", self.schema_name.clone())
        .param("t0", self.table_names[0].clone())
        .param("t1", self.table_names[1].clone())
        .param("t2", self.table_names[2].clone())
        .param("t3", self.table_names[3].clone())
        .param("view", self.table_names[4].clone())
        .param("pinnable", serde_json::Value::from(pinnable).to_string())
        .read()
    }
}

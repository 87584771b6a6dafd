//! What `diagnose` reads: each statement writes nothing, and none creates the schema.

use super::{Query, Statements};

/// The most unreleased grants `diagnose` lists.
const UNRELEASED_MAX: u32 = 100;

impl Statements {
    /// The server, in one row: `{"version", "user", "now_ms", "readonly"}`.
    pub fn doctor_server(&self) -> Query {
        Query::new(
            "SELECT version() AS version, currentUser() AS user, \
             toUnixTimestamp64Milli(now64(3)) AS now_ms, \
             toUInt64(getSetting('readonly')) AS readonly FORMAT JSONEachRow"
                .to_string(),
        )
        .without_schema_creation()
    }

    /// The user's own grants (`SHOW GRANTS` needs no grant), one statement a row.
    pub fn doctor_grants(&self) -> Query {
        Query::new("SHOW GRANTS".to_string()).without_schema_creation()
    }

    /// This store's tables, in one row: `{"seen", "missing", "no_ttl"}`: each that exists with
    /// its engine, rows and active parts (`name (engine, N rows, N parts)`, joined by `; `),
    /// those of `names` that do not (joined by `, `), and whether the history's table (`names`'
    /// fourth, when there is one) has no TTL.
    pub fn doctor_tables(&self, names: &[String]) -> Query {
        Query::new(
            "SELECT arrayStringConcat(groupArray(line), '; ') AS seen, \
             arrayStringConcat(arrayFilter(n -> NOT has(groupArray(name), n), \
             JSONExtract({names:String}, 'Array(String)')), ', ') AS missing, \
             countIf(name = JSONExtract({names:String}, 4, 'String') \
             AND position(engine_full, 'TTL') = 0) AS no_ttl \
             FROM (SELECT t.name AS name, t.engine_full AS engine_full, \
             concat(t.name, ' (', t.engine, ', ', toString(ifNull(t.total_rows, 0)), ' rows, ', \
             toString(p.parts), ' parts)') AS line \
             FROM system.tables AS t LEFT JOIN (SELECT table, count() AS parts FROM system.parts \
             WHERE database = {schema:String} AND active GROUP BY table) AS p ON p.table = t.name \
             WHERE t.database = {schema:String} AND has(JSONExtract({names:String}, 'Array(String)'), t.name) \
             ORDER BY t.name) FORMAT JSONEachRow"
                .to_string(),
        )
        .param("schema", self.schema_name.clone())
        .param("names", serde_json::Value::from(names).to_string())
        .without_schema_creation()
    }

    /// Tries reading `table` (a qualified name from [`Statements::doctor_tables_written`]),
    /// reading no row.
    pub fn doctor_select(&self, table: &str) -> Query {
        Query::new(format!("SELECT 1 FROM {table} LIMIT 0")).without_schema_creation()
    }

    /// Tries writing `table`: an INSERT of no row, which the server checks as any INSERT and
    /// which stores nothing (no part, no deduplication entry, nothing through a view).
    pub fn doctor_insert(&self, table: &str) -> Query {
        Query::new(format!("INSERT INTO {table} SELECT * FROM {table} WHERE 0"))
            .without_schema_creation()
    }

    /// Tries creating a table: `IF NOT EXISTS` on the state table, which exists (the server
    /// checks the grant first), on this server only (`ON CLUSTER` would queue a DDL task on
    /// every replica).
    pub fn doctor_create(&self) -> Query {
        Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {} (state_id String) ENGINE = Memory",
            self.state
        ))
        .without_schema_creation()
    }

    /// This store's tables by kind, qualified: state, lock log, writers, and the history's
    /// table when it is on.
    pub fn doctor_tables_written(&self) -> Vec<(&'static str, String)> {
        let mut tables = vec![
            ("state", self.state.clone()),
            ("lock log", self.log.clone()),
            ("writers", self.writers.clone()),
        ];
        if let Some(history) = &self.history {
            tables.push(("history", history.table.clone()));
        }
        tables
    }

    /// The five ids with the most rows in the lock log, in one row: `{"listed", "largest"}`,
    /// `id: rows` joined by `, `, largest first, and the largest count.
    pub fn doctor_lock_log_rows(&self) -> Query {
        Query::new(format!(
            "SELECT arrayStringConcat(groupArray(concat(state_id, ': ', toString(rows))), ', ') \
             AS listed, max(rows) AS largest FROM (SELECT state_id, count() AS rows FROM {} \
             GROUP BY state_id ORDER BY rows DESC, state_id LIMIT 5) FORMAT JSONEachRow",
            self.log
        ))
        .without_schema_creation()
    }

    /// The newest generation of every id whose grant was neither released nor forced open
    /// (held, or lapsed unreleased), folded as `log_state` folds one: at most 100, the latest
    /// leases first, so that those held now come before those long lapsed.
    pub fn doctor_unreleased(&self) -> Query {
        Query::new(format!(
            "SELECT state_id, generation, {fold} FROM {log} WHERE generation > 0 \
             AND (state_id, generation) IN (SELECT state_id, max(generation) FROM {log} \
             WHERE generation > 0 GROUP BY state_id) GROUP BY state_id, generation \
             HAVING released = 0 AND forced = 0 ORDER BY lease_until DESC, state_id LIMIT {UNRELEASED_MAX} \
             FORMAT JSONEachRow",
            fold = super::lock_log::NEWEST_FOLD,
            log = self.log
        ))
        .without_schema_creation()
    }
}

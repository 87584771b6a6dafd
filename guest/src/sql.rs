//! Every statement the backend sends, in one place.
//!
//! Identifiers are validated by `config` and backtick-quoted here; every value travels as a
//! bound query parameter (`{name:Type}`), or as rows of JSON in an INSERT body. Nothing is ever
//! spliced into SQL text.

use std::marker::PhantomData;

use crate::config::Config;
use crate::glob::Filter;
use crate::rows;

/// One request to ClickHouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub sql: String,
    /// Query parameters, raw values; the HTTP client escapes them.
    pub params: Vec<(&'static str, String)>,
    /// Settings for this query only.
    pub settings: Vec<(&'static str, String)>,
    /// INSERT data. When present, the SQL travels in the URL and this in the body.
    pub data: Option<std::rc::Rc<[u8]>>,
    /// What the query does: the deployment adds the settings this role needs there (see
    /// `deployment::Consistency`).
    pub role: Role,
}

/// What a query does, as far as consistency goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// A read whose answer decides nothing (listing, counting, the schema check).
    #[default]
    Read,
    /// A read that decides something (who holds a lock, what to merge into): it must see every
    /// acknowledged write.
    Deciding,
    /// An INSERT: acknowledged only once stored where deciding reads see it, deduplicated by
    /// its token when retried.
    Insert,
    /// An `INSERT ... SELECT ... WHERE` whose condition reads what decides it (the lock log,
    /// the stored version): an insert and a deciding read at once.
    GuardedInsert,
    /// A DELETE (of the lock tables' rows).
    Mutation,
}

/// A read statement and the row type its answer decodes to (see `rows`).
pub struct Read<R> {
    pub query: Query,
    row: PhantomData<fn() -> R>,
}

impl Query {
    /// This query as a read of JSONEachRow rows of type `R`.
    fn read<R>(self) -> Read<R> {
        Read {
            query: self.json(),
            row: PhantomData,
        }
    }

    /// This query as a read of RowBinary rows of type `R`.
    fn read_binary<R>(self) -> Read<R> {
        Read {
            query: self,
            row: PhantomData,
        }
    }

    fn new(sql: String) -> Self {
        Query {
            sql,
            params: Vec::new(),
            settings: Vec::new(),
            data: None,
            role: Role::Read,
        }
    }

    fn param(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.params.push((name, value.into()));
        self
    }

    fn setting(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.settings.push((name, value.into()));
        self
    }

    fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// An INSERT; `token` names the logical write, so that a retry of it lands once.
    fn insert(self, token: &str) -> Self {
        self.role(Role::Insert)
            .setting("insert_deduplication_token", token)
    }

    /// A DELETE that returns once done on every replica (`sync`), or at once (best effort).
    fn delete(self, sync: bool) -> Self {
        let wait = if sync { "2" } else { "0" };
        self.role(Role::Mutation)
            .setting("mutations_sync", wait)
            .setting("lightweight_deletes_sync", wait)
    }

    /// Reads answer in JSONEachRow with 64-bit numbers unquoted (servers before 25.8 quote them).
    fn json(self) -> Self {
        self.setting("output_format_json_quote_64bit_integers", "0")
    }

    /// An aggregate without GROUP BY gives one row even over no rows, and `max` of nothing is
    /// the type's zero, not NULL: these statements count on both (a `set` of a new id, a guard
    /// over an empty log). A profile may have changed either, so the statement pins them.
    fn one_row_of_nothing(self) -> Self {
        self.setting("empty_result_for_aggregation_by_empty_set", "0")
            .setting("aggregate_functions_null_for_empty", "0")
    }

    /// A read whose `WHERE` on a non-key column must see each id's newest row only, so it runs
    /// after `FINAL`'s merge: a profile that moves it into `PREWHERE` would filter rows before
    /// the merge (a tombstone first, then the older live row wins), so the statement pins it.
    fn where_after_final(self) -> Self {
        self.setting("optimize_move_to_prewhere_if_final", "0")
    }

    /// A read that decides something (who holds a lock, what to merge into).
    fn deciding(self) -> Self {
        self.role(Role::Deciding)
    }
}

/// `name` in backticks. Names are validated identifiers already; escaping is belt and braces.
pub fn quote_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('`');
    for c in name.chars() {
        if c == '`' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('`');
    out
}

/// A query parameter value as ClickHouse's HTTP interface takes it: TSV-escaped, so `\` is sent
/// as `\\`, tab as `\t`, newline as `\n`.
pub fn escape_param(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// The statements of one configured store.
#[derive(Debug, Clone)]
pub struct Statements {
    schema: String,
    state: String,
    lock: String,
    log: String,
    /// ` ON CLUSTER `name`` when the schema lives on a self-managed replicated cluster.
    on_cluster: String,
    replicated: bool,
    /// The names the deployment check looks up (unquoted).
    schema_name: String,
    table_names: [String; 3],
}

/// Where a Replicated table keeps its replication log in Keeper: the server's default path,
/// written out (`{uuid}` is one UUID for all replicas under ON CLUSTER).
const REPLICA_PATH: &str = "'/clickhouse/tables/{uuid}/{shard}', '{replica}'";

impl Statements {
    pub fn new(config: &Config) -> Self {
        let schema = quote_identifier(&config.schema);
        Statements {
            state: format!("{schema}.{}", quote_identifier(&config.table)),
            lock: format!("{schema}.{}", quote_identifier(&config.lock_table())),
            log: format!("{schema}.{}", quote_identifier(&config.lock_log_table())),
            schema,
            on_cluster: config
                .cluster
                .as_deref()
                .map(|c| format!(" ON CLUSTER {}", quote_identifier(c)))
                .unwrap_or_default(),
            replicated: config.cluster.is_some(),
            schema_name: config.schema.clone(),
            table_names: [
                config.table.clone(),
                config.lock_table(),
                config.lock_log_table(),
            ],
        }
    }

    // -- schema --

    /// Everything `migrate` creates, in order. On one server and on ClickHouse Cloud the
    /// statements are the same (Cloud makes every MergeTree a SharedMergeTree); with a
    /// `cluster`, they run ON CLUSTER with Replicated engines, so every replica has the tables
    /// and they share their rows.
    pub fn migration(&self) -> Vec<Query> {
        vec![
            self.create_schema(),
            self.create_state_table(),
            self.create_lock_table(),
            self.create_lock_log_table(),
        ]
    }

    /// `engine` with its arguments, Replicated on a cluster.
    fn engine(&self, engine: &str, args: &str) -> String {
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
             event Enum8('acquire' = 1, 'renew' = 2, 'release' = 3, 'force' = 4), \
             owner String, at_ms UInt64, until_ms UInt64, floor_ms UInt64) \
             ENGINE = {} ORDER BY (state_id, generation, event, owner){settings}",
            self.log,
            self.on_cluster,
            self.engine("MergeTree", "")
        ))
    }

    /// What the deployment check needs, in one row: the engines of this store's tables, whether
    /// the server is configured as a replica (a `replica` macro), and the clusters it knows
    /// with their largest replica count, and whether the server knows the `deduplicate_insert`
    /// setting. `{"tables": [[name, engine]], "replica_macro", "dedup_setting",
    /// "clusters": [[name, replicas]]}`.
    pub fn deployment(&self) -> Read<rows::Observed> {
        Query::new(
            "SELECT (SELECT groupArray(tuple(name, engine)) FROM system.tables \
             WHERE database = {schema:String} AND name IN ({t0:String}, {t1:String}, {t2:String})) AS tables, \
             (SELECT count() FROM system.macros WHERE macro = 'replica') > 0 AS replica_macro, \
             (SELECT count() FROM system.settings WHERE name = 'deduplicate_insert') > 0 AS dedup_setting, \
             (SELECT groupArray(tuple(cluster, replicas)) FROM (SELECT cluster, max(replica_num) AS replicas \
             FROM system.clusters GROUP BY cluster ORDER BY cluster)) AS clusters \
             FORMAT JSONEachRow"
                .to_string(),
        )
        .param("schema", self.schema_name.clone())
        .param("t0", self.table_names[0].clone())
        .param("t1", self.table_names[1].clone())
        .param("t2", self.table_names[2].clone())
        .read()
    }

    // -- states --

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

    /// Writes rows given as JSONEachRow (`state_id`, `partial_state`, `completed_state`,
    /// `updated_at` as unix seconds with milliseconds). `token` makes the insert unique for
    /// insert deduplication: a retry of the same write reuses it, a new write never does.
    pub fn insert_states(&self, rows: Vec<u8>, token: &str) -> Query {
        let mut query = Query::new(format!(
            "INSERT INTO {} (state_id, partial_state, completed_state, updated_at) FORMAT JSONEachRow",
            self.state
        ))
        .insert(token);
        query.data = Some(rows.into());
        query
    }

    /// Writes one state only if `guard` holds when the server evaluates it (see [`Guard`]):
    /// `written_rows` in the summary says whether it did. The state travels as query
    /// parameters, so this is for states up to [`GUARDED_MAX_BYTES`]; `guard_holds` is the
    /// same condition as a read, for larger ones.
    pub fn write_guarded(&self, state: StateRow<'_>, guard: &Guard, token: &str) -> Query {
        let (condition, query) = guard_condition(self, guard);
        // The id's lock log is the statement's own table and the guard its HAVING: one scalar
        // subquery fewer than a WHERE over two (about 2 ms of 20 on the local engine).
        let query = Query {
            sql: format!(
                "INSERT INTO {} (state_id, partial_state, completed_state, updated_at) \
                 SELECT {{id:String}}, {{partial:String}}, {{completed:String}}, \
                 fromUnixTimestamp64Milli(toInt64({{version:UInt64}})) \
                 FROM {} AS l WHERE state_id = {{id:String}} HAVING {condition}",
                self.state, self.log
            ),
            ..query
        };
        state
            .bind(query)
            .param("version", state.version_ms.to_string())
            .insert(token)
            .role(Role::GuardedInsert)
            .one_row_of_nothing()
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
    /// `crate::set`, whose `lands` is the same rule in Rust). Sent again, it lands at most once:
    /// its first landing put its version in the table, and merges keep an id's highest
    /// version. For states up to [`GUARDED_MAX_BYTES`].
    pub fn set_unless_newer(&self, state: StateRow<'_>, token: &str) -> Query {
        // An aggregate over the id's rows: with no rows it still gives one (`max` of nothing is
        // the epoch), which `one_row_of_nothing` makes sure of.
        let query = Query::new(format!(
            "INSERT INTO {state} (state_id, partial_state, completed_state, updated_at) \
             SELECT {{id:String}}, {{partial:String}}, {{completed:String}}, \
             fromUnixTimestamp64Milli(toInt64({{version:UInt64}})) \
             FROM {state} WHERE state_id = {{id:String}} \
             HAVING max(updated_at) < fromUnixTimestamp64Milli(toInt64({{version:UInt64}}))",
            state = self.state
        ))
        .param("id", state.state_id);
        state
            .bind(query)
            .param("version", state.version_ms.to_string())
            .insert(token)
            .role(Role::GuardedInsert)
            .one_row_of_nothing()
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
    pub fn get_all(&self, filter: &Filter) -> Read<rows::Listed> {
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

    // -- the original backend's lock --

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

    // -- the fenced protocol's lock log --

    /// The newest generation of an id, folded into one row (none when the id was never locked):
    /// `{"generation", "holder", "acquired_at", "lease_until", "grant_floor", "released",
    /// "release_cap", "forced"}` (times in unix milliseconds).
    pub fn log_state(&self, state_id: &str) -> Read<rows::Newest> {
        Query::new(format!(
            "SELECT generation, {NEWEST_FOLD} FROM {log} WHERE state_id = {{id:String}} \
             AND generation = (SELECT max(generation) FROM {log} WHERE state_id = {{id:String}}) \
             GROUP BY generation FORMAT JSONEachRow",
            log = self.log
        ))
        .param("id", state_id)
        .deciding()
        .read()
    }

    /// What an `update` needs before it claims, in one row: the newest generation as
    /// `log_state` folds it (generation 0 when the id was never locked) and the stored state
    /// (`"stored": [[partial, completed, version]]`, or `[]`).
    pub fn log_outlook(&self, state_id: &str) -> Read<rows::Outlook> {
        Query::new(format!(
            // No GROUP BY: one row even for an id never locked (its aggregates are zeros).
            // The table is aliased so that `l.generation` is the column, not the result.
            "SELECT max(l.generation) AS generation, {NEWEST_FOLD}{stored} FROM {log} AS l \
             WHERE l.state_id = {{id:String}} \
             AND l.generation = (SELECT max(generation) FROM {log} WHERE state_id = {{id:String}}) \
             FORMAT JSONEachRow",
            log = self.log,
            stored = self.stored_column()
        ))
        .param("id", state_id)
        .deciding()
        .one_row_of_nothing()
        .read()
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
    ) -> Read<rows::Claim> {
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
    pub fn log_prune(&self, state_id: &str, below: u64) -> Query {
        Query::new(format!(
            "DELETE FROM {} WHERE state_id = {{id:String}} AND generation < {{below:UInt64}}",
            self.log
        ))
        .param("id", state_id)
        .param("below", below.to_string())
        .delete(false)
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

/// ` WHERE ...` for a filter, and a query carrying its parameters.
/// The folded columns of the newest generation (`log_state`, `log_outlook`).
const NEWEST_FOLD: &str = "argMinIf(owner, at_ms, event = 'acquire') AS holder, \
     minIf(at_ms, event = 'acquire') AS acquired_at, \
     maxIf(until_ms, event IN ('acquire', 'renew')) AS lease_until, \
     maxIf(floor_ms, event = 'acquire') AS grant_floor, \
     countIf(event = 'release') > 0 AS released, \
     maxIf(until_ms, event = 'release') AS release_cap, \
     countIf(event = 'force') > 0 AS forced";

/// A state row that is not a tombstone (a delete's row, both parts NULL; no writer of this
/// backend or of the original writes a NULL part).
pub const LIVE: &str = "NOT (partial_state IS NULL AND completed_state IS NULL)";

/// Largest state (id, partial and completed together, in bytes) a guarded write or a one-trip
/// `set` sends as query parameters. They travel in the URL, which servers cap (1 MiB by
/// default, after percent-encoding, which can triple JSON); larger states take two round trips.
pub const GUARDED_MAX_BYTES: usize = 64 * 1024;

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
}

impl StateRow<'_> {
    /// Appends this row as a line of JSONEachRow (see `insert_states`).
    pub fn encode(&self, data: &mut Vec<u8>) -> crate::error::Result<()> {
        encode_row(
            JsonRow {
                state_id: self.state_id,
                partial_state: Some(self.partial),
                completed_state: Some(self.completed),
                updated_at: json_time(self.version_ms),
            },
            data,
        )
    }

    /// Whether it is small enough for query parameters (see [`GUARDED_MAX_BYTES`]).
    pub fn fits_in_params(&self) -> bool {
        self.state_id.len() + self.partial.len() + self.completed.len() <= GUARDED_MAX_BYTES
    }

    /// Binds the parts; the id is bound by the guard's condition or by the caller.
    fn bind(&self, query: Query) -> Query {
        query
            .param("partial", self.partial)
            .param("completed", self.completed)
    }
}

/// Appends the tombstone of `state_id` at `version_ms` as a line of JSONEachRow for
/// `insert_states`. A deleted id keeps its highest version as a row without parts, so that no
/// write below it (a `set` sent again, see `crate::set`) lands over the delete, and every
/// write after it goes above. Reads skip it ([`LIVE`]); a merge keeps only it.
pub fn encode_tombstone(
    state_id: &str,
    version_ms: u64,
    data: &mut Vec<u8>,
) -> crate::error::Result<()> {
    encode_row(
        JsonRow {
            state_id,
            partial_state: None,
            completed_state: None,
            updated_at: json_time(version_ms),
        },
        data,
    )
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
fn guard_condition(statements: &Statements, guard: &Guard) -> (String, Query) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn statements() -> Statements {
        let config = Config::parse(
            "clickhouse://u@h/db",
            &[("table".into(), "my_state".into())],
        )
        .expect("valid");
        Statements::new(&config)
    }

    /// Every read that decides something is sent as deciding, so that a cluster or Cloud gives it
    /// the settings that make it see every acknowledged write (one server ignores them, so no
    /// integration test here would notice one missing); every write is sent as what it is.
    #[test]
    fn each_statement_is_sent_in_its_consistency_role() {
        let s = statements();
        let row = StateRow {
            state_id: "a",
            partial: "{}",
            completed: "{}",
            version_ms: 1,
        };
        let guard = Guard {
            state_id: "a".into(),
            generation: 2,
            owner: "me".into(),
            confirmed: false,
            previous_until: 1,
            expected_version: 0,
        };
        let deciding = [
            ("get", s.get("a").query),
            ("version_of", s.version_of("a")),
            ("versions", s.versions().query),
            ("guard_holds", s.guard_holds(&guard)),
            ("log_state", s.log_state("a").query),
            ("log_outlook", s.log_outlook("a").query),
            ("log_claims", s.log_claims("a", 2, false).query),
            ("log_claims with state", s.log_claims("a", 2, true).query),
            ("lock_candidates", s.lock_candidates("a", 0).query),
        ];
        for (name, query) in deciding {
            assert_eq!(query.role, Role::Deciding, "{name}");
        }
        let guarded = [
            ("write_guarded", s.write_guarded(row, &guard, "t")),
            ("set_unless_newer", s.set_unless_newer(row, "t")),
        ];
        for (name, query) in guarded {
            assert_eq!(query.role, Role::GuardedInsert, "{name}");
        }
        // The guard is the condition of the write and of its read-only twin, over the log.
        let (condition, _) = guard_condition(&s, &guard);
        let write = s.write_guarded(row, &guard, "t").sql;
        assert!(write.starts_with("INSERT INTO"), "{write}");
        assert!(write.ends_with(&format!("HAVING {condition}")), "{write}");
        let holds = s.guard_holds(&guard).sql;
        assert!(
            holds.starts_with(&format!("SELECT toUInt8({condition})")),
            "{holds}"
        );
        let inserts = [
            ("insert_states", s.insert_states(b"{}".to_vec(), "t")),
            ("log_insert", s.log_insert(b"{}".to_vec(), "t")),
            ("lock_insert", s.lock_insert(b"{}".to_vec(), "t")),
        ];
        for (name, query) in inserts {
            assert_eq!(query.role, Role::Insert, "{name}");
        }
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_identifier("state"), "`state`");
        assert_eq!(quote_identifier("a`b\\c"), "`a\\`b\\\\c`");
        let s = statements();
        assert!(s.create_state_table().sql.contains("`meltano`.`my_state`"));
        assert!(
            s.create_lock_table()
                .sql
                .contains("`meltano`.`my_state_lock`")
        );
    }

    #[test]
    fn the_schema_per_deployment_kind() {
        // One server and ClickHouse Cloud: the original backend's DDL (Cloud makes it Shared).
        let single: Vec<String> = statements()
            .migration()
            .into_iter()
            .map(|q| q.sql)
            .collect();
        assert_eq!(single.len(), 4);
        assert!(
            single
                .iter()
                .all(|s| !s.contains("ON CLUSTER") && !s.contains("Replicated"))
        );
        assert!(single[1].contains("ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id"));
        assert!(single[3].contains("non_replicated_deduplication_window"));
        // A self-managed cluster: ON CLUSTER, Replicated engines on one Keeper path per table.
        let config = Config::parse(
            "clickhouse://u@h/db",
            &[("cluster".to_string(), "prod".to_string())],
        )
        .unwrap();
        let cluster: Vec<String> = Statements::new(&config)
            .migration()
            .into_iter()
            .map(|q| q.sql)
            .collect();
        assert_eq!(
            cluster[0],
            "CREATE DATABASE IF NOT EXISTS `meltano` ON CLUSTER `prod`"
        );
        assert!(
            cluster
                .iter()
                .all(|s| s.contains(" ON CLUSTER `prod` ") || s.ends_with(" ON CLUSTER `prod`"))
        );
        assert!(cluster[1].contains(
            "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', updated_at)"
        ));
        assert!(cluster[2].contains(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', locked_at)"
        ));
        assert!(cluster[3].contains(
            "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY"
        ));
        assert!(!cluster[3].contains("non_replicated_deduplication_window"));
    }

    #[test]
    fn params_are_tsv_escaped() {
        assert_eq!(escape_param("a\\b\tc\nd'e\"f"), "a\\\\b\\tc\\nd'e\"f");
        assert_eq!(escape_param("\\N"), "\\\\N");
        assert_eq!(escape_param("✓"), "✓");
    }

    #[test]
    fn values_are_bound_not_spliced() {
        let s = statements();
        let id = "x' OR 1=1 --";
        for q in [s.get(id).query, s.version_of(id), s.lock_delete(id, id)] {
            assert!(!q.sql.contains(id), "{}", q.sql);
            assert!(q.params.iter().any(|(_, v)| v == id));
        }
        let q = s.state_ids(&Filter::Exact(id.into())).query;
        assert!(!q.sql.contains(id));
        assert_eq!(q.params, vec![("pattern", id.to_string())]);
    }

    #[test]
    fn filters_become_conditions() {
        let s = statements();
        let all = s.state_ids(&Filter::All).query.sql;
        assert!(
            all.contains(&format!("FINAL WHERE {LIVE} ORDER BY")),
            "{all}"
        );
        let exact = s.state_ids(&Filter::Exact("dev:x".into())).query;
        assert!(exact.sql.starts_with("SELECT"), "{}", exact.sql);
        assert!(exact.sql.contains("WHERE state_id = {pattern:String}"));
        let q = s
            .get_all(&Filter::Match {
                prefix: "dev:".into(),
                regex: "(?s)^dev:.*$".into(),
            })
            .query;
        assert!(
            q.sql.contains(
                "startsWith(state_id, {prefix:String}) AND match(state_id, {regex:String})"
            )
        );
        let q = s
            .get_all(&Filter::Match {
                prefix: String::new(),
                regex: "(?s)^.*x$".into(),
            })
            .query;
        assert!(!q.sql.contains("startsWith"));
    }

    #[test]
    fn writes_are_synchronous_and_tokened() {
        let s = statements();
        let q = s.insert_states(b"{}\n".to_vec(), "tok-1");
        // synchronous and deduplicated by the deployment's settings for inserts
        assert_eq!(q.role, Role::Insert);
        assert!(
            q.settings
                .contains(&("insert_deduplication_token", "tok-1".into()))
        );
        assert_eq!(q.data.as_deref(), Some(&b"{}\n"[..]));
    }
}

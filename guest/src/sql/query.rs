//! A statement as sent: its SQL, bound parameters, settings, body and consistency role; and
//! the quoting of identifiers and parameter values.

use std::marker::PhantomData;

use protocol::role::Role;

/// Largest value (in bytes, all of a statement's together) sent as query parameters: a guarded
/// write's or a one-trip `set`'s state, a batch of ids. They travel in the URL, which servers
/// cap (1 MiB by default, after percent-encoding, which can triple JSON); larger states take
/// two round trips.
pub const PARAMS_MAX_BYTES: usize = 64 * 1024;

/// One request to ClickHouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub sql: String,
    /// Query parameters, raw values; the HTTP client escapes them.
    pub params: Vec<(&'static str, String)>,
    /// Settings for this query only.
    pub settings: Vec<(&'static str, String)>,
    /// INSERT data. When present, the SQL travels in the URL and this in the body.
    pub data: Option<std::rc::Rc<Vec<u8>>>,
    /// What the query does: the deployment adds the settings this role needs there (see
    /// `protocol::deployment::Consistency`).
    pub role: Role,
    /// How many tables each row an INSERT writes lands in (the history and, through its view,
    /// the state table): `written_rows` counts them all.
    pub fanout: u64,
    /// The state rows an INSERT writes, each its id and version: what the session checks it
    /// wrote against (see `crate::landing`). Empty for other statements.
    pub lands: Vec<(String, u64)>,
    /// A missing table makes the session create the schema and send this again (most
    /// statements); a read of what may not exist, and need not, fails instead.
    pub creates_schema: bool,
}

/// A read statement and the row type its answer decodes to (see `rows`).
pub struct Read<R> {
    pub query: Query,
    row: PhantomData<fn() -> R>,
}

impl Query {
    /// This query as a read of JSONEachRow rows of type `R`.
    pub(super) fn read<R>(self) -> Read<R> {
        Read {
            query: self.json(),
            row: PhantomData,
        }
    }

    /// This query as a read of RowBinary rows of type `R`.
    pub(super) fn read_binary<R>(self) -> Read<R> {
        Read {
            query: self,
            row: PhantomData,
        }
    }

    pub(super) fn new(sql: String) -> Self {
        Query {
            sql,
            params: Vec::new(),
            settings: Vec::new(),
            data: None,
            role: Role::Read,
            fanout: 1,
            lands: Vec::new(),
            creates_schema: true,
        }
    }

    /// A read that fails on a missing table rather than create the schema (see
    /// [`Query::creates_schema`]).
    pub(super) fn without_schema_creation(mut self) -> Self {
        self.creates_schema = false;
        self
    }

    /// The state rows this INSERT writes, by id and version (see [`Query::lands`]).
    pub fn landing(mut self, rows: Vec<(String, u64)>) -> Self {
        self.lands = rows;
        self
    }

    pub(super) fn param(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.params.push((name, value.into()));
        self
    }

    pub(super) fn setting(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.settings.push((name, value.into()));
        self
    }

    pub(super) fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// An INSERT; `token` names the logical write, so that a retry of it lands once.
    pub(super) fn insert(self, token: &str) -> Self {
        self.role(Role::Insert)
            .setting("insert_deduplication_token", token)
    }

    /// An INSERT whose rows each land in `tables` tables (see [`Query::fanout`]).
    pub(super) fn fanned_out(mut self, tables: u64) -> Self {
        self.fanout = tables;
        if tables > 1 {
            // A retry of an insert whose first send stored the history's part but failed before
            // the view's: the history skips the block as a duplicate, and the view must still
            // get it.
            self.setting("deduplicate_blocks_in_dependent_materialized_views", "1")
        } else {
            self
        }
    }

    /// A DELETE that returns once done on every replica (`sync`), or at once (best effort).
    pub(super) fn delete(self, sync: bool) -> Self {
        let wait = if sync { "2" } else { "0" };
        self.role(Role::Mutation)
            .setting("mutations_sync", wait)
            .setting("lightweight_deletes_sync", wait)
    }

    /// Reads answer in JSONEachRow with 64-bit numbers unquoted (servers before 25.8 quote them).
    pub(super) fn json(self) -> Self {
        self.setting("output_format_json_quote_64bit_integers", "0")
    }

    /// An aggregate without GROUP BY gives one row even over no rows, and `max` of nothing is
    /// the type's zero, not NULL: these statements count on both (a `set` of a new id, a guard
    /// over an empty log). A profile may have changed either, so the statement pins them.
    pub(super) fn one_row_of_nothing(self) -> Self {
        self.setting("empty_result_for_aggregation_by_empty_set", "0")
            .setting("aggregate_functions_null_for_empty", "0")
    }

    /// A read whose `WHERE` on a non-key column must see each id's newest row only, so it runs
    /// after `FINAL`'s merge: a profile that moves it into `PREWHERE` would filter rows before
    /// the merge (a tombstone first, then the older live row wins), so the statement pins it.
    pub(super) fn where_after_final(self) -> Self {
        self.setting("optimize_move_to_prewhere_if_final", "0")
    }

    /// A read that decides something (who holds a lock, what to merge into).
    pub(super) fn deciding(self) -> Self {
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

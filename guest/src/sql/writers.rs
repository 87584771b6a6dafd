//! Who wrote: one row per identified store instance (`store.identify`) in `<table>_writers`,
//! written before the instance's first write. History rows and lock claims carry the instance
//! id (`writer`, and the owner's prefix), so a read finds the process behind them here: nothing
//! more travels with each write.

use super::{Query, Read, Statements};
use crate::error::{Error, Result, WriterInfo};
use crate::rows;

/// The columns of a writer's row, in the order [`Statements::writer_insert`] names them.
const COLUMNS: &str = "writer, run_id, command, host, pid, meltano_version, backend_version, at_ms";

impl Statements {
    /// One row per instance, so `ReplacingMergeTree` by `writer` keeps one of a row sent twice;
    /// kept as long as the history keeps what it explains (see [`Statements::new`]).
    pub fn create_writers_table(&self) -> Query {
        let ttl = match self.writer_days {
            0 => String::new(),
            days => format!(" TTL toDateTime(intDiv(at_ms, 1000)) + INTERVAL {days} DAY"),
        };
        Query::new(format!(
            "CREATE TABLE IF NOT EXISTS {}{} (writer String, run_id String, command String, \
             host String, pid UInt32, meltano_version String, backend_version String, \
             at_ms UInt64) ENGINE = {} ORDER BY writer{ttl}",
            self.writers,
            self.on_cluster,
            self.engine("ReplacingMergeTree", ""),
        ))
    }

    /// Writes one writer's row; `row` is a JSONEachRow line ([`writer_row`]). `token` makes a
    /// retry land once.
    pub fn writer_insert(&self, row: Vec<u8>, token: &str) -> Query {
        let mut query = Query::new(format!(
            "INSERT INTO {} ({COLUMNS}) FORMAT JSONEachRow",
            self.writers
        ))
        .insert(token);
        query.data = Some(row.into());
        query
    }

    /// The rows of these instances (a JSON array in one parameter, as `history_seqs` sends
    /// ids); an instance with no row is left out.
    pub fn writers_of(&self, writers: &[&str]) -> Read<rows::Writer> {
        Query::new(format!(
            "SELECT writer, run_id, command, host, toString(pid), meltano_version, \
             backend_version FROM {} FINAL \
             WHERE has(JSONExtract({{writers:String}}, 'Array(String)'), writer) FORMAT RowBinary",
            self.writers
        ))
        .param("writers", serde_json::Value::from(writers).to_string())
        .without_schema_creation()
        .read_binary()
    }
}

/// A writer's row as [`Statements::writer_insert`] sends it: a JSONEachRow line.
pub fn writer_row(writer: &str, who: &WriterInfo, at_ms: u64) -> Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Row<'a> {
        writer: &'a str,
        run_id: &'a str,
        command: &'a str,
        host: &'a str,
        pid: u32,
        meltano_version: &'a str,
        backend_version: &'a str,
        at_ms: u64,
    }
    let row = Row {
        writer,
        run_id: &who.run_id,
        command: &who.command,
        host: &who.host,
        pid: who.pid,
        meltano_version: &who.meltano_version,
        backend_version: &who.backend_version,
        at_ms,
    };
    let mut data = serde_json::to_vec(&row)
        .map_err(|e| Error::InvalidInput(format!("cannot encode a writer's row: {e}")))?;
    data.push(b'\n');
    Ok(data)
}

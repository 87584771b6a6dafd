//! Rows ClickHouse sends: the row type of each read statement (`sql::Statements` returns a
//! `Read<Row>`), and one decoder for `FORMAT JSONEachRow` bodies and single numbers.
//!
//! Each row type is built by hand from the row's columns ([`FromRow`]) rather than derived:
//! one small decoding path for all of them, errors that name the column, and no per-type
//! deserializer code in the component (the derived ones, with serde's type-error messages
//! that format floats, were about 30 KB of it).

use serde_json::{Map, Value};

use crate::error::{Error, Result, ServerError};

fn unexpected(message: String) -> Error {
    Error::Server(ServerError {
        code: 0,
        name: "UNEXPECTED_RESPONSE".into(),
        message,
    })
}

/// One row: its columns by name.
pub struct Row(Map<String, Value>);

/// A row type of a read statement that answers in JSONEachRow: built from the row's columns.
pub trait FromRow: Sized {
    fn from_row(row: Row) -> Result<Self>;
}

/// A row type of any read statement: how a whole answer becomes rows.
pub trait Decode: Sized {
    fn decode(body: &[u8]) -> Result<Vec<Self>>;
}

impl<R: FromRow> Decode for R {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        lines(body).map(row).collect()
    }
}

impl Row {
    fn parse(line: &[u8]) -> Result<Row> {
        match serde_json::from_slice(line) {
            Ok(Value::Object(columns)) => Ok(Row(columns)),
            Ok(_) => Err(unexpected(
                "a row ClickHouse sent is not a JSON object".into(),
            )),
            Err(e) => Err(unexpected(format!(
                "cannot read a row ClickHouse sent: {e}"
            ))),
        }
    }

    fn wrong(column: &str, expected: &str) -> Error {
        unexpected(format!(
            "column '{column}' of a row ClickHouse sent is not {expected}"
        ))
    }

    /// A `String` column.
    pub fn text(&mut self, column: &str) -> Result<String> {
        match self.0.remove(column) {
            Some(Value::String(text)) => Ok(text),
            _ => Err(Row::wrong(column, "a string")),
        }
    }

    /// A `Nullable(String)` column, or one that may be absent.
    pub fn optional_text(&mut self, column: &str) -> Result<Option<String>> {
        match self.0.remove(column) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(Row::wrong(column, "a string or null")),
        }
    }

    /// An unsigned integer column.
    pub fn number(&mut self, column: &str) -> Result<u64> {
        self.0
            .remove(column)
            .as_ref()
            .and_then(Value::as_u64)
            .ok_or_else(|| Row::wrong(column, "a number"))
    }

    /// An unsigned integer column that may be absent (then 0).
    pub fn number_or_zero(&mut self, column: &str) -> Result<u64> {
        match self.0.get(column) {
            None => Ok(0),
            Some(_) => self.number(column),
        }
    }

    /// An `Array(Tuple(...))` column, each tuple read by `item`; absent is empty.
    pub fn tuples<T>(
        &mut self,
        column: &str,
        item: impl Fn(&[Value]) -> Option<T>,
    ) -> Result<Vec<T>> {
        match self.0.remove(column) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Array(fields) => item(fields),
                    _ => None,
                })
                .collect::<Option<Vec<T>>>()
                .ok_or_else(|| Row::wrong(column, "an array of the expected tuples")),
            Some(_) => Err(Row::wrong(column, "an array")),
        }
    }
}

fn as_text(value: &Value) -> Option<String> {
    value.as_str().map(str::to_string)
}

/// A `Nullable(String)` inside a tuple: `Some(None)` for null, `None` for anything else.
fn as_optional_text(value: &Value) -> Option<Option<String>> {
    match value {
        Value::Null => Some(None),
        Value::String(text) => Some(Some(text.clone())),
        _ => None,
    }
}

fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
}

fn row<R: FromRow>(line: &[u8]) -> Result<R> {
    R::from_row(Row::parse(line)?)
}

/// Every row of an answer.
pub fn all<R: Decode>(body: &[u8]) -> Result<Vec<R>> {
    R::decode(body)
}

/// The first row of a JSONEachRow body, if any.
pub fn first<R: FromRow>(body: &[u8]) -> Result<Option<R>> {
    lines(body).next().map(row).transpose()
}

/// A body that is one number (`FORMAT TSV` of a count or a version).
pub fn number(body: &[u8]) -> Result<u64> {
    let text = String::from_utf8_lossy(body);
    text.trim().parse().map_err(|_| {
        unexpected(format!(
            "expected a number from ClickHouse, got {:?}",
            text.trim()
        ))
    })
}

// -- the rows, one type per read statement (`sql::Statements` pairs each with its own) --

/// One state with its version (`Statements::get`).
#[derive(Debug)]
pub struct Stored {
    pub partial_state: Option<String>,
    pub completed_state: Option<String>,
    pub updated_at_ms: u64,
}

impl FromRow for Stored {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Stored {
            partial_state: row.optional_text("partial_state")?,
            completed_state: row.optional_text("completed_state")?,
            updated_at_ms: row.number("updated_at_ms")?,
        })
    }
}

/// A state id (`Statements::state_ids`), in TabSeparated: the bulk reads skip JSON, whose
/// escaping of a JSON state inside a JSON row is the costly part of reading 100k states.
#[derive(Debug)]
pub struct Id(pub String);

impl Decode for Id {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        tsv(body, |fields| match fields {
            [id] => Ok(Id(unescape(id)?)),
            _ => Err(tsv_shape(1)),
        })
    }
}

/// A state (`Statements::get_all`), in TabSeparated: id, partial, completed (NULL as empty).
#[derive(Debug)]
pub struct Listed {
    pub state_id: String,
    pub partial_state: String,
    pub completed_state: String,
}

impl Decode for Listed {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        tsv(body, |fields| match fields {
            [id, partial, completed] => Ok(Listed {
                state_id: unescape(id)?,
                partial_state: unescape(partial)?,
                completed_state: unescape(completed)?,
            }),
            _ => Err(tsv_shape(3)),
        })
    }
}

/// The rows of a TabSeparated answer, each given to `row` as its fields (still escaped).
fn tsv<R>(body: &[u8], row: impl Fn(&[&[u8]]) -> Result<R>) -> Result<Vec<R>> {
    let mut fields: Vec<&[u8]> = Vec::with_capacity(4);
    let mut out = Vec::new();
    // Tabs and newlines inside values are escaped, so the raw ones delimit.
    for line in body.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
        fields.clear();
        fields.extend(line.split(|b| *b == b'\t'));
        out.push(row(&fields)?);
    }
    Ok(out)
}

fn tsv_shape(columns: usize) -> Error {
    unexpected(format!(
        "a TabSeparated row ClickHouse sent does not have {columns} column(s)"
    ))
}

/// A TabSeparated field: ClickHouse escapes `\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\0` and `\'`.
fn unescape(field: &[u8]) -> Result<String> {
    let bytes = if field.contains(&b'\\') {
        let mut out = Vec::with_capacity(field.len());
        let mut rest = field.iter();
        while let Some(&b) = rest.next() {
            if b != b'\\' {
                out.push(b);
                continue;
            }
            out.push(match rest.next() {
                Some(b'n') => b'\n',
                Some(b't') => b'\t',
                Some(b'r') => b'\r',
                Some(b'b') => 0x08,
                Some(b'f') => 0x0c,
                Some(b'0') => 0,
                Some(&other @ (b'\\' | b'\'' | b'"' | b'/')) => other,
                _ => {
                    return Err(unexpected(
                        "a TabSeparated field ClickHouse sent has an unknown escape".into(),
                    ));
                }
            });
        }
        out
    } else {
        field.to_vec()
    };
    String::from_utf8(bytes)
        .map_err(|_| unexpected("a TabSeparated field ClickHouse sent is not UTF-8".into()))
}

/// The newest version of an id (`Statements::versions`).
#[derive(Debug)]
pub struct Version {
    pub state_id: String,
    pub version: u64,
}

impl FromRow for Version {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Version {
            state_id: row.text("state_id")?,
            version: row.number("version")?,
        })
    }
}

/// A state read together with a lock's grant: partial, completed (NULL as none) and version.
pub type StoredTuple = (Option<String>, Option<String>, u64);

/// The newest generation of an id, folded (`Statements::log_state`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Newest {
    pub generation: u64,
    pub owner: String,
    pub acquired_at_ms: u64,
    pub lease_until_ms: u64,
    pub floor_ms: u64,
    pub released: u8,
    pub release_cap_ms: u64,
    pub forced: u8,
}

impl FromRow for Newest {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Newest {
            generation: row.number("generation")?,
            owner: row.text("holder")?,
            acquired_at_ms: row.number("acquired_at")?,
            lease_until_ms: row.number("lease_until")?,
            floor_ms: row.number("grant_floor")?,
            released: u8::from(row.number("released")? != 0),
            release_cap_ms: row.number("release_cap")?,
            forced: u8::from(row.number("forced")? != 0),
        })
    }
}

/// What an `update` reads before it claims (`Statements::log_outlook`): the newest generation
/// (generation 0 when the id was never locked) and the stored state.
#[derive(Debug, Clone, Default)]
pub struct Outlook {
    pub newest: Newest,
    pub stored: Option<StoredTuple>,
}

impl FromRow for Outlook {
    fn from_row(row: Row) -> Result<Self> {
        let mut row = row;
        let mut stored = stored_tuples(&mut row)?;
        Ok(Outlook {
            stored: stored.pop(),
            newest: Newest::from_row(row)?,
        })
    }
}

fn stored_tuples(row: &mut Row) -> Result<Vec<StoredTuple>> {
    row.tuples("stored", |fields| match fields {
        [partial, completed, version] => Some((
            as_optional_text(partial)?,
            as_optional_text(completed)?,
            version.as_u64()?,
        )),
        _ => None,
    })
}

/// One claim on a generation as its read-back sees it (`Statements::log_claims`).
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub owner: String,
    pub at_ms: u64,
    pub until_ms: u64,
    /// The newest generation of the id in the log.
    pub newest: u64,
    /// The lease end of the generation the claim replaces, renewals included.
    pub previous_until: u64,
    pub stored: Vec<StoredTuple>,
}

impl FromRow for Claim {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Claim {
            owner: row.text("owner")?,
            at_ms: row.number("at_ms")?,
            until_ms: row.number("until_ms")?,
            newest: row.number("newest")?,
            previous_until: row.number_or_zero("previous_until")?,
            stored: stored_tuples(&mut row)?,
        })
    }
}

/// A live candidate, as `Statements::lock_candidates` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub lock_id: String,
    pub locked_at_s: u64,
}

impl FromRow for Candidate {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Candidate {
            lock_id: row.text("lock_id")?,
            locked_at_s: row.number("locked_at_s")?,
        })
    }
}

/// The deployment check's one row (`Statements::deployment`).
#[derive(Debug, Default)]
pub struct Observed {
    /// (table name, engine) of this store's tables that exist.
    pub tables: Vec<(String, String)>,
    /// The server has a `replica` macro: it is set up as a replica of replicated tables.
    pub replica_macro: u8,
    /// (cluster name, largest replica number) of the clusters the server knows.
    pub clusters: Vec<(String, u64)>,
    /// The server knows the `deduplicate_insert` setting (newer releases; it supersedes
    /// `insert_deduplicate`).
    pub dedup_setting: u8,
}

impl FromRow for Observed {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Observed {
            tables: row.tuples("tables", |fields| match fields {
                [name, engine] => Some((as_text(name)?, as_text(engine)?)),
                _ => None,
            })?,
            replica_macro: u8::from(row.number("replica_macro")? != 0),
            clusters: row.tuples("clusters", |fields| match fields {
                [name, replicas] => Some((as_text(name)?, replicas.as_u64()?)),
                _ => None,
            })?,
            dedup_setting: u8::from(row.number_or_zero("dedup_setting")? != 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_skips_blank_lines() {
        let body = b"{\"state_id\":\"a\",\"version\":1}\n\n{\"state_id\":\"b\",\"version\":2}\n";
        let rows: Vec<Version> = all(body).expect("rows");
        assert_eq!((rows[1].state_id.as_str(), rows[1].version), ("b", 2));
        assert!(first::<Version>(b"  \n").expect("none").is_none());
        assert_eq!(number(b"42\n").expect("number"), 42);
    }

    #[test]
    fn a_row_that_is_not_what_was_asked_is_an_unexpected_response_naming_the_column() {
        for body in [
            &b"{\"state_id\":\"a\",\"version\":\"x\"}"[..],
            b"{\"state_id\":\"a\"}",
            b"{\"state_id\":\"a\",\"version\":-1}",
            b"{\"state_id\":\"a\",\"version\":1.5}",
        ] {
            let error = all::<Version>(body).expect_err("refused");
            assert!(
                matches!(&error, Error::Server(e) if e.name == "UNEXPECTED_RESPONSE"
                    && e.message.contains("'version'")),
                "{error:?}"
            );
        }
        assert!(all::<Version>(b"[1]").is_err());
        assert!(number(b"nope").is_err());
    }

    #[test]
    fn tab_separated_rows_are_unescaped() {
        let body = b"a\\tb\\\\c\t{\\\"x\\\": \\'\\n\\'}\t\nd\t\t{}\n";
        let rows: Vec<Listed> = all(body).expect("rows");
        assert_eq!(rows[0].state_id, "a\tb\\c");
        assert_eq!(rows[0].partial_state, "{\"x\": '\n'}");
        assert_eq!(rows[0].completed_state, "");
        assert_eq!(
            (rows[1].state_id.as_str(), rows[1].completed_state.as_str()),
            ("d", "{}")
        );
        let ids: Vec<Id> = all("ü\\0\n".as_bytes()).expect("ids");
        assert_eq!(ids[0].0, "ü\0");
        assert!(all::<Listed>(b"a\tb\n").is_err(), "two columns, not three");
        assert!(all::<Id>(b"a\\q\n").is_err(), "an unknown escape");
        assert!(all::<Id>(b"\xff\n").is_err(), "not UTF-8");
    }

    #[test]
    fn nullable_and_absent_parts_and_nested_tuples() {
        let claim: Claim = first(
            b"{\"owner\":\"o\",\"at_ms\":1,\"until_ms\":2,\"newest\":3,\
              \"stored\":[[\"{}\",null,7]]}",
        )
        .expect("read")
        .expect("a row");
        assert_eq!(claim.previous_until, 0);
        assert_eq!(claim.stored, vec![(Some("{}".into()), None, 7)]);
        let observed: Observed = first(
            b"{\"tables\":[[\"state\",\"ReplacingMergeTree\"]],\"replica_macro\":1,\
              \"clusters\":[[\"prod\",3]]}",
        )
        .expect("read")
        .expect("a row");
        assert_eq!(observed.tables[0].1, "ReplacingMergeTree");
        assert_eq!(observed.clusters, vec![("prod".into(), 3)]);
        assert_eq!((observed.replica_macro, observed.dedup_setting), (1, 0));
        assert!(
            first::<Observed>(b"{\"tables\":[[\"state\"]],\"replica_macro\":0,\"clusters\":[]}")
                .is_err()
        );
    }
}

//! Rows ClickHouse sends: the row type of each read statement (`sql::Statements` returns a
//! `Read<Row>`), one decoder for `FORMAT JSONEachRow` bodies and single numbers, and one for
//! the bulk reads' `FORMAT RowBinary`.
//!
//! Each row type is built by hand from the row's columns ([`FromRow`]) rather than derived:
//! one small decoding path for all of them, errors that name the column, and no per-type
//! deserializer code in the component (the derived ones, with serde's type-error messages
//! that format floats, were about 30 KB of it).

use serde_json::{Map, Value};

use crate::error::{Error, Result, ServerError, WriterInfo};
use protocol::rows::{Candidate, Claim, NewestGeneration, Observation, Outlook, StoredTuple};

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

pub(crate) fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
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

/// One version in the history (`Statements::history`, `history_at`). Both parts `None`: the
/// state was deleted by this write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub version: u64,
    pub op: String,
    pub writer: String,
    pub lock_owner: String,
    pub token: u64,
    pub partial_state: Option<String>,
    pub completed_state: Option<String>,
}

impl FromRow for HistoryEntry {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(HistoryEntry {
            version: row.number("version")?,
            op: row.text("op")?,
            writer: row.text("writer")?,
            lock_owner: row.text("lock_owner")?,
            token: row.number("token")?,
            partial_state: row.optional_text("partial_state")?,
            completed_state: row.optional_text("completed_state")?,
        })
    }
}

/// One identified instance's row of the writers table (`sql::writers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub writer: String,
    pub who: WriterInfo,
}

/// In RowBinary, every column a `String` (the pid as its decimal text).
impl Decode for Writer {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        let mut rows = RowBinary(body);
        let mut out = Vec::new();
        while !rows.0.is_empty() {
            out.push(Writer {
                writer: rows.text()?,
                who: WriterInfo {
                    run_id: rows.text()?,
                    command: rows.text()?,
                    host: rows.text()?,
                    pid: rows.text()?.parse().unwrap_or(0),
                    meltano_version: rows.text()?,
                    backend_version: rows.text()?,
                },
            });
        }
        Ok(out)
    }
}

/// How many versions of an id the history holds, and its oldest and newest (0 when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryExtent {
    pub versions: u64,
    pub oldest: u64,
    pub newest: u64,
}

impl FromRow for HistoryExtent {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(HistoryExtent {
            versions: row.number("versions")?,
            oldest: row.number("oldest")?,
            newest: row.number("newest")?,
        })
    }
}

/// A state id (`Statements::state_ids`), in RowBinary.
#[derive(Debug)]
pub struct Id(pub String);

impl Decode for Id {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        let mut rows = RowBinary(body);
        let mut out = Vec::new();
        while !rows.0.is_empty() {
            out.push(Id(rows.text()?));
        }
        Ok(out)
    }
}

/// A state (`Statements::get_all`), in RowBinary: id, partial, completed (NULL as empty).
#[derive(Debug)]
pub struct ListedState {
    pub state_id: String,
    pub partial_state: String,
    pub completed_state: String,
}

impl Decode for ListedState {
    fn decode(body: &[u8]) -> Result<Vec<Self>> {
        let mut rows = RowBinary(body);
        let mut out = Vec::new();
        while !rows.0.is_empty() {
            out.push(ListedState {
                state_id: rows.text()?,
                partial_state: rows.text()?,
                completed_state: rows.text()?,
            });
        }
        Ok(out)
    }
}

/// What is left of a RowBinary answer of `String` columns: each value is its length (LEB128)
/// and its bytes.
///
/// The bulk reads use it because nothing in it needs scanning: a 100k-state listing is 15 MB,
/// and finding the delimiters and escapes of TabSeparated in it (or parsing JSON rows) was most
/// of the component's time. Each value is checked as UTF-8 and copied once.
struct RowBinary<'a>(&'a [u8]);

impl RowBinary<'_> {
    fn text(&mut self) -> Result<String> {
        let mut length: u64 = 0;
        let mut shift = 0;
        loop {
            let (&byte, rest) = self.0.split_first().ok_or_else(truncated)?;
            self.0 = rest;
            if shift > 63 {
                return Err(unexpected(
                    "a RowBinary length ClickHouse sent is too long".into(),
                ));
            }
            length |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let length = usize::try_from(length)
            .ok()
            .filter(|length| *length <= self.0.len())
            .ok_or_else(truncated)?;
        let (bytes, rest) = self.0.split_at(length);
        self.0 = rest;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| unexpected("a value ClickHouse sent is not UTF-8".into()))
    }
}

fn truncated() -> Error {
    unexpected("a RowBinary answer ClickHouse sent ends inside a row".into())
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

/// The highest ordinal of an id in the history (`Statements::history_seqs`).
#[derive(Debug)]
pub struct Seq {
    pub state_id: String,
    pub seq: u64,
}

impl FromRow for Seq {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Seq {
            state_id: row.text("state_id")?,
            seq: row.number("seq")?,
        })
    }
}

impl FromRow for NewestGeneration {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(NewestGeneration {
            generation: row.number("generation")?,
            owner: row.text("holder")?,
            acquired_at_ms: row.number("acquired_at")?,
            lease_until_ms: row.number("lease_until")?,
            floor_ms: row.number("grant_floor")?,
            released: u8::from(row.number("released")? != 0),
            release_cap_ms: row.number("release_cap")?,
            forced: u8::from(row.number("forced")? != 0),
            wanted: u8::from(row.number("wanted")? != 0),
        })
    }
}

impl FromRow for Outlook {
    fn from_row(row: Row) -> Result<Self> {
        let mut row = row;
        let mut stored = stored_tuples(&mut row)?;
        Ok(Outlook {
            stored: stored.pop(),
            newest: NewestGeneration::from_row(row)?,
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

impl FromRow for Candidate {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Candidate {
            lock_id: row.text("lock_id")?,
            locked_at_s: row.number("locked_at_s")?,
        })
    }
}

impl FromRow for Observation {
    fn from_row(mut row: Row) -> Result<Self> {
        Ok(Observation {
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
            history_view: u8::from(row.number_or_zero("history_view")? != 0),
            pinnable: row.tuples("pinnable", |fields| match fields {
                [name] => as_text(name),
                _ => None,
            })?,
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

    /// `values` as ClickHouse writes `String` columns in RowBinary.
    fn row_binary(values: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for value in values {
            let mut length = value.len();
            loop {
                let byte = (length & 0x7f) as u8;
                length >>= 7;
                out.push(if length == 0 { byte } else { byte | 0x80 });
                if length == 0 {
                    break;
                }
            }
            out.extend_from_slice(value.as_bytes());
        }
        out
    }

    #[test]
    fn row_binary_rows_are_read_whole_or_refused() {
        let long = "x".repeat(300); // a two-byte length
        let body = row_binary(&["a\tb\\c", "{\"x\": '\n'}", "", "ü\0", &long, "{}"]);
        let rows: Vec<ListedState> = all(&body).expect("rows");
        assert_eq!(rows[0].state_id, "a\tb\\c");
        assert_eq!(rows[0].partial_state, "{\"x\": '\n'}");
        assert_eq!(rows[0].completed_state, "");
        assert_eq!(
            (rows[1].state_id.as_str(), rows[1].partial_state.as_str()),
            ("ü\0", long.as_str())
        );
        let ids: Vec<Id> = all(&row_binary(&["a", "b"])).expect("ids");
        assert_eq!((ids[0].0.as_str(), ids[1].0.as_str()), ("a", "b"));
        assert!(all::<Id>(b"").expect("none").is_empty());
        for bad in [
            row_binary(&["a", "b"]), // two columns, not three
            b"\x05abc".to_vec(),     // shorter than its length
            b"\x80".to_vec(),        // a length cut short
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".to_vec(), // a length past 64 bits
            b"\x01\xff\x01a\x01b".to_vec(), // not UTF-8
        ] {
            let error = all::<ListedState>(&bad).expect_err("refused");
            assert!(
                matches!(&error, Error::Server(e) if e.name == "UNEXPECTED_RESPONSE"),
                "{error:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn row_binary_rows_round_trip(rows in proptest::collection::vec(("\\PC*", "\\PC*", "\\PC*"), 0..20)) {
            let values: Vec<&str> = rows
                .iter()
                .flat_map(|(a, b, c)| [a.as_str(), b.as_str(), c.as_str()])
                .collect();
            let decoded: Vec<ListedState> = all(&row_binary(&values)).expect("rows");
            let decoded: Vec<(String, String, String)> = decoded
                .into_iter()
                .map(|r| (r.state_id, r.partial_state, r.completed_state))
                .collect();
            proptest::prop_assert_eq!(decoded, rows);
        }
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
        let observed: Observation = first(
            b"{\"tables\":[[\"state\",\"ReplacingMergeTree\"]],\"replica_macro\":1,\
              \"clusters\":[[\"prod\",3]]}",
        )
        .expect("read")
        .expect("a row");
        assert_eq!(observed.tables[0].1, "ReplacingMergeTree");
        assert_eq!(observed.clusters, vec![("prod".into(), 3)]);
        assert_eq!((observed.replica_macro, observed.dedup_setting), (1, 0));
        assert!(
            first::<Observation>(b"{\"tables\":[[\"state\"]],\"replica_macro\":0,\"clusters\":[]}")
                .is_err()
        );
    }
}

//! Rows ClickHouse sends: the row type of each read statement (`sql::Statements` returns a
//! `Read<Row>`), and one decoder for `FORMAT JSONEachRow` bodies and single numbers.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result, ServerError};

fn unexpected(message: String) -> Error {
    Error::Server(ServerError {
        code: 0,
        name: "UNEXPECTED_RESPONSE".into(),
        message,
    })
}

fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
}

fn row<R: DeserializeOwned>(line: &[u8]) -> Result<R> {
    serde_json::from_slice(line)
        .map_err(|e| unexpected(format!("cannot read a row ClickHouse sent: {e}")))
}

/// Every row of a JSONEachRow body.
pub fn all<R: DeserializeOwned>(body: &[u8]) -> Result<Vec<R>> {
    lines(body).map(row).collect()
}

/// The first row of a JSONEachRow body, if any.
pub fn first<R: DeserializeOwned>(body: &[u8]) -> Result<Option<R>> {
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
#[derive(Deserialize, Debug)]
pub struct Stored {
    pub partial_state: Option<String>,
    pub completed_state: Option<String>,
    pub updated_at_ms: u64,
}

/// A state id, with its parts when they were asked for (`Statements::state_ids`, `get_all`).
#[derive(Deserialize, Debug)]
pub struct Listed {
    pub state_id: String,
    #[serde(default)]
    pub partial_state: Option<String>,
    #[serde(default)]
    pub completed_state: Option<String>,
}

/// The newest version of an id (`Statements::versions`).
#[derive(Deserialize, Debug)]
pub struct Version {
    pub state_id: String,
    pub version: u64,
}

/// A state read together with a lock's grant: partial, completed (NULL as none) and version.
pub type StoredTuple = (Option<String>, Option<String>, u64);

/// The newest generation of an id, folded (`Statements::log_state`).
#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Newest {
    pub generation: u64,
    #[serde(rename = "holder")]
    pub owner: String,
    #[serde(rename = "acquired_at")]
    pub acquired_at_ms: u64,
    #[serde(rename = "lease_until")]
    pub lease_until_ms: u64,
    #[serde(rename = "grant_floor")]
    pub floor_ms: u64,
    pub released: u8,
    #[serde(rename = "release_cap")]
    pub release_cap_ms: u64,
    pub forced: u8,
}

/// One claim on a generation as its read-back sees it (`Statements::log_claims`).
#[derive(Deserialize, Debug, Clone, Default)]
pub struct Claim {
    pub owner: String,
    pub at_ms: u64,
    pub until_ms: u64,
    /// The newest generation of the id in the log.
    pub newest: u64,
    /// The lease end of the generation the claim replaces, renewals included.
    #[serde(default)]
    pub previous_until: u64,
    #[serde(default)]
    pub stored: Vec<StoredTuple>,
}

/// A live candidate, as `Statements::lock_candidates` reads it.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub lock_id: String,
    pub locked_at_s: u64,
}

/// The deployment check's one row (`Statements::deployment`).
#[derive(Debug, Deserialize, Default)]
pub struct Observed {
    /// (table name, engine) of this store's tables that exist.
    pub tables: Vec<(String, String)>,
    /// The server has a `replica` macro: it is set up as a replica of replicated tables.
    pub replica_macro: u8,
    /// (cluster name, largest replica number) of the clusters the server knows.
    pub clusters: Vec<(String, u64)>,
    /// The server knows the `deduplicate_insert` setting (newer releases; it supersedes
    /// `insert_deduplicate`).
    #[serde(default)]
    pub dedup_setting: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Pair {
        a: u64,
        b: Option<String>,
    }

    #[test]
    fn reads_rows_and_skips_blank_lines() {
        let body = b"{\"a\":1,\"b\":\"x\"}\n\n{\"a\":2,\"b\":null}\n";
        let rows: Vec<Pair> = all(body).expect("rows");
        assert_eq!(rows[1], Pair { a: 2, b: None });
        assert_eq!(first::<Pair>(b"  \n").expect("none"), None);
        assert_eq!(number(b"42\n").expect("number"), 42);
    }

    #[test]
    fn a_row_that_is_not_what_was_asked_is_an_unexpected_response() {
        let error = all::<Pair>(b"{\"a\":\"x\"}").expect_err("refused");
        assert!(
            matches!(&error, Error::Server(e) if e.name == "UNEXPECTED_RESPONSE"),
            "{error:?}"
        );
        assert!(number(b"nope").is_err());
    }
}

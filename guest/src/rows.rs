//! Rows ClickHouse sends: `FORMAT JSONEachRow` bodies and single numbers, read by one decoder.

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

//! A check and its outcome, and the reading of the answers' rows.

use serde_json::Value;

use crate::error::LockInfo;

/// How a check came out. `Fail` makes the operator's `doctor` exit non-zero; `Warn` does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Warn,
    Fail,
    Skipped,
}

/// One check: what it looked at, how it came out, what it found, and what to do when it did not
/// pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
    pub fix: String,
}

impl Check {
    pub(super) fn new(name: &'static str, outcome: Outcome, detail: String, fix: &str) -> Self {
        Check {
            name,
            outcome,
            detail,
            fix: fix.to_string(),
        }
    }
}

/// The checks, in the order they run; each one's name is written here only.
pub const CHECKS: [&str; 7] = [
    "authentication",
    "server-version",
    "clock",
    "deployment",
    "tables",
    "grants",
    "lock-log",
];

/// A lock log with more rows than this for one id is reported: the protocol prunes old
/// generations, so a larger one means the pruning does not keep up (or cannot delete).
pub const LOCK_LOG_ROWS_WARN: u64 = 1_000;

/// What `diagnose` found: the checks, and the grants that were neither released nor forced
/// open (held now, or lapsed unreleased), for the host to look at their processes.
#[derive(Debug, Default)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub unreleased: Vec<LockInfo>,
}

impl Diagnosis {
    pub(super) fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// The checks after a failed one that the rest depended on.
    pub(super) fn skip_rest(&mut self, why: &str) {
        for name in CHECKS {
            if !self.checks.iter().any(|c| c.name == name) {
                self.push(Check::new(name, Outcome::Skipped, why.to_string(), ""));
            }
        }
    }
}

pub(super) fn all_rows(body: &[u8]) -> Vec<Value> {
    crate::rows::lines(body)
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect()
}

pub(super) fn first_row(body: &[u8]) -> Option<Value> {
    all_rows(body).into_iter().next()
}

pub(super) fn text(row: &Value, column: &str) -> String {
    row.get(column)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// A number, as ClickHouse's JSON gives it (64-bit integers quoted).
pub(super) fn number(row: &Value, column: &str) -> u64 {
    row.get(column).map(as_number).unwrap_or(0)
}

pub(super) fn as_number(value: &Value) -> u64 {
    match value {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Bool(b) => u64::from(*b),
        _ => 0,
    }
}

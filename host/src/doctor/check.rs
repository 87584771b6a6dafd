//! A check's line: its name, outcome, what it found and its fix; the table and the verdict.

use serde::Serialize;

use crate::error::LockInfo;

/// How a check came out; only `Fail` fails the doctor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Warn,
    Fail,
    Skipped,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "ok",
            Outcome::Warn => "warn",
            Outcome::Fail => "FAIL",
            Outcome::Skipped => "skip",
        }
    }
}

impl From<crate::bindings::wit::Check> for Check {
    fn from(c: crate::bindings::wit::Check) -> Self {
        use crate::bindings::wit::Outcome as Wit;
        let outcome = match c.outcome {
            Wit::Pass => Outcome::Pass,
            Wit::Warn => Outcome::Warn,
            Wit::Fail => Outcome::Fail,
            Wit::Skipped => Outcome::Skipped,
        };
        Check::new(&c.name, outcome, c.detail, &c.fix)
    }
}

/// One line of the doctor's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub outcome: Outcome,
    pub detail: String,
    /// What to do; empty when it passed.
    pub fix: String,
}

impl Check {
    pub fn new(name: &str, outcome: Outcome, detail: String, fix: &str) -> Self {
        Check {
            name: name.to_string(),
            outcome,
            detail,
            fix: fix.to_string(),
        }
    }

    pub fn fail(name: &str, detail: String, fix: &str) -> Self {
        Check::new(name, Outcome::Fail, detail, fix)
    }
}

/// What the guest's `diagnose` found (see the contract), with the holders' processes.
#[derive(Debug, Default)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub unreleased: Vec<LockInfo>,
}

/// Whether every check passed (warnings and skips included).
pub fn passed(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.outcome != Outcome::Fail)
}

/// The table a terminal shows: one line a check, and its fix under it.
pub fn table(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for check in checks {
        out.push_str(&format!(
            "{:<4}  {:<width$}  {}\n",
            check.outcome.label(),
            check.name,
            check.detail
        ));
        if !check.fix.is_empty() {
            out.push_str(&format!("{:<4}  {:<width$}  fix: {}\n", "", "", check.fix));
        }
    }
    out
}

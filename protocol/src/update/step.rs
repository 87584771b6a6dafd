//! What an update says and hears: the statements it sends, their answers, and its steps.

use crate::error::{Error, Result};
use crate::fenced::LogEntry;
use crate::guard::Guard;
use crate::rows::{Claim, NewestGeneration, Outlook};

/// A statement the protocol sends (`lock::drive` turns each into SQL).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Statement {
    /// The newest generation of the id with the stored state (`log_outlook`).
    ReadOutlook { state_id: String },
    /// The newest generation of the id (`log_state`).
    ReadNewest { state_id: String },
    /// The claims on a generation, with the stored state (`log_claims`).
    ReadClaims { state_id: String, generation: u64 },
    /// A row appended to the lock log, under its token (`log_insert`).
    Append(LogEntry),
    /// A state row written only if the guard holds (`write_guarded`).
    WriteGuarded {
        partial: String,
        completed: String,
        version_ms: u64,
        guard: Guard,
        token: String,
    },
}

/// The answer to a statement, or to a pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Outlook(Outlook),
    NewestGeneration(NewestGeneration),
    Claims(Vec<Claim>),
    Appended,
    /// How many rows a guarded write wrote (`None`: the server did not say).
    RowsWritten(Option<u64>),
    /// The pause is over.
    Resumed,
    /// The statement failed (after the driver's retries): it may or may not have landed.
    Failed(Error),
}

/// What the protocol wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this, with no retry starting after `retry_until_ms` (a write under a lock does not
    /// try again once a contender may see the lease ended), and give back its answer.
    Send {
        statement: Statement,
        retry_until_ms: Option<u64>,
    },
    /// Sleep this many milliseconds, then answer [`Answer::Resumed`].
    Pause(u64),
    Done(Result<()>),
}

impl Step {
    pub(super) fn send(statement: Statement) -> Step {
        Step::Send {
            statement,
            retry_until_ms: None,
        }
    }
}

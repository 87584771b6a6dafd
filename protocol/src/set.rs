//! `set`: one state overwritten without the lock, landing at most once, as a sans-IO machine.
//!
//! The row goes at a version fixed by the caller (its clock), in one statement that writes it
//! only while nothing stored is at or above that version (`Statements::set_unless_newer`;
//! [`lands`] is the same rule in Rust). Sent again after a lost answer, it lands at most once:
//! its first landing put the version in the table, and a merge keeps the highest version of an
//! id. A version the server computes at landing ("above whatever is stored") would not do: a
//! resend, after a write in between and a merge that left no trace of the first landing, lands
//! again above that write and buries it (`tests/tests/integration/statements.rs` shows it on the engine).
//!
//! When the statement wrote nothing (or the server did not say), what is stored decides:
//!
//! - this very row: it landed, and the answer of that landing was lost;
//! - something else, and the statement was sent once and answered "nothing written": something
//!   stored was at or above the caller's clock. The row is written above it, at a fixed version
//!   again (a plain insert), so that its own resend lands on itself;
//! - something else after a resend, or an unsaid answer: the first landing may have happened and
//!   been overwritten since. Writing again could bury that newer write, so the set fails and
//!   says so.
//!
//! A `delete` keeps the version too: it writes a tombstone above what it deleted
//! (`sql::encode_tombstone`), so a resend after a delete writes nothing either.

use crate::error::{Error, Result};
use crate::rows::StoredTuple;

/// What the set asks its driver to send.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Statement {
    /// The row at `version_ms` unless something stored is at or above it
    /// (`Statements::set_unless_newer`).
    WriteUnlessNewer { version_ms: u64 },
    /// The stored state (`FINAL`) with its version.
    ReadStored,
    /// The row at `version_ms`, unconditionally, under a fresh token.
    Insert { version_ms: u64 },
}

/// The answer to a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// How many rows the conditional write wrote (`None`: the server did not say), and whether
    /// the driver sent it more than once (after a failure whose outcome was unknown).
    Written {
        rows: Option<u64>,
        resent: bool,
    },
    Stored(Option<StoredTuple>),
    Inserted,
    Failed(Error),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Send(Statement),
    Done(Result<()>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Writing,
    /// Reading what is stored after the write wrote nothing; `definite`: it was sent once and
    /// the server said it wrote nothing.
    Reading {
        definite: bool,
    },
    Inserting,
    Done,
}

/// One `set` of a state id (the id is the driver's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    partial: String,
    completed: String,
    version_ms: u64,
    phase: Phase,
}

/// Whether the conditional write lands at `version_ms` over the highest stored version (`None`:
/// nothing stored): the Rust twin of `set_unless_newer`'s condition.
pub fn lands(stored_max: Option<u64>, version_ms: u64) -> bool {
    stored_max.is_none_or(|v| v < version_ms)
}

impl Set {
    /// A set of `partial`/`completed` (JSON object texts) at the caller's clock `now_ms`.
    pub fn new(partial: &str, completed: &str, now_ms: u64) -> (Set, Step) {
        let set = Set {
            partial: partial.to_string(),
            completed: completed.to_string(),
            version_ms: now_ms,
            phase: Phase::Writing,
        };
        let step = Step::Send(Statement::WriteUnlessNewer { version_ms: now_ms });
        (set, step)
    }

    pub fn answer(&mut self, answer: Answer) -> Step {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, answer) {
            (Phase::Writing, Answer::Written { rows: Some(1), .. }) => Step::Done(Ok(())),
            (Phase::Writing, Answer::Written { rows, resent }) => {
                self.phase = Phase::Reading {
                    definite: rows == Some(0) && !resent,
                };
                Step::Send(Statement::ReadStored)
            }
            (Phase::Reading { definite }, Answer::Stored(stored)) => {
                let ours = (
                    Some(self.partial.clone()),
                    Some(self.completed.clone()),
                    self.version_ms,
                );
                if stored.as_ref() == Some(&ours) {
                    return Step::Done(Ok(()));
                }
                if !definite {
                    return Step::Done(Err(Error::Timeout(format!(
                        "the set's answer was lost, and the state changed since: whether the \
                         set landed before that change is unknown, and sending it again could \
                         bury the change (read the state; set it again if it is not right); \
                         now stored: version {} ms",
                        stored.map_or(0, |(_, _, v)| v)
                    ))));
                }
                self.version_ms = self
                    .version_ms
                    .max(stored.map_or(0, |(_, _, v)| v).saturating_add(1));
                self.phase = Phase::Inserting;
                Step::Send(Statement::Insert {
                    version_ms: self.version_ms,
                })
            }
            (Phase::Inserting, Answer::Inserted) => Step::Done(Ok(())),
            (_, Answer::Failed(e)) => Step::Done(Err(e)),
            (_, other) => Step::Done(Err(Error::InvalidInput(format!(
                "the set got an answer it did not ask for: {other:?}"
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(set: &Set) -> StoredTuple {
        (
            Some(set.partial.clone()),
            Some(set.completed.clone()),
            set.version_ms,
        )
    }

    #[test]
    fn the_row_lands_at_the_callers_clock_in_one_statement() {
        let (mut set, step) = Set::new("{}", "{\"a\":1}", 5_000);
        assert_eq!(
            step,
            Step::Send(Statement::WriteUnlessNewer { version_ms: 5_000 })
        );
        let written = Answer::Written {
            rows: Some(1),
            resent: false,
        };
        assert_eq!(set.answer(written), Step::Done(Ok(())));
    }

    #[test]
    fn the_condition_admits_only_a_version_above_everything_stored() {
        assert!(lands(None, 1));
        assert!(lands(Some(4_999), 5_000));
        assert!(!lands(Some(5_000), 5_000));
        assert!(!lands(Some(6_000), 5_000));
    }

    /// Nothing written, and what is stored is this very row: a resend found its own first
    /// landing (whose answer was lost).
    #[test]
    fn a_resend_that_finds_its_own_row_is_done() {
        for rows in [Some(0), None] {
            let (mut set, _) = Set::new("{}", "{\"a\":1}", 5_000);
            let step = set.answer(Answer::Written { rows, resent: true });
            assert_eq!(step, Step::Send(Statement::ReadStored));
            let stored = ours(&set);
            assert_eq!(set.answer(Answer::Stored(Some(stored))), Step::Done(Ok(())));
        }
    }

    /// Sent once and answered "nothing written": something stored is at or above the caller's
    /// clock, so the row goes above it.
    #[test]
    fn a_clock_behind_what_is_stored_writes_above_it() {
        let (mut set, _) = Set::new("{}", "{\"a\":1}", 5_000);
        set.answer(Answer::Written {
            rows: Some(0),
            resent: false,
        });
        let newer = (Some("{}".into()), Some("{\"b\":2}".into()), 7_000);
        let step = set.answer(Answer::Stored(Some(newer)));
        assert_eq!(step, Step::Send(Statement::Insert { version_ms: 7_001 }));
        assert_eq!(set.answer(Answer::Inserted), Step::Done(Ok(())));
    }

    /// After a resend (or an unsaid answer), another state stored means the first landing may
    /// have happened and been overwritten: the set does not write again, and says so.
    #[test]
    fn a_resend_that_finds_another_state_fails_without_writing() {
        for (rows, resent) in [(Some(0), true), (None, false), (None, true)] {
            let (mut set, _) = Set::new("{}", "{\"a\":1}", 5_000);
            set.answer(Answer::Written { rows, resent });
            let newer = (Some("{}".into()), Some("{\"b\":2}".into()), 7_000);
            let step = set.answer(Answer::Stored(Some(newer)));
            assert!(
                matches!(&step, Step::Done(Err(Error::Timeout(m))) if m.contains("unknown")),
                "{rows:?} {resent}: {step:?}"
            );
        }
    }
}

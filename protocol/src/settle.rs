//! Settle mode: the original Python backend's protocol on its `<table>_lock` table, so that a
//! fleet still running the Python backend stays mutually excluded with this one.
//!
//! 1. Remove candidates older than the lease and read the live ones; if any, wait.
//! 2. Insert a candidate with a fresh random id, then settle (1 s by default, the host's sleep).
//! 3. Read the candidates again: the lowest id wins; a loser withdraws and retries.
//!
//! Kept from the original: the table, the rule (lowest id wins), the settle time, the 300 s
//! staleness. Fixed where it cannot break exclusion with a Python process: every time decision
//! uses the host's clock; the deciding reads are sequentially consistent; Meltano's timeout and
//! retry settings are honoured; a candidate never wins over one that was established a settle
//! window before its own insert was acknowledged (a late insert yields, where the original would
//! let a lower id win); the lease can be renewed; the `locked` error names the holder.
//!
//! Not fixable without changing the table the Python backend uses: a background merge can
//! collapse candidates (they share the sort key), and a Python contender whose insert lands late
//! can still pick itself. There are no fencing tokens (the token is 0).

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result};
use crate::grant::{Attempt, LockHandle};
use crate::rows::Candidate;

impl Candidate {
    /// Who holds the id, as a `locked` error names it.
    pub fn info(&self, state_id: &str, lease_ms: u64) -> LockInfo {
        let acquired_at_ms = self.locked_at_s * 1000;
        LockInfo {
            state_id: state_id.to_string(),
            owner: self.lock_id.clone(),
            token: 0,
            acquired_at_ms,
            expires_at_ms: acquired_at_ms + lease_ms,
        }
    }
}

/// Candidates locked before this second (by the host's clock) are stale.
pub fn cutoff_s(now_ms: u64, lease_ms: u64) -> u64 {
    now_ms.saturating_sub(lease_ms) / 1000
}

/// A candidate that was in the table a whole settle window before ours was deciding, or had
/// decided, before ours existed: it goes first even with a higher id. `inserted_ms` is when our
/// insert was acknowledged, not when we began it: a candidate whose insert stalled must still
/// yield to a holder that decided while it was in flight, whose row is older than its
/// acknowledgement by more than a settle window (the original compared with the time before the
/// insert, and a late insert with a lower id won against the established holder).
pub fn established<'a>(
    all: &'a [Candidate],
    lock_id: &str,
    inserted_ms: u64,
    settle_ms: u64,
) -> Option<&'a Candidate> {
    // `locked_at` has whole seconds: a window of at least one second covers the rounding.
    let window = settle_ms.max(1000);
    all.iter()
        .find(|c| c.lock_id != lock_id && c.locked_at_s * 1000 + window <= inserted_ms)
}

/// Who goes first among `all` (sorted by id), for the candidate `lock_id` whose insert was
/// acknowledged at `inserted_ms`: an established candidate, else the lowest id. Pure, so that
/// the model checker (`model/`) runs it.
pub fn winner<'a>(
    all: &'a [Candidate],
    lock_id: &str,
    inserted_ms: u64,
    settle_ms: u64,
) -> Option<&'a Candidate> {
    established(all, lock_id, inserted_ms, settle_ms).or_else(|| all.first())
}

/// A statement one try sends (the driver, `attempt`, turns each into SQL).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Statement {
    /// Remove the id's candidates older than `cutoff_s`.
    DeleteStale { cutoff_s: u64 },
    /// The id's candidates from `cutoff_s` on, by id.
    ReadCandidates { cutoff_s: u64 },
    /// This try's candidate, stamped `now_ms` (seconds in the table).
    Insert { lock_id: String, now_ms: u64 },
    /// Withdraw this try's candidate.
    Delete { lock_id: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Done,
    Candidates(Vec<Candidate>),
    /// The settle pause is over.
    Resumed,
    Failed(Error),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Send(Statement),
    /// Settle this many milliseconds, then answer [`Answer::Resumed`].
    Pause(u64),
    Done(Result<Attempt>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    DeletingStale,
    Reading,
    Inserting,
    Settling,
    Deciding,
    Withdrawing,
    Done,
}

/// One try of settle mode's lock, as a sans-IO machine: what to send, when to settle, and what
/// the try came to. The model (`model/`) drives this very type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Try {
    state_id: String,
    lock_id: String,
    lease_ms: u64,
    settle_ms: u64,
    started_ms: u64,
    /// When the candidate's insert was acknowledged: a candidate established a settle window
    /// before it wins (see [`winner`]).
    inserted_ms: u64,
    /// The candidate that won, when it was not this one.
    holder: Option<Candidate>,
    phase: Phase,
}

impl Try {
    pub fn start(
        state_id: &str,
        lock_id: String,
        now_ms: u64,
        lease_ms: u64,
        settle_ms: u64,
    ) -> (Try, Step) {
        let attempt = Try {
            state_id: state_id.to_string(),
            lock_id,
            lease_ms,
            settle_ms,
            started_ms: now_ms,
            inserted_ms: 0,
            holder: None,
            phase: Phase::DeletingStale,
        };
        let cutoff_s = attempt.cutoff_s();
        (attempt, Step::Send(Statement::DeleteStale { cutoff_s }))
    }

    fn cutoff_s(&self) -> u64 {
        cutoff_s(self.started_ms, self.lease_ms)
    }

    pub fn answer(&mut self, answer: Answer, now_ms: u64) -> Step {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        let read = Statement::ReadCandidates {
            cutoff_s: self.cutoff_s(),
        };
        let next = match (phase, answer) {
            (_, Answer::Failed(e)) => return Step::Done(Err(e)),
            (Phase::DeletingStale, Answer::Done) => (Phase::Reading, Step::Send(read)),
            (Phase::Reading, Answer::Candidates(all)) => match all.into_iter().next() {
                Some(holder) => {
                    let info = holder.info(&self.state_id, self.lease_ms);
                    return Step::Done(Ok(Attempt::Held(info)));
                }
                None => {
                    let insert = Statement::Insert {
                        lock_id: self.lock_id.clone(),
                        now_ms: self.started_ms,
                    };
                    (Phase::Inserting, Step::Send(insert))
                }
            },
            (Phase::Inserting, Answer::Done) => {
                self.inserted_ms = now_ms;
                (Phase::Settling, Step::Pause(self.settle_ms))
            }
            (Phase::Settling, Answer::Resumed) => (Phase::Deciding, Step::Send(read)),
            (Phase::Deciding, Answer::Candidates(all)) => {
                match winner(&all, &self.lock_id, self.inserted_ms, self.settle_ms) {
                    Some(w) if w.lock_id == self.lock_id => {
                        return Step::Done(Ok(Attempt::Granted(self.granted())));
                    }
                    other => {
                        self.holder = other.cloned();
                        let delete = Statement::Delete {
                            lock_id: self.lock_id.clone(),
                        };
                        (Phase::Withdrawing, Step::Send(delete))
                    }
                }
            }
            (Phase::Withdrawing, Answer::Done) => {
                let info = match &self.holder {
                    Some(w) => w.info(&self.state_id, self.lease_ms),
                    None => LockInfo {
                        state_id: self.state_id.clone(),
                        owner: "unknown".into(),
                        token: 0,
                        acquired_at_ms: self.started_ms,
                        expires_at_ms: self.started_ms + self.lease_ms,
                    },
                };
                return Step::Done(Ok(Attempt::Held(info)));
            }
            (_, other) => {
                return Step::Done(Err(Error::InvalidInput(format!(
                    "settle mode's lock got an answer it did not ask for: {other:?}"
                ))));
            }
        };
        self.phase = next.0;
        next.1
    }

    fn granted(&self) -> LockHandle {
        LockHandle {
            state_id: self.state_id.clone(),
            owner: self.lock_id.clone(),
            token: 0,
            acquired_at_ms: self.started_ms,
            lease_until_ms: self.started_ms + self.lease_ms,
            floor_ms: 0,
            last_written_ms: 0,
            mode: LockMode::Settle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 300_000;
    const SETTLE: u64 = 1_000;

    fn candidate(lock_id: &str, locked_at_s: u64) -> Candidate {
        Candidate {
            lock_id: lock_id.into(),
            locked_at_s,
        }
    }

    /// A try by `me` at 400 s that inserts (acknowledged at `inserted_ms`), settles, and then
    /// reads `all`: what it comes to.
    fn decide(me: &str, inserted_ms: u64, all: Vec<Candidate>) -> (Step, Try) {
        let (mut t, step) = Try::start("s", me.into(), 400_000, LEASE, SETTLE);
        assert_eq!(step, Step::Send(Statement::DeleteStale { cutoff_s: 100 }));
        let step = t.answer(Answer::Done, 400_010);
        assert_eq!(
            step,
            Step::Send(Statement::ReadCandidates { cutoff_s: 100 })
        );
        let step = t.answer(Answer::Candidates(vec![]), 400_020);
        let insert = Statement::Insert {
            lock_id: me.into(),
            now_ms: 400_000,
        };
        assert_eq!(step, Step::Send(insert));
        assert_eq!(t.answer(Answer::Done, inserted_ms), Step::Pause(SETTLE));
        let step = t.answer(Answer::Resumed, inserted_ms + SETTLE);
        assert_eq!(
            step,
            Step::Send(Statement::ReadCandidates { cutoff_s: 100 })
        );
        (t.answer(Answer::Candidates(all), inserted_ms + SETTLE), t)
    }

    fn held_by(step: Step) -> LockInfo {
        match step {
            Step::Done(Ok(Attempt::Held(info))) => info,
            other => panic!("expected the lock held, got {other:?}"),
        }
    }

    /// A loser withdraws its candidate, then names the winner.
    fn withdrawn(step: Step, mut t: Try, me: &str) -> LockInfo {
        let delete = Statement::Delete { lock_id: me.into() };
        assert_eq!(step, Step::Send(delete));
        held_by(t.answer(Answer::Done, 402_000))
    }

    #[test]
    fn a_live_candidate_holds_the_lock_and_nothing_is_inserted() {
        let (mut t, _) = Try::start("s", "me".into(), 400_000, LEASE, SETTLE);
        t.answer(Answer::Done, 400_000);
        let info = held_by(t.answer(Answer::Candidates(vec![candidate("b", 350)]), 400_000));
        assert_eq!(info.owner, "b");
        assert_eq!(
            (info.acquired_at_ms, info.expires_at_ms),
            (350_000, 350_000 + LEASE)
        );
    }

    #[test]
    fn alone_after_the_settle_the_try_is_granted_for_a_lease() {
        let (step, _) = decide("me", 400_050, vec![candidate("me", 400)]);
        match step {
            Step::Done(Ok(Attempt::Granted(handle))) => {
                assert_eq!(handle.owner, "me");
                assert_eq!(
                    (handle.acquired_at_ms, handle.lease_until_ms, handle.token),
                    (400_000, 400_000 + LEASE, 0)
                );
                assert_eq!(handle.mode, LockMode::Settle);
            }
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn of_fresh_candidates_the_lowest_id_wins() {
        let both = || vec![candidate("a", 400), candidate("m", 400)];
        let (step, t) = decide("m", 400_050, both());
        assert_eq!(withdrawn(step, t, "m").owner, "a");
        let (step, _) = decide("a", 400_050, both());
        assert!(
            matches!(step, Step::Done(Ok(Attempt::Granted(_)))),
            "{step:?}"
        );
    }

    /// A candidate stamped a settle window (or more) before this try's insert was acknowledged
    /// wins over a lower id: this insert landed late, and the other may already hold the lock.
    /// One stamped within the window does not.
    #[test]
    fn a_candidate_established_before_the_insert_wins_over_a_lower_id() {
        let established = || vec![candidate("a", 400), candidate("z", 399)];
        let (step, t) = decide("a", 400_050, established());
        assert_eq!(withdrawn(step, t, "a").owner, "z");
        // The window is at least a second, whatever the settle time.
        let (mut t, _) = Try::start("s", "a".into(), 400_000, LEASE, 0);
        t.answer(Answer::Done, 400_000);
        t.answer(Answer::Candidates(vec![]), 400_000);
        t.answer(Answer::Done, 400_050);
        t.answer(Answer::Resumed, 400_050);
        let step = t.answer(Answer::Candidates(established()), 400_050);
        assert_eq!(withdrawn(step, t, "a").owner, "z");
        let (step, _) = decide("a", 399_999, established());
        assert!(
            matches!(step, Step::Done(Ok(Attempt::Granted(_)))),
            "{step:?}"
        );
        // Established counts from when the insert was acknowledged, not from when the try
        // began (the original's rule, which let two holders in).
        let (mut t, _) = Try::start("s", "a".into(), 399_900, LEASE, SETTLE);
        t.answer(Answer::Done, 399_900);
        t.answer(Answer::Candidates(vec![]), 399_900);
        t.answer(Answer::Done, 400_050);
        t.answer(Answer::Resumed, 401_050);
        let step = t.answer(Answer::Candidates(established()), 401_050);
        assert_eq!(withdrawn(step, t, "a").owner, "z");
    }

    /// Its own candidate gone after the settle (merged away, or deleted as stale): the try
    /// withdraws and reports the lock held by someone unknown until a lease from its start.
    #[test]
    fn a_try_whose_candidate_vanished_withdraws() {
        let (step, t) = decide("me", 400_050, vec![]);
        let info = withdrawn(step, t, "me");
        assert_eq!(info.owner, "unknown");
        assert_eq!(info.expires_at_ms, 400_000 + LEASE);
    }

    #[test]
    fn a_failed_statement_ends_the_try_with_its_error() {
        let (mut t, _) = Try::start("s", "me".into(), 400_000, LEASE, SETTLE);
        let step = t.answer(Answer::Failed(Error::Unreachable("reset".into())), 400_000);
        assert!(
            matches!(step, Step::Done(Err(Error::Unreachable(_)))),
            "{step:?}"
        );
    }
}

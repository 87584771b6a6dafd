//! The fenced lock's `update`, as a sans-IO state machine: one round trip per update in steady
//! state.
//!
//! An update needs the lock, the stored state, and a write. Done one step at a time that is
//! four round trips (claim, read back, write, release). Here:
//!
//! - **Guarded writes.** The state write is an `INSERT ... SELECT ... FROM <lock log> HAVING
//!   guard`: the server writes the row only if the grant is the newest generation, claimed by this
//!   owner alone, neither released nor forced, and the stored version is still the one the update
//!   merged into (see [`crate::guard::Guard`]; [`crate::guard::admits`] is the same rule in
//!   Rust). `written_rows` says whether it wrote. The first write of a claim thereby also confirms the claim (the
//!   read-back's rule: the second of two contenders to check sees the other), so a first update
//!   is three round trips: read the newest generation with the state, claim, write.
//! - **Linger.** With `lock_linger_seconds`, the grant is kept after the update, with the
//!   state it wrote. The next update of the id merges into that state locally and sends one
//!   guarded write. A stale cache (someone wrote or deleted meanwhile) or a lost grant (forced
//!   open) makes the guard refuse: the update then reads what is there and tries again, or
//!   takes the lock anew. The lease is renewed once past its half; the host calls `idle` so
//!   that a grant idle for the linger is released, and `close` at exit.
//! - **Fencing.** Every write is at a version within the grant's lease, and the grant records
//!   the version before the write is sent: the write may land after its sender gave up (the
//!   server finishes an insert its client left), so the release cap must cover it. A version
//!   above the lease (something stored is newer than the lease) is first covered by a renewal
//!   to it, and nothing is written once a contender may see the lease ended.
//!
//! A refused write is never silent: its outcome is read back before anything is reported.
//!
//! The machine does no IO: it says what to send ([`Step::Send`]), when to pause and when it is
//! done, and takes the answers ([`Update::answer`]); time, tokens and the log come from an
//! [`Env`]. The component drives it over HTTP (`lock::drive`); the model (`model/`) drives the
//! very same type through its simulated ClickHouse.

mod claim;
mod grant;
mod kept;
mod limits;
mod renewal;
mod step;
mod write;

pub use grant::Grant;
pub use limits::{Limits, MIN_UPDATE_LEASE_MS, update_lease};
use renewal::AfterRenewal;
pub use renewal::{Renewal, Renewing};
pub use step::{Answer, Statement, Step};

use crate::env::{Env, Level};
use crate::error::{Error, Result};
use crate::fenced::{self};
use crate::grant::{Doubt, Kept, LockHandle, Memory, StoredRow};
use crate::wait::Wait;

fn unexpected(answer: &Answer) -> Error {
    Error::InvalidInput(format!(
        "the lock protocol got an answer it did not ask for: {answer:?}"
    ))
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Start,
    /// A grant too close to its lease end to write under is given back (best effort).
    HandingBack {
        kept: Kept,
    },
    Renewing {
        renewal: Renewal,
        basis: Option<StoredRow>,
        after: AfterRenewal,
    },
    /// Reading the newest generation and the state; `doubt`, a claim of ours whose fate is
    /// unknown, wins if it is the newest grant.
    ReadingOutlook {
        doubt: Option<Doubt>,
    },
    /// The claim is on its way.
    Claiming {
        ready: Grant,
    },
    /// The guarded write of `row` is on its way.
    Writing {
        ready: Grant,
        row: StoredRow,
    },
    /// Reading whether the grant is ours and what is stored, after a refused write of
    /// `attempted` (or before any write, to decide a claim).
    Rechecking {
        ready: Grant,
        attempted: Option<StoredRow>,
    },
    /// The write of `row` was acknowledged near the lease end: is the grant still the newest?
    Confirming {
        ready: Grant,
        row: StoredRow,
    },
    /// Releasing after the update (no linger).
    Releasing {
        handle: LockHandle,
        row: StoredRow,
    },
    /// Releasing after a failure; `error` is what the caller gets.
    Abandoning {
        handle: LockHandle,
        error: Error,
    },
    /// The `want` row for the holder is on its way; then this pause.
    Wanting {
        pause_ms: u64,
    },
    Pausing,
    Done,
}

/// One `update` of a state id under the fenced lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Update {
    state_id: String,
    /// The update's parts: JSON objects (validated by the caller).
    partial: String,
    completed: String,
    limits: Limits,
    deadline_ms: u64,
    wait: Wait,
    /// Refusals because the stored state changed under the current grant.
    refusals: u8,
    /// Grants given back because their lease ran out before the update could write.
    handed_back: u8,
    /// The current claim follows this instance's own last release without reading the log.
    guessed: bool,
    memory: Memory,
    phase: Phase,
}

/// Each refusal means someone wrote the id without its lock in between: a few are possible, an
/// endless stream is not something to chase.
const MAX_REFUSALS: u8 = 4;

/// A grant whose lease runs out before the update can write is given back and the lock taken
/// anew; the claims themselves are not bounded by the lock's timeout, so a server slower than
/// the lease would have the update claim forever.
const MAX_HAND_BACKS: u8 = 3;

impl Update {
    /// An update of `state_id` by `partial`/`completed` (JSON object texts), given what the lock
    /// remembers of the id; it gives up waiting for the lock `limits.timeout_ms` after `now_ms`.
    pub fn new(
        state_id: &str,
        partial: &str,
        completed: &str,
        limits: Limits,
        memory: Memory,
        now_ms: u64,
    ) -> Self {
        Update {
            state_id: state_id.to_string(),
            partial: partial.to_string(),
            completed: completed.to_string(),
            limits,
            deadline_ms: now_ms.saturating_add(limits.timeout_ms),
            wait: Wait::default(),
            refusals: 0,
            handed_back: 0,
            guessed: false,
            memory,
            phase: Phase::Start,
        }
    }

    /// What the lock remembers of the id now (give it back to the lock once done).
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    pub fn into_memory(self) -> Memory {
        self.memory
    }

    /// The first step: the kept grant, a claim in doubt that won, or a new claim (after
    /// reading the newest generation with the state, unless this instance released the newest
    /// generation itself).
    pub fn start(&mut self, env: &mut impl Env) -> Step {
        match self.memory.kept.take() {
            Some(kept) => self.resume(kept, env),
            None => self.prepare(env),
        }
    }

    /// Takes the answer to the last step.
    pub fn answer(&mut self, answer: Answer, env: &mut impl Env) -> Step {
        self.heed(&answer, env.now_ms());
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, answer) {
            (Phase::HandingBack { kept }, Answer::Appended) => {
                self.memory.released = Some(fenced::released(&kept.handle));
                self.memory.last_written = kept.basis;
                if self.handed_back >= MAX_HAND_BACKS {
                    return self.finish(Err(self.slower_than_the_lease()));
                }
                self.prepare(env)
            }
            (Phase::HandingBack { kept }, Answer::Failed(e)) => {
                env.log(
                    Level::Warn,
                    &format!("releasing an expiring lock failed; it ends with its lease: {e}"),
                );
                if self.memory.run_hold {
                    // Not released, but still the run's own newest generation: taken anew
                    // after its lease if nobody else took it meanwhile.
                    self.memory.released = Some(fenced::released(&kept.handle));
                }
                if self.handed_back >= MAX_HAND_BACKS {
                    return self.finish(Err(self.slower_than_the_lease()));
                }
                self.prepare(env)
            }
            (
                Phase::Renewing {
                    renewal,
                    basis,
                    after,
                },
                answer,
            ) => {
                let (renewal, next) = renewal.answer(answer, env.now_ms());
                self.renewing(renewal, next, basis, after, env)
            }
            (Phase::ReadingOutlook { doubt }, Answer::Outlook(outlook)) => {
                let now = env.now_ms();
                // A claim in doubt that followed the run's own release, still the newest: the
                // claim never landed, and nobody came between.
                let followed_own = doubt.as_ref().is_some_and(|d| {
                    (d.followed.generation, &d.followed.owner)
                        == (outlook.newest.generation, &outlook.newest.owner)
                        && outlook.newest.forced == 0
                });
                if let Some(doubt) = doubt
                    && outlook.newest.is_claim_of(&doubt.handle)
                    && now <= doubt.handle.lease_until_ms
                {
                    // The claim landed and is the newest grant. Whether it won is left to the
                    // guarded write, which holds it to the read-back rule: not confirmed yet.
                    env.log(
                        Level::Info,
                        &format!(
                            "the claim in doubt on {:?} (token {}) is the newest grant",
                            self.state_id, doubt.handle.token
                        ),
                    );
                    let ready = Grant {
                        handle: doubt.handle,
                        basis: outlook.stored,
                        claimed_after: Some(doubt.followed),
                    };
                    self.memory.released = None;
                    self.memory.last_written = None;
                    return self.write(ready, env);
                }
                let own = self.read_shared(&outlook.newest, now) || followed_own;
                if self.memory.run_hold && !own {
                    let why = match outlook.newest.info(&self.state_id) {
                        holder if outlook.newest.is_free(now) => {
                            format!("its grant (token {}) ended", holder.token)
                        }
                        holder => format!("{} has it (token {})", holder.owner, holder.token),
                    };
                    return self.hold_lost(&why);
                }
                self.claim_or_wait(outlook, env)
            }
            (Phase::ReadingOutlook { doubt }, Answer::Failed(e)) => {
                self.memory.doubt = doubt;
                self.finish(Err(e))
            }
            (Phase::Claiming { ready }, Answer::Appended) => self.write(ready, env),
            // The claim may have landed: keep it in doubt, for the next try to settle.
            (Phase::Claiming { ready }, Answer::Failed(e)) => self.fail(ready, e, env),
            (Phase::Writing { ready, row }, Answer::RowsWritten(Some(1))) => {
                self.written(ready, row, env)
            }
            // Refused (or the server did not say): read what decides it.
            (Phase::Writing { ready, row }, Answer::RowsWritten(_)) => {
                self.recheck(ready, Some(row))
            }
            (Phase::Writing { ready, row }, Answer::Failed(e)) if self.ran_out(&ready, &e, env) => {
                self.out_of_lease(ready, row, e, env)
            }
            (Phase::Writing { ready, .. }, Answer::Failed(e)) => self.fail(ready, e, env),
            (Phase::Rechecking { ready, attempted }, Answer::Claims(claims)) => {
                self.claims_read(ready, attempted, claims, env)
            }
            // A grant whose lease ended meanwhile goes on here too: `write` gives it back, and a
            // write that landed is confirmed in the log first (`written`).
            (Phase::Rechecking { ready, attempted }, Answer::Outlook(outlook)) => {
                if !outlook.newest.is_claim_of(&ready.handle) {
                    return self.lost(outlook.newest.info(&self.state_id), env);
                }
                self.rechecked(ready, attempted, outlook.stored, env)
            }
            (Phase::Rechecking { ready, .. }, Answer::Failed(e)) => self.fail(ready, e, env),
            (Phase::Confirming { ready, row }, Answer::NewestGeneration(newest)) => {
                if newest.still_held_by(&ready.handle) {
                    return self.succeed(ready, row, env);
                }
                let why = fenced::lost(
                    &ready.handle,
                    "a later holder has it, or it was forced open",
                );
                let error = Error::LockLost(format!(
                    "the write was acknowledged after the lease ended and may not count: {}",
                    match why {
                        Error::LockLost(why) => why,
                        other => other.to_string(),
                    }
                ));
                self.fail(ready, error, env)
            }
            (Phase::Confirming { ready, .. }, Answer::Failed(e)) => self.fail(ready, e, env),
            (Phase::Releasing { handle, row }, Answer::Appended) => {
                self.memory.released = Some(fenced::released(&handle));
                self.memory.last_written = Some(row);
                self.finish(Ok(()))
            }
            (Phase::Releasing { .. }, Answer::Failed(e)) => self.finish(Err(e)),
            (Phase::Abandoning { handle, error }, Answer::Appended) => {
                self.memory.released = Some(fenced::released(&handle));
                self.memory.last_written = None;
                self.finish(Err(error))
            }
            (Phase::Abandoning { handle, error }, Answer::Failed(e)) => {
                env.log(
                    Level::Warn,
                    &format!(
                        "releasing the lock on {:?} after a failed update failed; it ends with its lease: {e}",
                        handle.state_id
                    ),
                );
                self.finish(Err(error))
            }
            (Phase::Wanting { pause_ms }, Answer::Appended) => self.pause(pause_ms),
            (Phase::Wanting { pause_ms }, Answer::Failed(e)) => {
                env.log(
                    Level::Debug,
                    &format!(
                        "saying that the lock of {:?} is wanted failed: {e}",
                        self.state_id
                    ),
                );
                self.pause(pause_ms)
            }
            (Phase::Pausing, Answer::Resumed) => self.prepare(env),
            (_, answer) => self.finish(Err(unexpected(&answer))),
        }
    }

    fn slower_than_the_lease(&self) -> Error {
        Error::LockLost(format!(
            "the lease on {:?} ran out {} times before the update could write (the server is \
             slower than an update's lease allows: lock_timeout_seconds, at least 10 s, at most \
             lock_lease_seconds); the update was not acknowledged (a write given up on may still \
             land)",
            self.state_id, self.handed_back
        ))
    }

    fn finish(&mut self, result: Result<()>) -> Step {
        self.phase = Phase::Done;
        Step::Done(result)
    }
}

#[cfg(test)]
mod tests;

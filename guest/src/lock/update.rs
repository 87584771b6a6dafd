//! The fenced lock's `update`, as a sans-IO state machine: one round trip per update in steady
//! state.
//!
//! An update needs the lock, the stored state, and a write. Done one step at a time that is
//! four round trips (claim, read back, write, release). Here:
//!
//! - **Guarded writes.** The state write is an `INSERT ... SELECT ... FROM <lock log> HAVING
//!   guard`: the server writes the row only if the grant is the newest generation, claimed by this
//!   owner alone, neither released nor forced, and the stored version is still the one the update
//!   merged into (see [`Guard`]; [`fenced::admits`] is the same rule in Rust). `written_rows` says
//!   whether it wrote. The first write of a claim thereby also confirms the claim (the
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

use super::fenced::{self, ClaimOutcome, Event, LogEntry, NewestGeneration, Outlook};
use super::wait::Wait;
use super::{Doubt, Kept, LockHandle, Memory, Proposed, StoredRow, propose_version};
use crate::config::Config;
use crate::error::{Error, LockInfo, Result};
use crate::merge::{merged, parse_object};
use crate::retry;
use crate::rows::Claim;
use crate::session::Level;
use crate::sql::Guard;

/// What the protocol asks of its surroundings besides the statements: time, tokens, a log.
pub trait Env {
    fn now_ms(&self) -> u64;
    /// A fresh unique id (owners of claims, deduplication tokens of state writes).
    fn new_token(&mut self) -> String;
    fn random(&mut self) -> u64;
    fn log(&mut self, level: Level, message: &str);
}

/// The lock's timings, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The lease of the update's grant (see [`update_lease`]).
    pub lease_ms: u64,
    pub timeout_ms: u64,
    pub retry_ms: u64,
    pub linger_ms: u64,
    /// The longest pause of the driver's retries of a statement ([`retry::MAX_PAUSE_MS`]): a
    /// transient failure received less than this before a retry bound came from that bound.
    pub retry_pause_ms: u64,
}

impl Limits {
    pub fn of(config: &Config) -> Self {
        Limits {
            lease_ms: update_lease(
                config.lock_lease_ms,
                config.lock_timeout_ms,
                MIN_UPDATE_LEASE_MS,
            ),
            timeout_ms: config.lock_timeout_ms,
            retry_ms: config.lock_retry_ms,
            linger_ms: config.lock_linger_ms,
            retry_pause_ms: retry::MAX_PAUSE_MS,
        }
    }
}

/// The shortest lease of an update's grant: its margin for clock skew is a tenth of it (1 s).
pub const MIN_UPDATE_LEASE_MS: u64 = 10_000;

/// The lease of an update's grant: the lock timeout (Meltano's meaning of
/// `lock_timeout_seconds`: how long a lock stays valid once its holder goes quiet), at least
/// `min` ([`MIN_UPDATE_LEASE_MS`]; the model's ticks are not milliseconds) and at most the
/// lock's lease (`lock_lease_seconds`, for explicit locks, held across calls). An update takes
/// milliseconds and a kept grant is renewed by use once past half its lease, so the lease only
/// has to outlast the pause between two updates. A holder that was killed holds the id this
/// long at most, so a waiter that starts after the kill and waits the same timeout gets it.
pub fn update_lease(lock_lease: u64, lock_timeout: u64, min: u64) -> u64 {
    lock_timeout.max(min).min(lock_lease)
}

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
    fn send(statement: Statement) -> Step {
        Step::Send {
            statement,
            retry_until_ms: None,
        }
    }
}

/// A renewal of a confirmed grant's lease: check that the grant is still the newest, append the
/// renew row, and check again before adopting the new lease. The row can land after the lease
/// ended and a contender took the next generation (this holder stalled, or its clock is
/// behind); adopting the new lease then would let this holder's writes inside it skip the log
/// check and overwrite the newer holder's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Renewal {
    lock: LockHandle,
    until_ms: u64,
    stage: RenewStage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RenewStage {
    Check,
    Append,
    Confirm,
}

/// Where a renewal is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewing {
    Send(Statement),
    /// The lock with its new lease.
    Renewed(LockHandle),
    /// `lock-lost` (the log says the grant is not held), or the failure of a statement.
    Failed(Error, LockHandle),
}

impl Renewal {
    /// Starts renewing `lock` to `until_ms` at `now_ms`: refused when too close to the lease
    /// end, where renewing could race a contender that already saw the lease end.
    pub fn start(
        lock: LockHandle,
        until_ms: u64,
        now_ms: u64,
        lease_ms: u64,
    ) -> (Renewal, Renewing) {
        if fenced::near_lease_end(now_ms, lock.lease_until_ms, lease_ms) {
            let error = fenced::lost(&lock, "its lease ended before it was renewed");
            let renewal = Renewal {
                lock: lock.clone(),
                until_ms,
                stage: RenewStage::Check,
            };
            return (renewal, Renewing::Failed(error, lock));
        }
        let read = Statement::ReadNewest {
            state_id: lock.state_id.clone(),
        };
        let renewal = Renewal {
            lock,
            until_ms,
            stage: RenewStage::Check,
        };
        (renewal, Renewing::Send(read))
    }

    pub fn answer(self, answer: Answer, now_ms: u64) -> (Renewal, Renewing) {
        let Renewal {
            mut lock,
            until_ms,
            stage,
        } = self;
        let read = Statement::ReadNewest {
            state_id: lock.state_id.clone(),
        };
        let lost =
            |lock: &LockHandle| fenced::lost(lock, "a later holder has it, or it was forced open");
        let (stage, next) = match (stage, answer) {
            (RenewStage::Check, Answer::NewestGeneration(n)) if n.still_held_by(&lock) => {
                let mut renewed = lock.clone();
                renewed.lease_until_ms = until_ms;
                let row = fenced::entry(&renewed, Event::Renew, now_ms);
                (RenewStage::Append, Renewing::Send(Statement::Append(row)))
            }
            (RenewStage::Append, Answer::Appended) => (RenewStage::Confirm, Renewing::Send(read)),
            (RenewStage::Confirm, Answer::NewestGeneration(n)) if n.still_held_by(&lock) => {
                lock.lease_until_ms = until_ms;
                (stage, Renewing::Renewed(lock.clone()))
            }
            (_, Answer::Failed(e)) => (stage, Renewing::Failed(e, lock.clone())),
            (_, Answer::NewestGeneration(_)) => {
                (stage, Renewing::Failed(lost(&lock), lock.clone()))
            }
            (_, other) => (stage, Renewing::Failed(unexpected(&other), lock.clone())),
        };
        (
            Renewal {
                lock,
                until_ms,
                stage,
            },
            next,
        )
    }
}

fn unexpected(answer: &Answer) -> Error {
    Error::InvalidInput(format!(
        "the lock protocol got an answer it did not ask for: {answer:?}"
    ))
}

/// A grant an update may write under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    pub handle: LockHandle,
    /// The state the write merges into (partial, completed, version), none when none is stored.
    pub basis: Option<StoredRow>,
    /// The generation the claim replaced, while the claim is not yet confirmed (its first
    /// write confirms it); `None` once confirmed.
    pub claimed_after: Option<NewestGeneration>,
}

impl Grant {
    fn basis_version(&self) -> u64 {
        self.basis.as_ref().map_or(0, |(_, _, v)| *v)
    }

    pub fn guard(&self) -> Guard {
        Guard {
            state_id: self.handle.state_id.clone(),
            generation: self.handle.token,
            owner: self.handle.owner.clone(),
            confirmed: self.claimed_after.is_none(),
            previous_until: match &self.claimed_after {
                // Only a generation that ended by its lease can be renewed after it was read
                // (see `fenced::renewed_since`).
                Some(current) if current.released == 0 && current.forced == 0 => {
                    current.lease_until_ms
                }
                _ => u64::MAX,
            },
            expected_version: self.basis_version(),
        }
    }
}

/// What to do once a renewal of the update's grant is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AfterRenewal {
    /// A kept grant renewed past half its lease: if lost, claim anew; if it failed, keep it.
    Resume,
    /// A renewal covering a version above the lease: if lost, wait and claim anew.
    Write,
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
            (Phase::HandingBack { .. }, Answer::Failed(e)) => {
                env.log(
                    Level::Warn,
                    &format!("releasing an expiring lock failed; it ends with its lease: {e}"),
                );
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
                self.read_shared(&outlook.newest, now);
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

    /// A kept grant, if it can still be written under: renewed once past half its lease; given
    /// back when too close to its end to renew.
    fn resume(&mut self, kept: Kept, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        let lease = self.limits.lease_ms;
        if fenced::near_lease_end(now, kept.handle.lease_until_ms, lease) {
            return self.hand_back(kept, env);
        }
        if kept.handle.lease_until_ms.saturating_sub(now) < lease / 2 {
            let until = now.saturating_add(lease);
            let (renewal, next) = Renewal::start(kept.handle, until, now, lease);
            return self.renewing(renewal, next, kept.basis, AfterRenewal::Resume, env);
        }
        let ready = Grant {
            handle: kept.handle,
            basis: kept.basis,
            claimed_after: None,
        };
        self.write(ready, env)
    }

    /// Whether the guarded write failed because its retries reached the grant's lease (the
    /// driver tries no more once the next try would start past it): a transient failure,
    /// received no more than one retry pause before that bound.
    fn ran_out(&self, ready: &Grant, error: &Error, env: &impl Env) -> bool {
        let bound = ready
            .handle
            .lease_until_ms
            .saturating_sub(fenced::lease_margin_ms(self.limits.lease_ms));
        error.is_transient() && env.now_ms().saturating_add(self.limits.retry_pause_ms) >= bound
    }

    /// The server failed for longer than the grant's lease allowed the write to try: the write
    /// may still land, so the grant is given back with a cap covering its version (recorded
    /// before sending) and the lock taken anew, or, a claim not yet decided, kept in doubt (the
    /// next try settles it, and writes under it if it won). The update is then merged again
    /// into what is stored (the same update merged twice is the same state), as many times as
    /// a grant may run out (`MAX_HAND_BACKS`).
    fn out_of_lease(
        &mut self,
        ready: Grant,
        row: StoredRow,
        error: Error,
        env: &mut impl Env,
    ) -> Step {
        env.log(
            Level::Info,
            &format!(
                "the write of {:?} (version {}) failed until its lease ran out; taking the \
                 lock anew: {error}",
                self.state_id, row.2
            ),
        );
        if let Some(followed) = ready.claimed_after.clone() {
            self.handed_back += 1;
            if self.handed_back >= MAX_HAND_BACKS {
                return self.fail(ready, error, env);
            }
            self.memory.doubt = Some(Doubt {
                handle: ready.handle,
                followed,
            });
            return self.prepare(env);
        }
        let kept = Kept {
            handle: ready.handle,
            basis: ready.basis,
            last_used_ms: env.now_ms(),
            checked_ms: env.now_ms(),
        };
        self.hand_back(kept, env)
    }

    fn hand_back(&mut self, kept: Kept, env: &mut impl Env) -> Step {
        self.handed_back += 1;
        let row = fenced::entry(&kept.handle, Event::Release, env.now_ms());
        self.phase = Phase::HandingBack { kept };
        Step::send(Statement::Append(row))
    }

    fn renewing(
        &mut self,
        renewal: Renewal,
        next: Renewing,
        basis: Option<StoredRow>,
        after: AfterRenewal,
        env: &mut impl Env,
    ) -> Step {
        match next {
            Renewing::Send(statement) => {
                self.phase = Phase::Renewing {
                    renewal,
                    basis,
                    after,
                };
                Step::send(statement)
            }
            Renewing::Renewed(handle) => {
                let ready = Grant {
                    handle,
                    basis,
                    claimed_after: None,
                };
                self.write(ready, env)
            }
            Renewing::Failed(Error::LockLost(why), handle) => {
                env.log(Level::Info, &format!("the lock was lost: {why}"));
                match after {
                    AfterRenewal::Resume => self.prepare(env),
                    AfterRenewal::Write => {
                        let holder = LockInfo {
                            state_id: self.state_id.clone(),
                            owner: "unknown (a later holder, or forced open)".into(),
                            token: handle.token,
                            acquired_at_ms: handle.acquired_at_ms,
                            expires_at_ms: handle.lease_until_ms,
                        };
                        self.lost(holder, env)
                    }
                }
            }
            Renewing::Failed(e, handle) => match after {
                // Keep it: nothing says it is lost.
                AfterRenewal::Resume => {
                    self.memory.kept = Some(Kept {
                        handle,
                        basis,
                        last_used_ms: env.now_ms(),
                        checked_ms: env.now_ms(),
                    });
                    self.finish(Err(e))
                }
                AfterRenewal::Write => {
                    let ready = Grant {
                        handle,
                        basis,
                        claimed_after: None,
                    };
                    self.fail(ready, e, env)
                }
            },
        }
    }

    fn prepare(&mut self, env: &mut impl Env) -> Step {
        if let Some(doubt) = self.memory.doubt.take() {
            return self.read_outlook(Some(doubt));
        }
        // This instance released the newest generation itself (Meltano's pattern: one process
        // after another on one id): claim the next one without reading, with the state it
        // wrote last as the basis. If anyone else got in between, the guard refuses. A shared
        // id is read first (what it released is kept, to see whether anyone came between).
        if !self.memory.shared(env.now_ms())
            && let Some(last) = self.memory.released.take()
        {
            let outlook = Outlook {
                stored: self.memory.last_written.take(),
                newest: last,
            };
            self.guessed = true;
            return self.claim_or_wait(outlook, env);
        }
        self.read_outlook(None)
    }

    /// What the log read before a claim says of sharing: while the id is shared, a newest
    /// generation that is not this instance's own last release means the other is still at
    /// it, and the id stays shared for another lease. The basis it remembered is replaced by
    /// what was read.
    fn read_shared(&mut self, newest: &NewestGeneration, now: u64) {
        self.memory.last_written = None;
        let own = self.memory.released.take().is_some_and(|mine| {
            (mine.generation, &mine.owner) == (newest.generation, &newest.owner)
        });
        if self.memory.shared(now) && !own {
            self.share(now);
        }
    }

    /// A newest generation that another instance wants (a `want` row, written by a waiter) means
    /// the id is shared: a keeper that reads it (renewing, confirming) gives its grant back after
    /// this update instead of keeping it, so that the waiter does not wait out the linger, or
    /// the whole stream.
    fn heed(&mut self, answer: &Answer, now: u64) {
        let newest = match answer {
            Answer::NewestGeneration(newest) | Answer::Outlook(Outlook { newest, .. }) => newest,
            _ => return,
        };
        if newest.wanted != 0 {
            self.share(now);
        }
    }

    /// Another instance writes the id too: it stays shared for a lease.
    fn share(&mut self, now: u64) {
        self.memory.shared_until_ms = now.saturating_add(self.limits.lease_ms);
    }

    fn read_outlook(&mut self, doubt: Option<Doubt>) -> Step {
        self.guessed = false;
        self.phase = Phase::ReadingOutlook { doubt };
        Step::send(Statement::ReadOutlook {
            state_id: self.state_id.clone(),
        })
    }

    fn claim_or_wait(&mut self, outlook: Outlook, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        if !outlook.newest.is_free(now) {
            return self.wait(outlook.newest.info(&self.state_id), env);
        }
        let handle = fenced::claim_handle(
            &self.state_id,
            &outlook.newest,
            now,
            self.limits.lease_ms,
            env.new_token(),
        );
        let row = fenced::entry(&handle, Event::Acquire, now);
        // A new grant: the refusals under the last one tell nothing of this one.
        self.refusals = 0;
        self.phase = Phase::Claiming {
            ready: Grant {
                handle,
                basis: outlook.stored,
                claimed_after: Some(outlook.newest),
            },
        };
        Step::send(Statement::Append(row))
    }

    /// Merges the update into the grant's basis and writes it through the guard.
    fn write(&mut self, mut ready: Grant, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        let lease = self.limits.lease_ms;
        let unconfirmed = ready.claimed_after.is_some();
        if fenced::near_lease_end(now, ready.handle.lease_until_ms, lease) {
            // Too late to write: a contender may see the lease ended. A claim is decided first;
            // a confirmed grant is given back, and the lock taken anew.
            if unconfirmed {
                return self.recheck(ready, None);
            }
            let kept = Kept {
                handle: ready.handle,
                basis: ready.basis,
                last_used_ms: now,
                checked_ms: now,
            };
            return self.hand_back(kept, env);
        }
        let to_write = match self.merged(ready.basis.clone()) {
            Ok(parts) => parts,
            Err(e) => return self.fail(ready, e, env),
        };
        let version = match propose_version(&ready.handle, now, ready.basis_version()) {
            Err(e) => return self.fail(ready, e, env),
            Ok(Proposed::Within(v)) => v,
            // Something stored is newer than the lease: the lease must cover the version, or a
            // write landing after the lease ended could tie with or bury the next grant's.
            Ok(Proposed::AboveLease(v)) => {
                if unconfirmed {
                    return self.recheck(ready, None);
                }
                let until = now.saturating_add(lease).max(v);
                let (renewal, next) = Renewal::start(ready.handle, until, now, lease);
                return self.renewing(renewal, next, ready.basis, AfterRenewal::Write, env);
            }
        };
        // Recorded before the write is sent: it may land after this update gave up.
        ready.handle.last_written_ms = ready.handle.last_written_ms.max(version);
        let (partial, completed) = to_write;
        let statement = Statement::WriteGuarded {
            partial: partial.clone(),
            completed: completed.clone(),
            version_ms: version,
            guard: ready.guard(),
            token: env.new_token(),
        };
        let retry_until = ready
            .handle
            .lease_until_ms
            .saturating_sub(fenced::lease_margin_ms(lease));
        self.phase = Phase::Writing {
            ready,
            row: (Some(partial), Some(completed), version),
        };
        Step::Send {
            statement,
            retry_until_ms: Some(retry_until),
        }
    }

    /// After a refused (or unconfirmed) guarded write, or to decide a claim: is the grant
    /// ours, and what is stored?
    fn recheck(&mut self, ready: Grant, attempted: Option<StoredRow>) -> Step {
        let statement = if ready.claimed_after.is_some() {
            Statement::ReadClaims {
                state_id: self.state_id.clone(),
                generation: ready.handle.token,
            }
        } else {
            Statement::ReadOutlook {
                state_id: self.state_id.clone(),
            }
        };
        self.phase = Phase::Rechecking { ready, attempted };
        Step::send(statement)
    }

    fn claims_read(
        &mut self,
        mut ready: Grant,
        attempted: Option<StoredRow>,
        mut claims: Vec<Claim>,
        env: &mut impl Env,
    ) -> Step {
        let Some(current) = ready.claimed_after.take() else {
            return self.finish(Err(unexpected(&Answer::Claims(claims))));
        };
        let handle = &ready.handle;
        match fenced::decide_claim(&current, &claims, &handle.owner, handle.token) {
            ClaimOutcome::Mine => {
                let stored = claims.first_mut().and_then(|c| c.stored.pop());
                self.rechecked(ready, attempted, stored, env)
            }
            ClaimOutcome::GivesWay => {
                let mut info = current.info(&self.state_id);
                info.expires_at_ms = claims.first().map_or(0, |c| c.previous_until);
                self.lost(info, env)
            }
            ClaimOutcome::Lost => {
                let info = fenced::rival(&claims, handle);
                self.lost(info, env)
            }
        }
    }

    fn rechecked(
        &mut self,
        mut ready: Grant,
        attempted: Option<StoredRow>,
        stored: Option<StoredRow>,
        env: &mut impl Env,
    ) -> Step {
        ready.claimed_after = None;
        // The write itself may have landed (its answer was lost and the retry was refused):
        // then what is stored is exactly it.
        if let Some(row) = attempted.as_ref()
            && stored.as_ref() == Some(row)
        {
            ready.basis = stored;
            return self.written(ready, row.clone(), env);
        }
        ready.basis = stored;
        if attempted.is_some() {
            self.refusals += 1;
            if self.refusals >= MAX_REFUSALS {
                let error = Error::LockLost(format!(
                    "the state of {:?} kept changing under its lock (something writes it \
                     without the lock); the update was not written",
                    self.state_id
                ));
                return self.fail(ready, error, env);
            }
            env.log(
                Level::Debug,
                &format!(
                    "the state of {:?} changed since it was read; merging again",
                    self.state_id
                ),
            );
        }
        self.write(ready, env)
    }

    /// The write of `row` is stored. Near or past the lease's end, a contender may have taken
    /// the lock and read the state before the write landed (the write stalled, or was
    /// retried); its own write would then bury this one. The log says whether the write was in
    /// time: if the grant is still the newest, no contender has claimed yet.
    fn written(&mut self, mut ready: Grant, row: StoredRow, env: &mut impl Env) -> Step {
        ready.claimed_after = None;
        let now = env.now_ms();
        if fenced::near_lease_end(now, ready.handle.lease_until_ms, self.limits.lease_ms) {
            self.phase = Phase::Confirming { ready, row };
            return Step::send(Statement::ReadNewest {
                state_id: self.state_id.clone(),
            });
        }
        self.succeed(ready, row, env)
    }

    /// After a successful update: keep the grant for the linger (unless the id is shared), or
    /// release it.
    fn succeed(&mut self, ready: Grant, row: StoredRow, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        if self.limits.linger_ms > 0 && !self.memory.shared(now) {
            self.memory.kept = Some(Kept {
                handle: ready.handle,
                basis: Some(row),
                last_used_ms: now,
                checked_ms: now,
            });
            return self.finish(Ok(()));
        }
        let release = fenced::entry(&ready.handle, Event::Release, now);
        self.phase = Phase::Releasing {
            handle: ready.handle,
            row,
        };
        Step::send(Statement::Append(release))
    }

    /// After a failure: a confirmed grant is released (its cap covers every version written
    /// under it, landed or not); a claim whose fate is unknown is kept in doubt, so that the
    /// next try (or giving up) settles it. The failure is what the caller sees.
    fn fail(&mut self, ready: Grant, error: Error, env: &mut impl Env) -> Step {
        if let Some(followed) = ready.claimed_after {
            self.memory.doubt = Some(Doubt {
                handle: ready.handle,
                followed,
            });
            return self.finish(Err(error));
        }
        let release = fenced::entry(&ready.handle, Event::Release, env.now_ms());
        self.phase = Phase::Abandoning {
            handle: ready.handle,
            error,
        };
        Step::send(Statement::Append(release))
    }

    /// The grant is not this update's: wait as for any holder, then take the lock anew. A claim
    /// that followed this instance's own release without reading only shows that someone came
    /// between: the log says at once whether they still hold the id.
    fn lost(&mut self, holder: LockInfo, env: &mut impl Env) -> Step {
        env.log(
            Level::Info,
            &format!(
                "the update of {:?} lost its grant to {} (token {}); taking the lock again",
                self.state_id, holder.owner, holder.token
            ),
        );
        self.share(env.now_ms());
        if self.guessed {
            return self.read_outlook(None);
        }
        self.wait(holder, env)
    }

    /// One pause of the wait loop while `holder` has the lock (see `wait`): `locked` once the
    /// deadline has passed.
    fn wait(&mut self, holder: LockInfo, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        self.share(now);
        if now >= self.deadline_ms {
            return self.finish(Err(Error::Locked(holder)));
        }
        let jitter = 80 + env.random() % 41;
        let pause = self
            .wait
            .pause_ms(holder.token, self.limits.retry_ms, jitter)
            .clamp(1, self.deadline_ms - now);
        if self.wait.should_want(holder.token) {
            let row = fenced::want(&holder, now);
            self.phase = Phase::Wanting { pause_ms: pause };
            // A hint: one try, no retry (it must not delay the wait it announces).
            return Step::Send {
                statement: Statement::Append(row),
                retry_until_ms: Some(now),
            };
        }
        self.pause(pause)
    }

    fn pause(&mut self, pause_ms: u64) -> Step {
        self.phase = Phase::Pausing;
        Step::Pause(pause_ms)
    }

    /// The state to write: the update merged into `basis` (see [`merged`]).
    fn merged(&self, basis: Option<StoredRow>) -> Result<(String, String)> {
        let partial = parse_object(&self.partial, "partial state")?;
        let completed = parse_object(&self.completed, "completed state")?;
        Ok(merged(partial, completed, basis.map(|(p, c, _)| (p, c))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Clock {
        now: u64,
        tokens: u64,
    }

    impl Env for Clock {
        fn now_ms(&self) -> u64 {
            self.now
        }
        fn new_token(&mut self) -> String {
            self.tokens += 1;
            format!("t{}", self.tokens)
        }
        fn random(&mut self) -> u64 {
            0
        }
        fn log(&mut self, _: Level, _: &str) {}
    }

    const LIMITS: Limits = Limits {
        lease_ms: 10_000,
        timeout_ms: 10_000,
        retry_ms: 100,
        linger_ms: 5_000,
        retry_pause_ms: 2_000,
    };

    fn claims_of(statement: &Statement, owner: &str, generation: u64) -> Vec<Claim> {
        assert!(
            matches!(statement, Statement::ReadClaims { .. }),
            "{statement:?}"
        );
        vec![Claim {
            owner: owner.into(),
            at_ms: 0,
            until_ms: 0,
            newest: generation,
            previous_until: 0,
            stored: vec![],
        }]
    }

    /// A server so slow that every claim lands when its lease is nearly over: the update gives
    /// its grants back and claims anew a bounded number of times, then fails, instead of
    /// claiming forever (nothing in that cycle waits, so the lock's timeout never ends it).
    #[test]
    fn an_update_whose_every_claim_outlasts_its_lease_gives_up() {
        // whether the grants are given back or their release fails
        for releases_fail in [false, true] {
            every_claim_outlasts_its_lease(releases_fail);
        }
    }

    fn every_claim_outlasts_its_lease(releases_fail: bool) {
        let mut env = Clock { now: 0, tokens: 0 };
        let memory = Memory::default();
        let mut update = Update::new("s", "{\"a\":1}", "{}", LIMITS, memory, 0);
        let mut step = update.start(&mut env);
        let mut claims = 0;
        for _ in 0..100 {
            let Step::Send { statement, .. } = step.clone() else {
                break;
            };
            let answer = match &statement {
                Statement::ReadOutlook { .. } => Answer::Outlook(Outlook::default()),
                Statement::Append(entry) if entry.event == Event::Acquire => {
                    claims += 1;
                    // the claim's answer comes back at the end of its lease
                    env.now = entry.until_ms;
                    Answer::Appended
                }
                Statement::Append(_) if releases_fail => {
                    Answer::Failed(Error::Unreachable("reset".into()))
                }
                Statement::Append(_) => Answer::Appended,
                Statement::ReadClaims { generation, .. } => {
                    let owner = format!("t{}", env.tokens);
                    Answer::Claims(claims_of(&statement, &owner, *generation))
                }
                other => panic!("unexpected {other:?}"),
            };
            step = update.answer(answer, &mut env);
        }
        match step {
            Step::Done(Err(Error::LockLost(why))) => {
                assert!(why.contains("ran out 3 times"), "{why}");
            }
            other => panic!("expected the update to give up, got {other:?}"),
        }
        assert_eq!(claims, 3);
        // The last grant was given back: the next update claims without reading first.
        assert_eq!(update.memory().released.is_some(), !releases_fail);
    }

    /// A server that fails every write of a claim not yet confirmed until the grant's lease runs
    /// out: each time the claim is kept in doubt and the lock taken anew, a bounded number of
    /// times (`MAX_HAND_BACKS`), then the update fails, instead of claiming forever.
    #[test]
    fn an_update_whose_unconfirmed_writes_all_outlast_their_lease_gives_up() {
        let mut env = Clock { now: 0, tokens: 0 };
        let mut update = Update::new("s", "{\"a\":1}", "{}", LIMITS, Memory::default(), 0);
        let mut step = update.start(&mut env);
        let (mut claims, mut writes, mut lease_until) = (0, 0, 0);
        for _ in 0..100 {
            let Step::Send { statement, .. } = step.clone() else {
                break;
            };
            let answer = match &statement {
                Statement::ReadOutlook { .. } => Answer::Outlook(Outlook::default()),
                Statement::ReadNewest { .. } => Answer::NewestGeneration(Default::default()),
                Statement::Append(entry) if entry.event == Event::Acquire => {
                    claims += 1;
                    lease_until = entry.until_ms;
                    Answer::Appended
                }
                Statement::Append(_) => Answer::Appended,
                Statement::ReadClaims { generation, .. } => {
                    let owner = format!("t{}", env.tokens);
                    Answer::Claims(claims_of(&statement, &owner, *generation))
                }
                Statement::WriteGuarded { guard, .. } => {
                    assert!(!guard.confirmed, "every write is the unconfirmed claim's");
                    writes += 1;
                    // the write fails until the lease has run out
                    env.now = lease_until;
                    Answer::Failed(Error::Unreachable("reset".into()))
                }
            };
            step = update.answer(answer, &mut env);
        }
        assert!(
            matches!(step, Step::Done(Err(Error::Unreachable(_)))),
            "expected the update to give up, got {step:?}"
        );
        assert_eq!((claims, writes), (3, 3));
    }

    /// An update's grant lasts the lock timeout, within [10 s, `lock_lease_seconds`]: with
    /// Meltano's 10 s a killed holder keeps the id 10 s at most, not the explicit lock's 300 s.
    #[test]
    fn an_updates_lease_is_the_lock_timeout_within_bounds() {
        for ((lease, timeout), expected) in [
            ((300_000, 10_000), 10_000),
            ((300_000, 30_000), 30_000),
            ((300_000, 2_000), MIN_UPDATE_LEASE_MS),
            ((300_000, 900_000), 300_000),
            ((4_000, 30_000), 4_000),
        ] {
            assert_eq!(
                update_lease(lease, timeout, MIN_UPDATE_LEASE_MS),
                expected,
                "{lease} {timeout}"
            );
        }
        let config = Config::parse(
            "clickhouse://u@h/db",
            &[("lock_timeout_seconds".to_string(), "10".to_string())],
        )
        .expect("a configuration");
        assert_eq!(config.lock_lease_ms, 300_000);
        let mut env = clock();
        let limits = Limits::of(&config);
        let mut update = Update::new("s", "{}", "{}", limits, Memory::default(), env.now);
        update.start(&mut env);
        let claim = append_of(&update.answer(Answer::Outlook(Outlook::default()), &mut env));
        assert_eq!(
            (claim.event, claim.until_ms),
            (Event::Acquire, env.now + 10_000)
        );
    }

    /// The server is down for longer than the grant's lease lets the write try: the grant is
    /// given back with a cap covering the version that may still land, the lock taken anew and
    /// the update written under the new grant. A failure with time left on the lease, or one
    /// that is not transient, fails the update as before.
    #[test]
    fn a_write_that_fails_until_the_lease_ends_is_written_under_a_new_grant() {
        let mut env = clock();
        let handle = grant(5, env.now + 8_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        let (attempted, _) = write_of(&update.start(&mut env));
        // the driver's retries stop one pause before the lease's margin
        env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
        let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
        let release = append_of(&update.answer(Answer::Failed(down.clone()), &mut env));
        assert_eq!(release.event, Event::Release);
        assert_eq!(release.generation, 5);
        assert!(release.until_ms >= attempted, "the cap covers the write");
        // released: the next grant follows it without a read
        let claim = append_of(&update.answer(Answer::Appended, &mut env));
        assert_eq!((claim.event, claim.generation), (Event::Acquire, 6));
        assert!(claim.floor_ms > attempted, "the new grant writes above it");
        let (version, guard) = write_of(&update.answer(Answer::Appended, &mut env));
        assert_eq!(guard.generation, 6);
        assert!(version > attempted);
        assert_eq!(
            update.answer(Answer::RowsWritten(Some(1)), &mut env),
            Step::Done(Ok(()))
        );
        // With time left, or a permanent error: released, and the caller gets the error.
        for (left, error) in [(5_000, down), (1_000, Error::InvalidInput("bad".into()))] {
            let mut env = clock();
            let handle = grant(5, env.now + 8_000);
            let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
            write_of(&update.start(&mut env));
            env.now = handle.lease_until_ms - left;
            let release = append_of(&update.answer(Answer::Failed(error.clone()), &mut env));
            assert_eq!(release.event, Event::Release);
            assert_eq!(
                update.answer(Answer::Appended, &mut env),
                Step::Done(Err(error))
            );
        }
    }

    /// A claim's first write fails until the claim's lease is nearly over: nobody knows whether
    /// the claim won, so it is kept in doubt (not released: it may not be this update's to
    /// release) and the log read to settle it; found taken by another meanwhile, the update
    /// waits for that holder.
    #[test]
    fn a_claims_write_that_fails_until_its_lease_ends_leaves_the_claim_in_doubt() {
        let mut env = clock();
        let mut update = update_with(Memory::default(), &env);
        update.start(&mut env);
        let free = Outlook {
            newest: NewestGeneration {
                released: 1,
                ..rival(3, env.now - 1_000)
            },
            stored: Some(row(95_000)),
        };
        let claim = append_of(&update.answer(Answer::Outlook(free), &mut env));
        write_of(&update.answer(Answer::Appended, &mut env));
        env.now = claim.until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
        let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
        let step = update.answer(Answer::Failed(down), &mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        let Phase::ReadingOutlook { doubt: Some(doubt) } = &update.phase else {
            panic!("the claim is not in doubt: {:?}", update.phase);
        };
        assert_eq!((doubt.handle.token, doubt.followed.generation), (4, 3));
        let taken = Outlook {
            newest: rival(5, env.now + 9_000),
            stored: None,
        };
        let step = update.answer(Answer::Outlook(taken), &mut env);
        assert!(matches!(
            past_want(&mut update, step, &mut env),
            Step::Pause(_)
        ));
    }

    /// A kept grant's write fails until its lease ends, and so does the release that gives it
    /// back: the grant ends with its lease, and the update reads the log for a new claim (it
    /// follows no release of its own).
    #[test]
    fn a_failed_release_while_handing_back_leads_to_a_read_not_a_guess() {
        let mut env = clock();
        let handle = grant(5, env.now + 8_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        write_of(&update.start(&mut env));
        env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
        let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
        let release = append_of(&update.answer(Answer::Failed(down.clone()), &mut env));
        assert_eq!((release.event, release.generation), (Event::Release, 5));
        let step = update.answer(Answer::Failed(down), &mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        assert!(update.memory().released.is_none());
    }

    /// Without a linger the grant is released once the write is stored, its cap the version
    /// written; the next update of this instance follows it without reading first.
    #[test]
    fn without_linger_the_grant_is_released_after_the_write() {
        let mut env = clock();
        let limits = Limits {
            linger_ms: 0,
            ..LIMITS
        };
        let mut update = Update::new("s", "{}", "{}", limits, Memory::default(), env.now);
        update.start(&mut env);
        update.answer(Answer::Outlook(Outlook::default()), &mut env);
        let (version, _) = write_of(&update.answer(Answer::Appended, &mut env));
        let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
        assert_eq!((release.event, release.until_ms), (Event::Release, version));
        assert_eq!(
            update.answer(Answer::Appended, &mut env),
            Step::Done(Ok(()))
        );
        let memory = update.into_memory();
        assert!(memory.kept.is_none());
        assert_eq!(memory.released.map(|n| n.release_cap_ms), Some(version));
    }

    /// What this instance released last: generation 3, owned by "me".
    fn own_release() -> NewestGeneration {
        fenced::released(&grant(3, 95_000))
    }

    /// Two writers alternating on one id: the second finds the first's grant (kept, or just
    /// taken) and waits; from then on the id is shared, and neither keeps a grant after an
    /// update, so neither waits for the other's linger.
    #[test]
    fn an_update_that_waited_keeps_no_grant_afterwards() {
        let mut env = clock();
        let mut update = update_with(Memory::default(), &env);
        update.start(&mut env);
        let outlook = Outlook {
            newest: rival(3, env.now + 5_000),
            stored: None,
        };
        let step = update.answer(Answer::Outlook(outlook), &mut env);
        assert!(matches!(
            past_want(&mut update, step, &mut env),
            Step::Pause(_)
        ));
        assert!(update.memory().shared(env.now));
        env.now += 6_000;
        update.answer(Answer::Resumed, &mut env);
        let freed = Outlook {
            newest: NewestGeneration {
                released: 1,
                ..rival(3, env.now - 1_000)
            },
            stored: Some(row(95_000)),
        };
        update.answer(Answer::Outlook(freed), &mut env);
        update.answer(Answer::Appended, &mut env);
        let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
        assert_eq!((release.event, release.generation), (Event::Release, 4));
        update.answer(Answer::Appended, &mut env);
        let memory = update.into_memory();
        assert!(memory.kept.is_none() && memory.shared(env.now));
    }

    /// A shared id is read before it is claimed, though this instance released the last
    /// generation it knows of, and its grant is given back after the write. Its own release
    /// found the newest, the mark runs out as it was; another's, and it lasts another lease.
    /// Once it has run out, the claim follows the own release without reading, and the grant
    /// is kept.
    #[test]
    fn a_shared_id_is_read_first_and_stays_shared_while_another_writes_it() {
        let mut env = clock();
        let until = env.now + 5_000;
        let memory = Memory {
            released: Some(own_release()),
            last_written: Some(row(95_000)),
            shared_until_ms: until,
            ..Memory::default()
        };
        let alone = Outlook {
            newest: own_release(),
            stored: Some(row(95_000)),
        };
        let mut update = update_with(memory.clone(), &env);
        let step = update.start(&mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        update.answer(Answer::Outlook(alone), &mut env);
        update.answer(Answer::Appended, &mut env);
        let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
        assert_eq!(release.event, Event::Release);
        update.answer(Answer::Appended, &mut env);
        let after = update.into_memory();
        assert_eq!(after.shared_until_ms, until, "not extended");
        assert!(after.kept.is_none());

        // Someone else's generation is the newest: shared for another lease.
        let mut update = update_with(memory.clone(), &env);
        update.start(&mut env);
        let other = Outlook {
            newest: NewestGeneration {
                released: 1,
                ..rival(4, env.now - 1_000)
            },
            stored: Some(row(96_000)),
        };
        update.answer(Answer::Outlook(other), &mut env);
        assert_eq!(update.memory().shared_until_ms, env.now + LIMITS.lease_ms);

        // Run out: a claim without reading, and the grant kept.
        env.now = until;
        let mut update = update_with(memory, &env);
        let claim = append_of(&update.start(&mut env));
        assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
        update.answer(Answer::Appended, &mut env);
        assert_eq!(
            update.answer(Answer::RowsWritten(Some(1)), &mut env),
            Step::Done(Ok(()))
        );
        assert!(update.memory().kept.is_some());
    }

    /// A claim that followed this instance's own release without reading, lost to a claim that
    /// came between: the log is read at once (no pause: that claimant may be done already), and
    /// the id is shared from then on.
    #[test]
    fn a_lost_claim_that_followed_its_own_release_reads_the_log_at_once() {
        let mut env = clock();
        let memory = Memory {
            released: Some(own_release()),
            last_written: Some(row(95_000)),
            ..Memory::default()
        };
        let mut update = update_with(memory, &env);
        let claim = append_of(&update.start(&mut env));
        assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
        update.answer(Answer::Appended, &mut env);
        let step = update.answer(Answer::RowsWritten(Some(0)), &mut env);
        let claims = claims_of(sent(&step), "rival", 4);
        let step = update.answer(Answer::Claims(claims), &mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        assert!(update.memory().shared(env.now));
        // Found held: a claim read from the log that loses is waited for, as any holder is.
        let held_by_rival = Outlook {
            newest: rival(4, env.now + 5_000),
            stored: None,
        };
        let step = update.answer(Answer::Outlook(held_by_rival), &mut env);
        assert!(matches!(
            past_want(&mut update, step, &mut env),
            Step::Pause(_)
        ));
    }

    /// An unconfirmed grant's writes are refused once the generation its claim replaced, free
    /// only because its lease had ended, is renewed past that end; a released or forced one, or
    /// a confirmed grant, sets no such bound.
    #[test]
    fn an_unconfirmed_grant_guards_against_a_renewal_of_the_generation_it_replaced() {
        let guard_after = |claimed_after: Option<NewestGeneration>| {
            Grant {
                handle: grant(4, 90_000),
                basis: None,
                claimed_after,
            }
            .guard()
            .previous_until
        };
        let expired = held(&grant(3, 60_000));
        assert_eq!(guard_after(Some(expired.clone())), 60_000);
        let released = NewestGeneration {
            released: 1,
            ..expired.clone()
        };
        assert_eq!(guard_after(Some(released)), u64::MAX);
        let forced = NewestGeneration {
            forced: 1,
            ..expired
        };
        assert_eq!(guard_after(Some(forced)), u64::MAX);
        assert_eq!(guard_after(None), u64::MAX, "confirmed");
    }

    fn grant(token: u64, lease_until_ms: u64) -> LockHandle {
        LockHandle {
            state_id: "s".into(),
            owner: "me".into(),
            token,
            acquired_at_ms: 0,
            lease_until_ms,
            floor_ms: 0,
            last_written_ms: 0,
            mode: crate::config::LockMode::Fenced,
        }
    }

    /// The log's newest generation: `handle`'s grant, open.
    fn held(handle: &LockHandle) -> NewestGeneration {
        NewestGeneration {
            generation: handle.token,
            owner: handle.owner.clone(),
            lease_until_ms: handle.lease_until_ms,
            ..NewestGeneration::default()
        }
    }

    /// A later generation, held by someone else until `until`.
    fn rival(token: u64, until: u64) -> NewestGeneration {
        NewestGeneration {
            generation: token,
            owner: "rival".into(),
            lease_until_ms: until,
            ..NewestGeneration::default()
        }
    }

    fn kept(handle: LockHandle, basis: Option<StoredRow>) -> Memory {
        Memory {
            kept: Some(Kept {
                handle,
                basis,
                last_used_ms: 0,
                checked_ms: 0,
            }),
            ..Memory::default()
        }
    }

    fn row(version: u64) -> StoredRow {
        (Some("{}".into()), Some("{\"v\":1}".into()), version)
    }

    /// A waiter says it wants the grant it waits for, once, before its pause: the step after
    /// that row.
    fn past_want(update: &mut Update, step: Step, env: &mut impl Env) -> Step {
        match &step {
            Step::Send {
                statement: Statement::Append(row),
                retry_until_ms,
            } if row.event == Event::Want => {
                assert_eq!(*retry_until_ms, Some(env.now_ms()), "a hint is not retried");
                update.answer(Answer::Appended, env)
            }
            _ => step,
        }
    }

    fn sent(step: &Step) -> &Statement {
        match step {
            Step::Send { statement, .. } => statement,
            other => panic!("expected a statement, got {other:?}"),
        }
    }

    /// The guarded write `step` sends: (version, guard).
    fn write_of(step: &Step) -> (u64, Guard) {
        match sent(step) {
            Statement::WriteGuarded {
                version_ms, guard, ..
            } => (*version_ms, guard.clone()),
            other => panic!("expected a guarded write, got {other:?}"),
        }
    }

    fn append_of(step: &Step) -> LogEntry {
        match sent(step) {
            Statement::Append(entry) => entry.clone(),
            other => panic!("expected a row of the lock log, got {other:?}"),
        }
    }

    /// A clock at 100 s.
    fn clock() -> Clock {
        Clock {
            now: 100_000,
            tokens: 0,
        }
    }

    /// A kept grant (generation 5, 8 s of lease left, state at 90 s) whose write was refused:
    /// the update, reading back what decides it, and the version it tried.
    fn refused_kept_write(env: &mut Clock) -> (Update, LockHandle, u64) {
        let handle = grant(5, env.now + 8_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), env);
        let (attempted, _) = write_of(&update.start(env));
        let step = update.answer(Answer::RowsWritten(Some(0)), env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        (update, handle, attempted)
    }

    fn update_with(memory: Memory, env: &Clock) -> Update {
        Update::new("s", "{\"a\":1}", "{}", LIMITS, memory, env.now)
    }

    /// A kept grant with less than half its lease left is renewed (checked in the log, the renew
    /// row appended, checked again) before the write, which then goes under the new lease; with
    /// half or more left it is written under at once.
    #[test]
    fn a_kept_grant_past_half_its_lease_is_renewed_before_the_write() {
        let mut env = clock();
        let handle = grant(5, env.now + 4_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        let step = update.start(&mut env);
        assert!(
            matches!(sent(&step), Statement::ReadNewest { .. }),
            "{step:?}"
        );
        let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
        let renew = append_of(&step);
        assert_eq!(
            (renew.event, renew.until_ms),
            (Event::Renew, env.now + LIMITS.lease_ms)
        );
        let step = update.answer(Answer::Appended, &mut env);
        assert!(
            matches!(sent(&step), Statement::ReadNewest { .. }),
            "{step:?}"
        );
        let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
        let (version, guard) = write_of(&step);
        assert_eq!(
            (version, guard.generation, guard.confirmed),
            (env.now, 5, true)
        );
        let step = update.answer(Answer::RowsWritten(Some(1)), &mut env);
        assert_eq!(step, Step::Done(Ok(())));
        let memory = update.into_memory();
        let after = memory.kept.expect("the grant is kept for the linger");
        assert_eq!(after.handle.lease_until_ms, env.now + LIMITS.lease_ms);
        assert_eq!(after.basis.map(|(_, _, v)| v), Some(env.now));

        for left in [LIMITS.lease_ms / 2, LIMITS.lease_ms / 2 + 1_000] {
            let handle = grant(5, env.now + left);
            let mut update = update_with(kept(handle, Some(row(90_000))), &env);
            let step = update.start(&mut env);
            assert_eq!(write_of(&step).0, env.now, "{left} ms left");
        }
    }

    /// A stream's renewal that finds its grant wanted (another instance appended a `want` row
    /// while it waited) writes, then gives the grant back instead of keeping it: the waiter
    /// gets the id after this update, not after the stream.
    #[test]
    fn a_kept_grant_found_wanted_is_given_back_after_the_write() {
        let mut env = clock();
        let handle = grant(5, env.now + 4_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        let wanted = NewestGeneration {
            wanted: 1,
            ..held(&handle)
        };
        update.start(&mut env);
        let step = update.answer(Answer::NewestGeneration(wanted.clone()), &mut env);
        assert_eq!(append_of(&step).event, Event::Renew);
        update.answer(Answer::Appended, &mut env);
        let step = update.answer(Answer::NewestGeneration(wanted), &mut env);
        write_of(&step);
        let step = update.answer(Answer::RowsWritten(Some(1)), &mut env);
        assert_eq!(append_of(&step).event, Event::Release, "{step:?}");
        assert_eq!(
            update.answer(Answer::Appended, &mut env),
            Step::Done(Ok(()))
        );
        let memory = update.into_memory();
        assert!(memory.kept.is_none());
        assert!(memory.shared(env.now));
    }

    /// A waiter says once per holder that it wants the lock, and only then pauses; the row
    /// names the holder's generation, and its failure does not end the wait.
    #[test]
    fn a_waiter_wants_each_holder_once() {
        let mut env = clock();
        let mut update = update_with(Memory::default(), &env);
        update.start(&mut env);
        let until = env.now + 60_000;
        let held = |token| Outlook {
            newest: rival(token, until),
            stored: None,
        };
        let step = update.answer(Answer::Outlook(held(6)), &mut env);
        let want = append_of(&step);
        assert_eq!(
            (fenced::wanted_generation(&want), want.generation),
            (Some(6), 0),
            "generation 6 wanted, in generation 0 (never a grant's)"
        );
        assert_eq!(want.state_id, "s");
        let failed = Error::Unreachable("down".into());
        assert!(matches!(
            update.answer(Answer::Failed(failed), &mut env),
            Step::Pause(_)
        ));
        update.answer(Answer::Resumed, &mut env);
        let step = update.answer(Answer::Outlook(held(6)), &mut env);
        assert!(
            matches!(step, Step::Pause(_)),
            "the same holder again: {step:?}"
        );
        update.answer(Answer::Resumed, &mut env);
        let step = update.answer(Answer::Outlook(held(7)), &mut env);
        assert_eq!(fenced::wanted_generation(&append_of(&step)), Some(7));
    }

    /// A renewal whose renew row landed after a later generation was claimed (the holder
    /// stalled, or its clock is behind) does not adopt the new lease: writes inside it would
    /// skip the log check and could overwrite the newer holder's state.
    #[test]
    fn a_renewal_that_finds_a_later_generation_is_not_adopted() {
        let now = 100_000;
        let handle = grant(5, now + 4_000);
        let until = now + LIMITS.lease_ms;
        let (renewal, next) = Renewal::start(handle.clone(), until, now, LIMITS.lease_ms);
        assert!(matches!(next, Renewing::Send(Statement::ReadNewest { .. })));
        let (renewal, next) = renewal.answer(Answer::NewestGeneration(held(&handle)), now);
        assert!(matches!(next, Renewing::Send(Statement::Append(_))));
        let (renewal, next) = renewal.answer(Answer::Appended, now);
        assert!(matches!(next, Renewing::Send(Statement::ReadNewest { .. })));
        let (_, next) = renewal.answer(Answer::NewestGeneration(rival(6, until)), now);
        assert!(
            matches!(next, Renewing::Failed(Error::LockLost(_), ref h) if h.lease_until_ms == handle.lease_until_ms),
            "{next:?}"
        );

        // Found before the renew row is sent: nothing is appended.
        let (renewal, _) = Renewal::start(handle.clone(), until, now, LIMITS.lease_ms);
        let (_, next) = renewal.answer(Answer::NewestGeneration(rival(6, until)), now);
        assert!(
            matches!(next, Renewing::Failed(Error::LockLost(_), _)),
            "{next:?}"
        );
    }

    /// A kept grant that turns out lost when renewed: the update takes the lock anew.
    #[test]
    fn a_kept_grant_found_lost_is_taken_anew() {
        let mut env = clock();
        let handle = grant(5, env.now + 4_000);
        let mut update = update_with(kept(handle, None), &env);
        update.start(&mut env);
        let step = update.answer(
            Answer::NewestGeneration(rival(6, env.now + 9_000)),
            &mut env,
        );
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
    }

    /// A first write goes under the claim's guard: the stored version it merged into, the
    /// claim not yet confirmed, and the generation it followed, which was released, not
    /// checked for a late renewal (only a generation that ended by its lease can be renewed
    /// after it was read).
    #[test]
    fn a_first_write_is_guarded_by_what_it_merged_into() {
        let mut env = clock();
        let mut update = update_with(Memory::default(), &env);
        let step = update.start(&mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        let released = NewestGeneration {
            generation: 3,
            owner: "before".into(),
            lease_until_ms: env.now + 2_000,
            released: 1,
            release_cap_ms: 95_000,
            ..NewestGeneration::default()
        };
        let outlook = Outlook {
            newest: released.clone(),
            stored: Some(row(95_000)),
        };
        let step = update.answer(Answer::Outlook(outlook), &mut env);
        let claim = append_of(&step);
        assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
        let step = update.answer(Answer::Appended, &mut env);
        let (version, guard) = write_of(&step);
        assert_eq!(version, env.now);
        assert_eq!(guard.expected_version, 95_000);
        assert!(!guard.confirmed);
        // The released holder's renewal, stalled, landed after its release: the claim still
        // wins on its first write.
        let claims = [Claim {
            owner: guard.owner.clone(),
            newest: 4,
            previous_until: released.lease_until_ms + 5_000,
            ..Claim::default()
        }];
        let newest = NewestGeneration {
            generation: 4,
            owner: guard.owner.clone(),
            ..NewestGeneration::default()
        };
        assert!(fenced::admits(&guard, &newest, &claims, 95_000));
    }

    /// A claim whose answer was lost is kept in doubt; the next update finds it the newest
    /// grant and writes under it without claiming again, or, its lease over, claims anew.
    #[test]
    fn a_claim_in_doubt_that_is_the_newest_grant_is_written_under() {
        let mut env = clock();
        let mut update = update_with(Memory::default(), &env);
        update.start(&mut env);
        let step = update.answer(Answer::Outlook(Outlook::default()), &mut env);
        let claim = append_of(&step);
        let step = update.answer(Answer::Failed(Error::Unreachable("reset".into())), &mut env);
        assert!(
            matches!(step, Step::Done(Err(Error::Unreachable(_)))),
            "{step:?}"
        );
        let memory = update.into_memory();
        let doubt = memory.doubt.clone().expect("the claim is kept in doubt");
        assert_eq!(doubt.handle.token, claim.generation);

        let mut update = update_with(memory.clone(), &env);
        let step = update.start(&mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "{step:?}"
        );
        let outlook = Outlook {
            newest: held(&doubt.handle),
            stored: None,
        };
        let step = update.answer(Answer::Outlook(outlook.clone()), &mut env);
        let (_, guard) = write_of(&step);
        assert_eq!(
            (guard.generation, guard.confirmed),
            (claim.generation, false)
        );

        env.now = doubt.handle.lease_until_ms + 1;
        let mut update = update_with(memory, &env);
        update.start(&mut env);
        let step = update.answer(Answer::Outlook(outlook), &mut env);
        let again = append_of(&step);
        assert_eq!(
            (again.event, again.generation),
            (Event::Acquire, claim.generation + 1)
        );
    }

    /// A refused write of a kept grant is read back: a later holder means waiting for it; the
    /// grant still ours with newer state means merging into that and writing again.
    #[test]
    fn a_refused_write_is_read_back_before_anything_else() {
        let mut env = clock();
        let (mut update, _, _) = refused_kept_write(&mut env);
        let later = Outlook {
            newest: rival(6, env.now + 9_000),
            stored: Some(row(99_000)),
        };
        let step = update.answer(Answer::Outlook(later), &mut env);
        let step = past_want(&mut update, step, &mut env);
        assert!(matches!(step, Step::Pause(_)), "{step:?}");

        let (mut update, handle, _) = refused_kept_write(&mut env);
        let changed = Outlook {
            newest: held(&handle),
            stored: Some(row(99_000)),
        };
        let step = update.answer(Answer::Outlook(changed), &mut env);
        let (version, guard) = write_of(&step);
        assert_eq!((version, guard.expected_version), (env.now, 99_000));
    }

    /// After a refused write, nothing is written once a contender may see the lease ended: the
    /// grant is given back (its cap covering the refused version) and the lock taken anew.
    #[test]
    fn after_a_refused_write_near_the_lease_end_nothing_is_written() {
        let mut env = clock();
        let (mut update, handle, attempted) = refused_kept_write(&mut env);
        env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms);
        let changed = Outlook {
            newest: held(&handle),
            stored: Some(row(99_000)),
        };
        let step = update.answer(Answer::Outlook(changed), &mut env);
        let release = append_of(&step);
        assert_eq!(
            (release.event, release.generation, release.until_ms),
            (Event::Release, 5, attempted)
        );
        let step = update.answer(Answer::Appended, &mut env);
        let claim = append_of(&step);
        assert_eq!((claim.event, claim.generation), (Event::Acquire, 6));
    }

    /// A stored version above the lease (written by a holder whose clock is ahead) is covered by
    /// a renewal of the lease to it before the write is sent: a write landing after the lease
    /// ended must stay below the next grant's floor.
    #[test]
    fn a_version_above_the_lease_is_covered_by_a_renewal_first() {
        let mut env = clock();
        let (mut update, handle, _) = refused_kept_write(&mut env);
        let ahead = handle.lease_until_ms + 5_000;
        let changed = Outlook {
            newest: held(&handle),
            stored: Some(row(ahead)),
        };
        let step = update.answer(Answer::Outlook(changed), &mut env);
        assert!(
            matches!(sent(&step), Statement::ReadNewest { .. }),
            "{step:?}"
        );
        let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
        let renew = append_of(&step);
        assert_eq!(renew.event, Event::Renew);
        assert!(renew.until_ms > ahead, "{renew:?}");
        update.answer(Answer::Appended, &mut env);
        let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
        let (version, guard) = write_of(&step);
        assert_eq!((version, guard.expected_version), (ahead + 1, ahead));
        assert!(version <= renew.until_ms);
    }

    /// Every write refused because the stored state keeps changing under the grant: the update
    /// gives up after a few, releasing the grant, instead of chasing an endless stream.
    #[test]
    fn an_update_refused_again_and_again_gives_up() {
        let mut env = clock();
        let handle = grant(5, env.now + 8_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        let mut step = update.start(&mut env);
        let mut writes = 0;
        while let Step::Send {
            statement: Statement::WriteGuarded { .. },
            ..
        } = step
        {
            writes += 1;
            update.answer(Answer::RowsWritten(Some(0)), &mut env);
            let changed = Outlook {
                newest: held(&handle),
                stored: Some(row(90_000 + writes)),
            };
            step = update.answer(Answer::Outlook(changed), &mut env);
        }
        assert_eq!(writes, u64::from(MAX_REFUSALS));
        assert_eq!(append_of(&step).event, Event::Release);
        let step = update.answer(Answer::Appended, &mut env);
        assert!(
            matches!(&step, Step::Done(Err(Error::LockLost(why))) if why.contains("kept changing")),
            "{step:?}"
        );
    }

    /// A lock held by another is waited for with pauses of 80 to 120 % of the retry interval,
    /// the last one cut at the timeout, which then says who holds it.
    #[test]
    fn a_held_lock_is_waited_for_until_the_timeout() {
        struct Jittery {
            clock: Clock,
            draws: u64,
        }
        impl Env for Jittery {
            fn now_ms(&self) -> u64 {
                self.clock.now
            }
            fn new_token(&mut self) -> String {
                self.clock.new_token()
            }
            fn random(&mut self) -> u64 {
                self.draws += 1;
                self.draws.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            }
            fn log(&mut self, _: Level, _: &str) {}
        }
        let mut env = Jittery {
            clock: clock(),
            draws: 0,
        };
        let start = env.clock.now;
        let holder = rival(6, start + 60_000);
        let mut update = Update::new("s", "{}", "{}", LIMITS, Memory::default(), start);
        let mut step = update.start(&mut env);
        let mut pauses = vec![];
        loop {
            match step {
                Step::Send {
                    statement: Statement::Append(ref want),
                    ..
                } => {
                    assert_eq!(fenced::wanted_generation(want), Some(6));
                    step = update.answer(Answer::Appended, &mut env);
                }
                Step::Send { .. } => {
                    let outlook = Outlook {
                        newest: holder.clone(),
                        stored: None,
                    };
                    step = update.answer(Answer::Outlook(outlook), &mut env);
                }
                Step::Pause(ms) => {
                    pauses.push(ms);
                    env.clock.now += ms;
                    step = update.answer(Answer::Resumed, &mut env);
                }
                Step::Done(result) => {
                    assert!(
                        matches!(&result, Err(Error::Locked(info)) if info.token == 6),
                        "{result:?}"
                    );
                    break;
                }
            }
        }
        assert_eq!(env.clock.now, start + LIMITS.timeout_ms);
        let (last, rest) = pauses.split_last().expect("it waited");
        assert!(*last <= LIMITS.retry_ms * 120 / 100, "{last}");
        for pause in rest {
            assert!(
                (LIMITS.retry_ms * 80 / 100..=LIMITS.retry_ms * 120 / 100).contains(pause),
                "{pause} ms"
            );
        }
        assert!(rest.iter().any(|&p| p != rest[0]), "jittered: {rest:?}");
    }
}

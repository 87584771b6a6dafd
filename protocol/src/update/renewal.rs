//! Renewing a grant's lease: its own small machine, and what the update does once it is over.

use super::{Answer, Grant, Phase, Statement, Step, Update, unexpected};
use crate::env::{Env, Level};
use crate::error::{Error, LockInfo};
use crate::fenced::{self};
use crate::grant::{Kept, LockHandle, StoredRow};
use crate::rows::Event;

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

/// What to do once a renewal of the update's grant is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum AfterRenewal {
    /// A kept grant renewed past half its lease: if lost, claim anew; if it failed, keep it.
    Resume,
    /// A renewal covering a version above the lease: if lost, wait and claim anew.
    Write,
}

impl Update {
    pub(super) fn renewing(
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
}

//! Taking the lock: reading the outlook, claiming the next generation, or waiting for the holder.

use super::{Answer, Grant, Phase, Statement, Step, Update};
use crate::env::{Env, Level};
use crate::error::{Error, LockInfo};
use crate::fenced::{self};
use crate::grant::Doubt;
use crate::rows::{Event, NewestGeneration, Outlook};

impl Update {
    pub(super) fn prepare(&mut self, env: &mut impl Env) -> Step {
        if let Some(doubt) = self.memory.doubt.take() {
            return self.read_outlook(Some(doubt));
        }
        // This instance released the newest generation itself (Meltano's pattern: one process
        // after another on one id): claim the next one without reading, with the state it
        // wrote last as the basis. If anyone else got in between, the guard refuses. A shared
        // id is read first (what it released is kept, to see whether anyone came between).
        // Under a run's hold the log is always read: only the run's own release may be followed.
        if !self.memory.shared(env.now_ms())
            && !self.memory.run_hold
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
    /// what was read. Returns whether the newest generation is this instance's own release.
    pub(super) fn read_shared(&mut self, newest: &NewestGeneration, now: u64) -> bool {
        self.memory.last_written = None;
        // A generation forced open is nobody's own: the forcing run may have written since.
        let own = self.memory.released.take().is_some_and(|mine| {
            (mine.generation, &mine.owner) == (newest.generation, &newest.owner)
                && newest.forced == 0
        });
        if self.memory.shared(now) && !own {
            self.share(now);
        }
        own
    }

    /// The run's hold on the id is gone: the update fails rather than take the id anew, since
    /// another run may have written it meanwhile. The hold stays marked, so that every later
    /// update of the run fails too, until the run takes it again.
    pub(super) fn hold_lost(&mut self, why: &str) -> Step {
        self.finish(Err(Error::LockLost(format!(
            "this run's hold on {:?} was lost ({why}): forced open by another run, or not \
             renewed in time and taken since",
            self.state_id
        ))))
    }

    /// A newest generation that another instance wants (a `want` row, written by a waiter) means
    /// the id is shared: a keeper that reads it (renewing, confirming) gives its grant back after
    /// this update instead of keeping it, so that the waiter does not wait out the linger, or
    /// the whole stream.
    pub(super) fn heed(&mut self, answer: &Answer, now: u64) {
        let newest = match answer {
            Answer::NewestGeneration(newest) | Answer::Outlook(Outlook { newest, .. }) => newest,
            _ => return,
        };
        if newest.wanted != 0 {
            self.share(now);
        }
    }

    /// Another instance writes the id too: it stays shared for a lease.
    pub(super) fn share(&mut self, now: u64) {
        self.memory.shared_until_ms = now.saturating_add(self.limits.lease_ms);
    }

    pub(super) fn read_outlook(&mut self, doubt: Option<Doubt>) -> Step {
        self.guessed = false;
        self.phase = Phase::ReadingOutlook { doubt };
        Step::send(Statement::ReadOutlook {
            state_id: self.state_id.clone(),
        })
    }

    pub(super) fn claim_or_wait(&mut self, outlook: Outlook, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        if !outlook.newest.is_free(now) {
            return self.wait(outlook.newest.info(&self.state_id), env);
        }
        let handle = fenced::claim_handle(
            &self.state_id,
            &outlook.newest,
            now,
            self.limits.lease_ms,
            env.new_owner(),
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

    /// The grant is not this update's: wait as for any holder, then take the lock anew. A claim
    /// that followed this instance's own release without reading only shows that someone came
    /// between: the log says at once whether they still hold the id.
    pub(super) fn lost(&mut self, holder: LockInfo, env: &mut impl Env) -> Step {
        env.log(
            Level::Info,
            &format!(
                "the update of {:?} lost its grant to {} (token {}); taking the lock again",
                self.state_id, holder.owner, holder.token
            ),
        );
        self.share(env.now_ms());
        if self.memory.run_hold {
            let why = format!("{} has it (token {})", holder.owner, holder.token);
            return self.hold_lost(&why);
        }
        if self.guessed {
            return self.read_outlook(None);
        }
        self.wait(holder, env)
    }

    /// One pause of the wait loop while `holder` has the lock (see `wait`): `locked` once the
    /// deadline has passed.
    pub(super) fn wait(&mut self, holder: LockInfo, env: &mut impl Env) -> Step {
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
        env.log(Level::Debug, &crate::events::lock_wait(&holder, pause));
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

    pub(super) fn pause(&mut self, pause_ms: u64) -> Step {
        self.phase = Phase::Pausing;
        Step::Pause(pause_ms)
    }
}

//! Writing under a grant: the guarded write, the read-back of a refusal, and the outcome.

use super::{
    AfterRenewal, Answer, Grant, MAX_REFUSALS, Phase, Renewal, Statement, Step, Update, unexpected,
};
use crate::env::{Env, Level};
use crate::error::{Error, Result};
use crate::fenced::{self, ClaimOutcome};
use crate::grant::{Doubt, Kept, Proposed, StoredRow, propose_version};
use crate::merge::{merged, parse_object};
use crate::rows::{Claim, Event};

impl Update {
    /// Merges the update into the grant's basis and writes it through the guard.
    pub(super) fn write(&mut self, mut ready: Grant, env: &mut impl Env) -> Step {
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
    pub(super) fn recheck(&mut self, ready: Grant, attempted: Option<StoredRow>) -> Step {
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

    pub(super) fn claims_read(
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

    pub(super) fn rechecked(
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
    pub(super) fn written(&mut self, mut ready: Grant, row: StoredRow, env: &mut impl Env) -> Step {
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
    pub(super) fn succeed(&mut self, ready: Grant, row: StoredRow, env: &mut impl Env) -> Step {
        let now = env.now_ms();
        if self.memory.run_hold || (self.limits.linger_ms > 0 && !self.memory.shared(now)) {
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
    pub(super) fn fail(&mut self, ready: Grant, error: Error, env: &mut impl Env) -> Step {
        if let Some(followed) = ready.claimed_after {
            self.memory.doubt = Some(Doubt {
                handle: ready.handle,
                followed,
            });
            return self.finish(Err(error));
        }
        // A run keeps its hold through a failed write: the grant stays its own (its guard
        // refuses a write under it once another holds the id), and what is stored is read
        // again before the next write, since the failed one may have landed.
        if self.memory.run_hold {
            let now = env.now_ms();
            self.memory.kept = Some(Kept {
                handle: ready.handle,
                basis: None,
                last_used_ms: now,
                checked_ms: now,
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

    /// The state to write: the update merged into `basis` (see [`merged`]).
    pub(super) fn merged(&self, basis: Option<StoredRow>) -> Result<(String, String)> {
        let partial = parse_object(&self.partial, "partial state")?;
        let completed = parse_object(&self.completed, "completed state")?;
        Ok(merged(partial, completed, basis.map(|(p, c, _)| (p, c))))
    }
}

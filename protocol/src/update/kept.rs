//! A grant kept from the last update (linger): resumed, renewed past half its lease, or handed
//! back when too close to its end.

use super::{AfterRenewal, Grant, MAX_HAND_BACKS, Phase, Renewal, Statement, Step, Update};
use crate::env::{Env, Level};
use crate::error::Error;
use crate::fenced::{self};
use crate::grant::{Doubt, Kept, StoredRow};
use crate::rows::Event;

impl Update {
    /// A kept grant, if it can still be written under: renewed once past half its lease; given
    /// back when too close to its end to renew.
    pub(super) fn resume(&mut self, kept: Kept, env: &mut impl Env) -> Step {
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
    pub(super) fn ran_out(&self, ready: &Grant, error: &Error, env: &impl Env) -> bool {
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
    pub(super) fn out_of_lease(
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

    pub(super) fn hand_back(&mut self, kept: Kept, env: &mut impl Env) -> Step {
        self.handed_back += 1;
        let row = fenced::entry(&kept.handle, Event::Release, env.now_ms());
        self.phase = Phase::HandingBack { kept };
        Step::send(Statement::Append(row))
    }
}

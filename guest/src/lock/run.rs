//! A run's hold on its state id (`hold-run`): the lock a run of a pipeline takes at its first
//! read and keeps until it ends, so that a second run of the pipeline, anywhere, is refused at
//! its start instead of writing its bookmarks over the first's.
//!
//! The hold is an update's kept grant (see `protocol::update`) marked `run_hold`: the run's
//! updates write under it (one guarded write each, as with a linger), it is never given to a
//! waiter, and `idle` renews it while the run is quiet. Its lease is an update's
//! (`lock_timeout_seconds`, at least 10 s): a run that dies holds the id that long at most.
//! The host's `close` (the run's end) gives it back.

use super::{Locks, fenced};
use crate::config::LockMode;
use crate::error::{Error, Result};
use crate::http::Transport;
use crate::session::{Level, Platform, Session};
use protocol::fenced::{lease_margin_ms, near_lease_end, released};
use protocol::grant::{Attempt, Kept};
use protocol::update::Limits;

/// Takes the hold of `state_id` for this run, or refuses at once with `locked`, naming the
/// holder: a run does not wait for another run of its pipeline. With `force`, a holder's grant
/// is forced open and the id taken (its later writes are fenced out). Holding it already, or
/// with `run_lock` off or in settle mode, does nothing.
pub fn hold<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    force: bool,
) -> Result<()> {
    let config = &session.config;
    if !config.run_lock || config.lock_mode == LockMode::Settle {
        return Ok(());
    }
    let already = locks.with(state_id, |m| {
        let kept = m.kept.is_some();
        m.run_hold |= kept;
        kept
    });
    if already {
        return Ok(());
    }
    let lease = Limits::of(config).lease_ms;
    let deadline = session.host.now_ms().saturating_add(config.lock_timeout_ms);
    let mut forced = false;
    loop {
        let holder = match fenced::attempt(session, locks, state_id, lease)? {
            Attempt::Granted(handle) => {
                // The first update merges into what is stored, as a linger's would.
                let read = || crate::store::stored(session, state_id);
                let basis = match session.retrying_until(handle.lease_until_ms, read) {
                    Ok(basis) => basis,
                    Err(e) => {
                        let _ = fenced::release(session, locks, &handle);
                        return Err(e);
                    }
                };
                let now = session.host.now_ms();
                session.host.log(
                    Level::Info,
                    &format!(
                        "this run holds {state_id:?} (token {}) until it ends",
                        handle.token
                    ),
                );
                locks.with(state_id, |m| {
                    m.kept = Some(Kept {
                        handle,
                        basis,
                        last_used_ms: now,
                        checked_ms: now,
                    });
                    m.run_hold = true;
                });
                return Ok(());
            }
            Attempt::Held(holder) => holder,
        };
        // A claim of ours in doubt (its read-back failed) is settled by the next try, until
        // the lock timeout; then it is withdrawn if it won.
        if locks.with(state_id, |m| m.doubt.is_some()) {
            if session.host.now_ms() >= deadline {
                fenced::withdraw_doubt(session, locks, state_id);
                return Err(Error::Locked(holder));
            }
            session.host.sleep_ms(config.lock_retry_ms.max(1));
            continue;
        }
        if force && !forced {
            forced = true;
            session.host.log(
                Level::Warn,
                &format!(
                    "forcing the hold of {state_id:?} from {} (token {}): its later writes \
                     are refused",
                    holder.owner, holder.token
                ),
            );
            super::force_unlock(session, state_id)?;
            continue;
        }
        return Err(Error::Locked(holder));
    }
}

/// When a held grant is renewed by `idle`: once past half its lease (as an update renews it by
/// use), and not sooner than a retry interval after the last try.
pub(crate) fn renewal_due(kept: &Kept, lease_ms: u64, retry_ms: u64) -> u64 {
    kept.handle
        .lease_until_ms
        .saturating_sub(lease_ms / 2)
        .max(kept.checked_ms.saturating_add(retry_ms))
}

/// Renews the held grants whose renewal is due (see [`renewal_due`]); a renewal that finds the
/// grant taken drops it (the run's next update then fails, naming the loss), and one that fails
/// otherwise is tried again after a retry interval, until the lease says it is too late (then
/// the run's next update decides).
pub(crate) fn renew_due<T: Transport, H: Platform>(session: &Session<T, H>, locks: &Locks) {
    let lease = Limits::of(&session.config).lease_ms;
    let retry = session.config.lock_retry_ms.max(100);
    let now = session.host.now_ms();
    for (state_id, mut kept) in locks.holds_due(|k| renewal_due(k, lease, retry) <= now) {
        if near_lease_end(now, kept.handle.lease_until_ms, lease) {
            // Too late to renew: given back (best effort), and remembered as the run's own, so
            // that its next update takes the id anew if nobody came between, or fails if
            // someone did.
            if let Err(e) = fenced::release(session, locks, &kept.handle) {
                session.host.log(
                    Level::Warn,
                    &format!("giving back this run's expiring hold on {state_id:?} failed: {e}"),
                );
            }
            locks.with(&state_id, |m| m.released = Some(released(&kept.handle)));
            continue;
        }
        let until = now.saturating_add(lease);
        // No retry past the point where a contender may see the lease ended.
        let bound = kept
            .handle
            .lease_until_ms
            .saturating_sub(lease_margin_ms(lease));
        let renewed = session.retrying_until(bound, || {
            super::drive::renew(session, &mut kept.handle, until, lease)
        });
        kept.checked_ms = session.host.now_ms();
        match renewed {
            Ok(()) => locks.with(&state_id, |m| m.kept = Some(kept)),
            Err(Error::LockLost(why)) => session.host.log(
                Level::Warn,
                &format!("this run's hold on {state_id:?} was lost: {why}"),
            ),
            Err(e) => {
                session.host.log(
                    Level::Warn,
                    &format!("renewing this run's hold on {state_id:?} failed; trying again: {e}"),
                );
                locks.with(&state_id, |m| m.kept = Some(kept));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::grant::LockHandle;

    fn kept(until: u64, checked: u64) -> Kept {
        Kept {
            handle: LockHandle {
                state_id: "s".into(),
                owner: "me".into(),
                token: 1,
                acquired_at_ms: 0,
                lease_until_ms: until,
                floor_ms: 0,
                last_written_ms: 0,
                mode: LockMode::Fenced,
            },
            basis: None,
            last_used_ms: 0,
            checked_ms: checked,
        }
    }

    #[test]
    fn a_hold_is_renewed_past_half_its_lease_and_retried_after_an_interval() {
        // 10 s lease ending at 20 s: due at 15 s.
        assert_eq!(renewal_due(&kept(20_000, 10_000), 10_000, 1_000), 15_000);
        // a failed try at 15 s: the next one a retry interval later
        assert_eq!(renewal_due(&kept(20_000, 15_000), 10_000, 1_000), 16_000);
    }
}

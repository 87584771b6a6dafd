//! The fenced lock over a session: its lock log's statements as SQL, and the plain `acquire`'s
//! claim and read-back (the protocol and its rules: [`protocol::fenced`]).

use super::Locks;
use crate::error::{Error, LockInfo, Result};
use crate::http::Transport;
use crate::rows;
use crate::session::{Level, Platform, Session};
use protocol::fenced::{
    ClaimOutcome, LogEntry, claim_decided, claim_handle, decide_claim, doubt_decidable, entry,
    lost, prune_below, released,
};
use protocol::grant::{Attempt, Doubt, LockHandle};
use protocol::rows::{Claim, Event, NewestGeneration};

/// After a claim on `generation` of `state_id`: drops the old generations when it is due
/// ([`prune_below`]). Asynchronous and best effort: old generations decide nothing (a guard
/// reads its own generation and the one before it), whoever wins this one.
pub(crate) fn prune_if_due<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
    generation: u64,
) {
    let Some(below) = prune_below(generation) else {
        return;
    };
    if let Err(e) = session.run(&session.sql.log_prune(state_id, below)) {
        session
            .host
            .log(Level::Warn, &format!("pruning the lock log failed: {e}"));
    }
}

pub(crate) fn newest<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<NewestGeneration> {
    Ok(session
        .fetch_first(&session.sql.log_state(state_id))?
        .unwrap_or_default())
}

pub(crate) fn append<T: Transport, H: Platform>(
    session: &Session<T, H>,
    entry: &LogEntry,
) -> Result<()> {
    let mut data = serde_json::to_vec(entry)
        .map_err(|e| Error::InvalidInput(format!("cannot encode a lock row: {e}")))?;
    data.push(b'\n');
    session
        .run(&session.sql.log_insert(data, &entry.token()))
        .map(drop)
}

/// Appends a `want` row (`want`): one try, no retry. A lock log created by an older version
/// lacks the event; it gains it (as `migrate` would) and the row goes once more.
pub(crate) fn say_wanted<T: Transport, H: Platform>(
    session: &Session<T, H>,
    row: &LogEntry,
) -> Result<()> {
    let once = |f: &dyn Fn() -> Result<()>| session.retrying_until(session.host.now_ms(), f);
    match once(&|| append(session, row)) {
        // Once per instance (`add_lock_log_events`), each statement one try; on a cluster
        // (ON CLUSTER DDL can wait for every replica) that is `migrate`'s to do.
        Err(Error::Server(e)) if e.name == "UNKNOWN_ELEMENT_OF_ENUM" => {
            if session.config.cluster.is_some() {
                return Err(Error::Server(e));
            }
            once(&|| session.add_lock_log_events())?;
            once(&|| append(session, row))
        }
        other => other,
    }
}

/// One try for the lock of `state_id`, a grant lasting `lease_ms` (the lock's lease for
/// `acquire`, an update's for a run's hold).
pub(crate) fn attempt<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    lease_ms: u64,
) -> Result<Attempt> {
    // A claim of ours whose read-back failed may have won: the log says whether it did.
    let doubt = locks.with(state_id, |m| m.doubt.take());
    if let Some(doubt) = doubt {
        return resolve_doubt(session, locks, state_id, doubt, lease_ms);
    }
    // Fast path: this instance released the newest generation itself (Meltano's pattern: one
    // process, one state id, an update per STATE message), so claim the next one without
    // reading first. If anyone else got there, the claim loses and the full path runs.
    let last = locks.with(state_id, |m| m.released.take());
    if let Some(last) = last
        && let granted @ Attempt::Granted(..) = claim(session, locks, state_id, &last, lease_ms)?
    {
        return Ok(granted);
    }
    let now = session.host.now_ms();
    let current = newest(session, state_id)?;
    if !current.is_free(now) {
        return Ok(Attempt::Held(current.info(state_id)));
    }
    claim(session, locks, state_id, &current, lease_ms)
}

/// Claims the generation after `current` (which must be free) and reads back who got it.
fn claim<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    current: &NewestGeneration,
    lease_ms: u64,
) -> Result<Attempt> {
    let handle = append_claim(session, state_id, current, lease_ms)?;
    let (generation, owner, now, lease_until) = (
        handle.token,
        handle.owner.clone(),
        handle.acquired_at_ms,
        handle.lease_until_ms,
    );
    let read = session.sql.log_claims(state_id, generation, false);
    let body = match session.run(&read.query) {
        Ok(body) => body,
        // The claim is in the log or not, and nobody knows which: if it won, the id would stay
        // locked for a whole lease by a holder that does not know it holds it. Keep it, so that
        // the next try (after the usual pause) reads the log and takes the grant if it is ours.
        Err(e) if e.is_transient() => {
            session.host.log(
                Level::Warn,
                &format!(
                    "the read-back of a claim on {state_id:?} (token {generation}) failed: {e}"
                ),
            );
            let info = LockInfo {
                state_id: state_id.to_string(),
                owner: format!("unknown (this instance's claim {owner} is in doubt)"),
                token: generation,
                acquired_at_ms: now,
                expires_at_ms: lease_until,
            };
            let doubt = Doubt {
                handle,
                followed: current.clone(),
            };
            locks.with(state_id, |m| m.doubt = Some(doubt));
            return Ok(Attempt::Held(info));
        }
        Err(e) => return Err(e),
    };
    let claims: Vec<Claim> = rows::all(&body)?;
    // The generation this claim replaces was free because its lease had ended. If its holder's
    // renewal landed since (it stalled, or its clock is behind), that holder may have checked
    // the log before this claim landed and gone on: the claim loses, and stays in the log until
    // its own lease ends, so that neither this instance nor a third takes the id while the
    // renewed holder works (the holder finds the newer generation at its next check).
    let outcome = decide_claim(current, &claims, &owner, generation);
    match outcome {
        ClaimOutcome::GivesWay => session.host.log(
            Level::Info,
            &format!(
                "the claim on {state_id:?} (token {generation}) gives way to a renewal of token {}",
                current.generation
            ),
        ),
        ClaimOutcome::Mine => prune_if_due(session, state_id, generation),
        ClaimOutcome::Lost => {}
    }
    Ok(claim_decided(outcome, current, &claims, handle))
}

/// Appends a claim on the generation after `current` (which must be free): the grant it asks
/// for, not yet decided.
pub(crate) fn append_claim<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
    current: &NewestGeneration,
    lease_ms: u64,
) -> Result<LockHandle> {
    let now = session.host.now_ms();
    let handle = claim_handle(state_id, current, now, lease_ms, session.new_owner());
    append(session, &entry(&handle, Event::Acquire, now))?;
    Ok(handle)
}

/// Whether a claim in doubt won, once the log can be read: `None` when it is not the open newest
/// grant (released, forced, expired, or someone else's), else what the read-back rule says of
/// it, with the claims on its generation. The rule, not the log's fold: the fold names the
/// earliest claim, which may have landed after a rival's read-back, or after a renewal of the
/// generation it followed.
fn doubt_outcome<T: Transport, H: Platform>(
    session: &Session<T, H>,
    doubt: &Doubt,
    current: &NewestGeneration,
) -> Result<Option<(ClaimOutcome, Vec<Claim>)>> {
    let handle = &doubt.handle;
    if !doubt_decidable(current, handle, session.host.now_ms()) {
        return Ok(None);
    }
    let read = session
        .sql
        .log_claims(&handle.state_id, handle.token, false);
    let claims: Vec<Claim> = rows::all(&session.run(&read.query)?)?;
    let outcome = decide_claim(&doubt.followed, &claims, &handle.owner, handle.token);
    Ok(Some((outcome, claims)))
}

/// Decides a claim in doubt from the log, as its read-back would have: granted if it won; held
/// by whoever it gave way to or lost to; otherwise the usual path.
fn resolve_doubt<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    doubt: Doubt,
    lease_ms: u64,
) -> Result<Attempt> {
    let keep = |doubt: Doubt| locks.with(state_id, |m| m.doubt = Some(doubt));
    let current = match newest(session, state_id) {
        Ok(current) => current,
        Err(e) => {
            keep(doubt);
            return Err(e);
        }
    };
    let outcome = match doubt_outcome(session, &doubt, &current) {
        Ok(outcome) => outcome,
        Err(e) => {
            keep(doubt);
            return Err(e);
        }
    };
    if let Some((outcome, claims)) = outcome {
        if outcome == ClaimOutcome::Mine {
            session.host.log(
                Level::Info,
                &format!(
                    "the claim in doubt on {state_id:?} (token {}) had won",
                    doubt.handle.token
                ),
            );
        }
        // As after a read-back.
        return Ok(claim_decided(
            outcome,
            &doubt.followed,
            &claims,
            doubt.handle,
        ));
    }
    if !current.is_free(session.host.now_ms()) {
        return Ok(Attempt::Held(current.info(state_id)));
    }
    claim(session, locks, state_id, &current, lease_ms)
}

/// When a lock is given up with a claim still in doubt: if the claim won, release it, so that
/// the id is not blocked for a lease by a holder that never knew. Only if it won: a release row
/// frees its generation whoever wrote it, and a lost claim's generation may be a rival's grant.
/// Best effort.
pub(crate) fn withdraw_doubt<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
) {
    let Some(doubt) = locks.with(state_id, |m| m.doubt.take()) else {
        return;
    };
    let outcome = newest(session, state_id)
        .and_then(|current| doubt_outcome(session, &doubt, &current))
        .and_then(|outcome| match outcome {
            Some((ClaimOutcome::Mine, _)) => release(session, locks, &doubt.handle).map(|()| true),
            _ => Ok(false),
        });
    let message = match outcome {
        Ok(true) => format!(
            "released the claim in doubt on {state_id:?} (token {})",
            doubt.handle.token
        ),
        Ok(false) => return,
        Err(e) => format!(
            "could not settle the claim in doubt on {state_id:?} (token {}); it ends with its lease: {e}",
            doubt.handle.token
        ),
    };
    session.host.log(Level::Warn, &message);
}

pub(crate) fn release<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    lock: &LockHandle,
) -> Result<()> {
    append(session, &entry(lock, Event::Release, session.host.now_ms()))?;
    locks.with(&lock.state_id, |m| m.released = Some(released(lock)));
    Ok(())
}

pub(crate) fn info<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<Option<LockInfo>> {
    let current = newest(session, state_id)?;
    let now = session.host.now_ms();
    Ok((!current.is_free(now)).then(|| current.info(state_id)))
}

pub(crate) fn force_unlock<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<bool> {
    let current = newest(session, state_id)?;
    let now = session.host.now_ms();
    if current.is_free(now) {
        return Ok(false);
    }
    let operator = LogEntry {
        state_id: state_id.to_string(),
        generation: current.generation,
        event: Event::Force,
        owner: session.new_token(),
        at_ms: now,
        until_ms: 0,
        floor_ms: 0,
    };
    append(session, &operator)?;
    session.host.log(
        Level::Warn,
        &format!(
            "lock on {state_id:?} held by {} (token {}) forced open",
            current.owner, current.generation
        ),
    );
    Ok(true)
}

/// Checks in the log that `lock` is still the newest grant, neither released nor forced open.
pub(crate) fn confirm_held<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &LockHandle,
) -> Result<()> {
    if !newest(session, &lock.state_id)?.still_held_by(lock) {
        return Err(lost(lock, "a later holder has it, or it was forced open"));
    }
    Ok(())
}

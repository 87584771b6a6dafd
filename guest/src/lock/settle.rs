//! Settle mode over a session: each statement of [`protocol::settle::Try`] (the original
//! Python backend's protocol; see there) as its SQL, the settle pause as the host's sleep.

use serde::Serialize;

use crate::error::{Error, LockInfo, Result};
use crate::http::Transport;
use crate::session::{Platform, Session};
use protocol::grant::{Attempt, LockHandle};
use protocol::rows::Candidate;
use protocol::settle::{Answer, Statement, Step, Try, cutoff_s};
#[derive(Serialize)]
struct CandidateRow<'a> {
    state_id: &'a str,
    lock_id: &'a str,
    locked_at: u64,
}

/// One try, driven over the executor; the settle pause is the host's sleep.
pub(crate) fn attempt<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<Attempt> {
    let (mut attempt, mut step) = Try::start(
        state_id,
        session.new_owner(),
        session.host.now_ms(),
        session.config.lock_lease_ms,
        session.config.lock_settle_ms,
    );
    loop {
        let answer = match step {
            Step::Done(result) => return result,
            Step::Pause(ms) => {
                session.host.sleep_ms(ms);
                Ok(Answer::Resumed)
            }
            Step::Send(Statement::DeleteStale { cutoff_s }) => session
                .run(&session.sql.lock_delete_stale(state_id, cutoff_s))
                .map(|_| Answer::Done),
            Step::Send(Statement::ReadCandidates { cutoff_s }) => {
                candidates(session, state_id, cutoff_s).map(Answer::Candidates)
            }
            Step::Send(Statement::Insert { lock_id, now_ms }) => {
                insert(session, state_id, &lock_id, now_ms).map(|()| Answer::Done)
            }
            Step::Send(Statement::Delete { lock_id }) => session
                .run(&session.sql.lock_delete(state_id, &lock_id))
                .map(|_| Answer::Done),
        };
        step = attempt.answer(answer.unwrap_or_else(Answer::Failed), session.host.now_ms());
    }
}

fn insert<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
    lock_id: &str,
    now_ms: u64,
) -> Result<()> {
    let row = CandidateRow {
        state_id,
        lock_id,
        locked_at: now_ms / 1000,
    };
    let mut data = serde_json::to_vec(&row)
        .map_err(|e| Error::InvalidInput(format!("cannot encode lock row: {e}")))?;
    data.push(b'\n');
    let token = format!("{lock_id}/{now_ms}");
    session
        .run(&session.sql.lock_insert(data, &token))
        .map(drop)
}

pub(crate) fn release<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &LockHandle,
) -> Result<()> {
    session
        .run(&session.sql.lock_delete(&lock.state_id, &lock.owner))
        .map(drop)
}

/// A fresh row for our candidate id: the Python backend sees a live candidate and waits, and its
/// staleness check starts over.
pub(crate) fn renew<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &mut LockHandle,
) -> Result<()> {
    let now = session.host.now_ms();
    let lease = session.config.lock_lease_ms;
    let still_ours = candidates(session, &lock.state_id, cutoff_s(now, lease))?
        .iter()
        .any(|c| c.lock_id == lock.owner);
    if !still_ours || now >= lock.lease_until_ms {
        return Err(Error::LockLost(format!(
            "the lock on {:?} is no longer held (its candidate is gone or stale)",
            lock.state_id
        )));
    }
    insert(session, &lock.state_id, &lock.owner, now)?;
    lock.lease_until_ms = now + lease;
    Ok(())
}

pub(crate) fn info<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<Option<LockInfo>> {
    let lease = session.config.lock_lease_ms;
    let now = session.host.now_ms();
    Ok(candidates(session, state_id, cutoff_s(now, lease))?
        .first()
        .map(|c| c.info(state_id, lease)))
}

pub(crate) fn force_unlock<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<bool> {
    let held = info(session, state_id)?.is_some();
    session.run(&session.sql.lock_delete_all(state_id))?;
    Ok(held)
}

fn candidates<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
    cutoff_s: u64,
) -> Result<Vec<Candidate>> {
    session.fetch(&session.sql.lock_candidates(state_id, cutoff_s))
}

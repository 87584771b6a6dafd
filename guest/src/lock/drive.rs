//! Drives the lock's sans-IO machines (`protocol::update`) over a [`Session`]: each statement becomes its
//! SQL, sent with the executor's retries; pauses are the host's sleep.

use super::{Locks, fenced};
use crate::error::Result;
use crate::http::Transport;
use crate::rows;
use crate::session::{Level, Platform, Session};
use crate::sql::{Op, Origin, StateRow};
use protocol::env::Env;
use protocol::grant::LockHandle;
use protocol::rows::Event;
use protocol::update::{Answer, Limits, Renewal, Renewing, Statement, Step, Update};

/// The executor's host as the machines' [`Env`].
struct ExecEnv<'a, T, H>(&'a Session<T, H>);

impl<T: Transport, H: Platform> Env for ExecEnv<'_, T, H> {
    fn now_ms(&self) -> u64 {
        self.0.host.now_ms()
    }

    fn new_token(&mut self) -> String {
        self.0.new_token()
    }

    fn new_owner(&mut self) -> String {
        self.0.new_owner()
    }

    fn random(&mut self) -> u64 {
        self.0.host.random_u128() as u64
    }

    fn log(&mut self, level: Level, message: &str) {
        self.0.host.log(level, message);
    }
}

/// Runs one `update` of `state_id` (parts validated by the caller) under the fenced lock.
pub fn update<T: Transport, H: Platform>(
    session: &Session<T, H>,
    locks: &Locks,
    state_id: &str,
    partial: &str,
    completed: &str,
) -> Result<()> {
    let mut env = ExecEnv(session);
    let mut machine = Update::new(
        state_id,
        partial,
        completed,
        Limits::of(&session.config),
        locks.take(state_id),
        session.host.now_ms(),
    );
    let mut step = machine.start(&mut env);
    let result = loop {
        step = match step {
            Step::Send {
                statement,
                retry_until_ms,
            } => {
                let answer = answer(session, &statement, retry_until_ms);
                machine.answer(answer, &mut env)
            }
            Step::Pause(ms) => {
                session.host.sleep_ms(ms);
                machine.answer(Answer::Resumed, &mut env)
            }
            Step::Done(result) => break result,
        };
    };
    locks.put(state_id, machine.into_memory());
    result
}

/// Renews `lock`, a grant of `lease_ms`, to `until_ms` (see [`Renewal`]); `lock-lost` when the
/// log says it is not held.
pub fn renew<T: Transport, H: Platform>(
    session: &Session<T, H>,
    lock: &mut LockHandle,
    until_ms: u64,
    lease_ms: u64,
) -> Result<()> {
    let now = session.host.now_ms();
    let (mut renewal, mut next) = Renewal::start(lock.clone(), until_ms, now, lease_ms);
    loop {
        match next {
            Renewing::Send(statement) => {
                let answer = answer(session, &statement, None);
                (renewal, next) = renewal.answer(answer, session.host.now_ms());
            }
            Renewing::Renewed(renewed) => {
                *lock = renewed;
                return Ok(());
            }
            Renewing::Failed(e, _) => return Err(e),
        }
    }
}

fn answer<T: Transport, H: Platform>(
    session: &Session<T, H>,
    statement: &Statement,
    retry_until_ms: Option<u64>,
) -> Answer {
    let result = match retry_until_ms {
        Some(until) => session.retrying_until(until, || send(session, statement)),
        None => send(session, statement),
    };
    result.unwrap_or_else(Answer::Failed)
}

/// Sends one statement of the protocol as its SQL.
fn send<T: Transport, H: Platform>(
    session: &Session<T, H>,
    statement: &Statement,
) -> Result<Answer> {
    Ok(match statement {
        Statement::ReadOutlook { state_id } => Answer::Outlook(
            session
                .fetch_first(&session.sql.log_outlook(state_id))?
                .unwrap_or_default(),
        ),
        Statement::ReadNewest { state_id } => {
            Answer::NewestGeneration(fenced::newest(session, state_id)?)
        }
        Statement::ReadClaims {
            state_id,
            generation,
        } => Answer::Claims(session.fetch(&session.sql.log_claims(state_id, *generation, true))?),
        Statement::Append(entry) if entry.event == Event::Want => {
            fenced::say_wanted(session, entry)?;
            Answer::Appended
        }
        Statement::Append(entry) => {
            fenced::append(session, entry)?;
            if entry.event == Event::Acquire {
                fenced::prune_if_due(session, &entry.state_id, entry.generation);
            }
            Answer::Appended
        }
        Statement::WriteGuarded {
            partial,
            completed,
            version_ms,
            guard,
            token,
        } => {
            let row = StateRow {
                state_id: &guard.state_id,
                partial,
                completed,
                version_ms: *version_ms,
            };
            let origin = Origin {
                op: Op::Update,
                writer: &session.instance,
                lock_owner: &guard.owner,
                token: guard.generation,
            };
            if row.fits_in_params() {
                let (landed, _) =
                    session.write(&session.sql.write_guarded(row, &origin, guard, token))?;
                Answer::RowsWritten(landed.rows())
            } else {
                // Too large for query parameters: check, then insert (what the guard does, in
                // two).
                if rows::number(&session.run(&session.sql.guard_holds(guard))?)? != 1 {
                    return Ok(Answer::RowsWritten(Some(0)));
                }
                let mut data = Vec::new();
                let seq = session.ordinals(&[row.state_id])?.pop().unwrap_or_default();
                session.sql.encode_state(row, &origin, seq, &mut data)?;
                session.insert(
                    &session
                        .sql
                        .insert_states(data, token)
                        .landing(vec![(row.state_id.to_string(), row.version_ms)]),
                )?;
                Answer::RowsWritten(Some(1))
            }
        }
    })
}

//! Drives the lock's sans-IO machines (`update`) over an [`Exec`]: each statement becomes its
//! SQL, sent with the executor's retries; pauses are the host's sleep.

use super::update::{Answer, Env, Limits, Renewal, Renewing, Statement, Step, Update};
use super::{LockHandle, Locks, fenced};
use crate::error::Result;
use crate::exec::{Exec, Host, Level};
use crate::http::Transport;
use crate::rows;
use crate::sql::StateRow;

/// The executor's host as the machines' [`Env`].
struct ExecEnv<'a, T, H>(&'a Exec<T, H>);

impl<T: Transport, H: Host> Env for ExecEnv<'_, T, H> {
    fn now_ms(&self) -> u64 {
        self.0.host.now_ms()
    }

    fn new_token(&mut self) -> String {
        self.0.new_token()
    }

    fn random(&mut self) -> u64 {
        self.0.host.random_u128() as u64
    }

    fn log(&mut self, level: Level, message: &str) {
        self.0.host.log(level, message);
    }
}

/// Runs one `update` of `state_id` (parts validated by the caller) under the fenced lock.
pub fn update<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    locks: &Locks,
    state_id: &str,
    partial: &str,
    completed: &str,
) -> Result<()> {
    let mut env = ExecEnv(exec);
    let mut machine = Update::new(
        state_id,
        partial,
        completed,
        Limits::of(&exec.config),
        locks.take(state_id),
        exec.host.now_ms(),
    );
    let mut step = machine.start(&mut env);
    let result = loop {
        step = match step {
            Step::Send {
                statement,
                retry_until_ms,
            } => {
                let answer = answer(exec, &statement, retry_until_ms);
                machine.answer(answer, &mut env)
            }
            Step::Pause(ms) => {
                exec.host.sleep_ms(ms);
                machine.answer(Answer::Resumed, &mut env)
            }
            Step::Done(result) => break result,
        };
    };
    locks.put(state_id, machine.into_memory());
    result
}

/// Renews `lock` to `until_ms` (see [`Renewal`]); `lock-lost` when the log says it is not held.
pub fn renew<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    lock: &mut LockHandle,
    until_ms: u64,
) -> Result<()> {
    let now = exec.host.now_ms();
    let (mut renewal, mut next) =
        Renewal::start(lock.clone(), until_ms, now, exec.config.lock_lease_ms);
    loop {
        match next {
            Renewing::Send(statement) => {
                let answer = answer(exec, &statement, None);
                (renewal, next) = renewal.answer(answer, exec.host.now_ms());
            }
            Renewing::Renewed(renewed) => {
                *lock = renewed;
                return Ok(());
            }
            Renewing::Failed(e, _) => return Err(e),
        }
    }
}

fn answer<T: Transport, H: Host>(
    exec: &Exec<T, H>,
    statement: &Statement,
    retry_until_ms: Option<u64>,
) -> Answer {
    let result = match retry_until_ms {
        Some(until) => exec.retrying_until(until, || send(exec, statement)),
        None => send(exec, statement),
    };
    result.unwrap_or_else(Answer::Failed)
}

/// Sends one statement of the protocol as its SQL.
fn send<T: Transport, H: Host>(exec: &Exec<T, H>, statement: &Statement) -> Result<Answer> {
    Ok(match statement {
        Statement::ReadOutlook { state_id } => Answer::Outlook(
            exec.fetch_first(&exec.sql.log_outlook(state_id))?
                .unwrap_or_default(),
        ),
        Statement::ReadNewest { state_id } => Answer::Newest(fenced::newest(exec, state_id)?),
        Statement::ReadClaims {
            state_id,
            generation,
        } => Answer::Claims(exec.fetch(&exec.sql.log_claims(state_id, *generation, true))?),
        Statement::Append(entry) if entry.event == fenced::Event::Want => {
            fenced::say_wanted(exec, entry)?;
            Answer::Appended
        }
        Statement::Append(entry) => {
            fenced::append(exec, entry)?;
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
            if row.fits_in_params() {
                Answer::Written(exec.run_written(&exec.sql.write_guarded(row, guard, token))?)
            } else {
                // Too large for query parameters: check, then insert (what the guard does, in
                // two).
                if rows::number(&exec.run(&exec.sql.guard_holds(guard))?)? != 1 {
                    return Ok(Answer::Written(Some(0)));
                }
                let mut data = Vec::new();
                row.encode(&mut data)?;
                exec.run(&exec.sql.insert_states(data, token))?;
                Answer::Written(Some(1))
            }
        }
    })
}

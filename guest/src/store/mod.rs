//! The operations of the contract, as plain Rust over a [`Transport`] and a [`Platform`].

use serde_json::{Map, Value};

use crate::config::LockMode;
use crate::error::{Error, LockInfo, Result, WriterInfo};
use crate::http::Transport;
use crate::lock::{self, Locks};
use crate::merge::{merged, or_empty, parse_object};
use crate::rows;
use crate::session::{Platform, Session};
use crate::sql::{Op, Origin, Query, StateRow};
use protocol::grant::LockHandle;
use protocol::set::{self, Answer, Set, Step};

mod bulk;
mod insert;
mod validate;

#[cfg(test)]
use insert::json_len;
pub use validate::{MAX_STATE_BYTES, MAX_STATE_ID_BYTES, validate_state_id};
use validate::{validate_size, validate_state};

/// A state as the contract carries it: JSON object texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub state_id: String,
    pub partial: String,
    pub completed: String,
}

/// One configured store: the operations of the contract, over the query executor, with the
/// lock's memory of this instance.
pub struct Store<T, H> {
    pub(crate) session: Session<T, H>,
    pub(crate) locks: Locks,
}

/// The newest row of `state_id` over `session`, a tombstone too (both parts `None`).
pub(crate) fn stored<T: Transport, H: Platform>(
    session: &Session<T, H>,
    state_id: &str,
) -> Result<Option<protocol::rows::StoredTuple>> {
    Ok(session
        .fetch_first(&session.sql.get(state_id))?
        .map(|row| (row.partial_state, row.completed_state, row.updated_at_ms)))
}

impl State {
    fn row(&self, version_ms: u64) -> StateRow<'_> {
        StateRow {
            state_id: &self.state_id,
            partial: &self.partial,
            completed: &self.completed,
            version_ms,
        }
    }
}

impl<T: Transport, H: Platform> Store<T, H> {
    pub fn open(uri: &str, settings: &[(String, String)], transport: T, host: H) -> Result<Self> {
        Ok(Store {
            session: Session::open(uri, settings, transport, host)?,
            locks: Locks::default(),
        })
    }

    /// Checks the store once for an operator, writing nothing (see [`crate::doctor`]).
    pub fn diagnose(&self) -> crate::doctor::Diagnosis {
        crate::doctor::diagnose(&self.session)
    }

    /// Creates what is missing of the schema, then checks the deployment (see [`Session::migrate`]).
    pub fn migrate(&self) -> Result<()> {
        self.session.migrate()
    }

    /// The DDL `migrate` runs, as SQL text (see [`Session::schema`]).
    pub fn schema(&self) -> Vec<String> {
        self.session.schema()
    }

    /// The instance's host (time, randomness, the log).
    pub fn host(&self) -> &H {
        &self.session.host
    }

    /// Takes the lock of `state_id` (see `lock`).
    pub fn acquire_lock(&self, state_id: &str) -> Result<LockHandle> {
        validate_state_id(state_id)?;
        lock::release_kept(&self.session, &self.locks, state_id)?;
        lock::acquire(&self.session, &self.locks, state_id)
    }

    /// Holds `state_id` for this run until `close` (see `lock::run`): refused at once with
    /// `locked` while another run holds it, unless `force`.
    pub fn hold_run(&self, state_id: &str, force: bool) -> Result<()> {
        validate_state_id(state_id)?;
        lock::run::hold(&self.session, &self.locks, state_id, force)
    }

    /// Releases the grants `update` kept that were idle for `lock_linger_seconds`; returns
    /// when to call again (unix ms), or `None` when nothing is kept.
    pub fn idle(&self) -> Result<Option<u64>> {
        lock::idle(&self.session, &self.locks, false)
    }

    /// Releases every grant `update` kept (the host calls this when it is done with the store).
    pub fn close(&self) -> Result<()> {
        lock::idle(&self.session, &self.locks, true).map(drop)
    }

    pub fn renew_lock(&self, lock: &mut LockHandle) -> Result<()> {
        lock::renew(&self.session, lock)
    }

    pub fn release_lock(&self, lock: &LockHandle) -> Result<()> {
        lock::release(&self.session, &self.locks, lock)
    }

    pub fn get(&self, state_id: &str) -> Result<Option<State>> {
        validate_state_id(state_id)?;
        Ok(self.stored(state_id)?.and_then(|(partial, completed, _)| {
            if partial.is_none() && completed.is_none() {
                return None; // a tombstone: deleted
            }
            Some(State {
                state_id: state_id.to_string(),
                partial: or_empty(partial),
                completed: or_empty(completed),
            })
        }))
    }

    /// The newest row of `state_id`, a tombstone too (both parts `None`).
    pub(crate) fn stored(&self, state_id: &str) -> Result<Option<protocol::rows::StoredTuple>> {
        stored(&self.session, state_id)
    }

    pub fn set(&self, state: &State) -> Result<()> {
        validate_state(state)?;
        let row = state.row(self.session.host.now_ms());
        if row.fits_in_params() {
            return self.set_at_most_once(state);
        }
        let stored = self.read_version(&self.session.sql.version_of(&state.state_id))?;
        self.write(
            std::slice::from_ref(state),
            self.next_version(stored)?,
            &self.origin(Op::Set),
        )
    }

    /// One round trip in the common case (two in settle mode: the server's clock first); see
    /// `protocol::set`.
    fn set_at_most_once(&self, state: &State) -> Result<()> {
        let (mut set, mut step) = Set::new(&state.partial, &state.completed, self.clock_ms()?);
        loop {
            let statement = match step {
                Step::Done(result) => return result,
                Step::Send(statement) => statement,
            };
            let answer = match statement {
                set::Statement::WriteUnlessNewer { version_ms } => {
                    let token = self.session.new_token();
                    let query = self.session.sql.set_unless_newer(
                        state.row(version_ms),
                        &self.origin(Op::Set),
                        &token,
                    );
                    self.session
                        .write(&query)
                        .map(|(landed, resent)| Answer::Written {
                            rows: landed.rows(),
                            resent,
                        })
                }
                set::Statement::ReadStored => self.stored(&state.state_id).map(Answer::Stored),
                set::Statement::Insert { version_ms } => self
                    .write(
                        std::slice::from_ref(state),
                        version_ms,
                        &self.origin(Op::Set),
                    )
                    .map(|()| Answer::Inserted),
            };
            step = set.answer(answer.unwrap_or_else(Answer::Failed));
        }
    }

    pub fn update(&self, state: &State) -> Result<()> {
        validate_state_id(&state.state_id)?;
        validate_size(state)?;
        let partial = parse_object(&state.partial, "partial state")?;
        let completed = parse_object(&state.completed, "completed state")?;
        if self.session.config.lock_mode == LockMode::Settle {
            let mut held = lock::acquire(&self.session, &self.locks, &state.state_id)?;
            let result = self.update_locked(state, partial, completed, &mut held);
            let released = lock::release(&self.session, &self.locks, &held);
            return result.and(released);
        }
        lock::drive::update(
            &self.session,
            &self.locks,
            &state.state_id,
            &state.partial,
            &state.completed,
        )
    }

    fn update_locked(
        &self,
        state: &State,
        partial: Map<String, Value>,
        completed: Map<String, Value>,
        lock: &mut LockHandle,
    ) -> Result<()> {
        let stored = self.stored(&state.state_id)?;
        let stored_version = stored.as_ref().map_or(0, |(_, _, v)| *v);
        let (partial, completed) = merged(partial, completed, stored.map(|(p, c, _)| (p, c)));
        let to_write = State {
            state_id: state.state_id.clone(),
            partial,
            completed,
        };
        let version = lock::write_version(&self.session, lock, stored_version)?;
        self.write(
            std::slice::from_ref(&to_write),
            version,
            &self.origin_locked(Op::Update, lock),
        )?;
        lock::confirm_write(&self.session, lock)
    }

    /// Overwrites a state under a lock the caller holds: the write is fenced by the lock, so it
    /// fails with `lock-lost` rather than overwrite what a later holder wrote.
    pub fn set_locked(&self, state: &State, lock: &mut LockHandle) -> Result<()> {
        validate_state(state)?;
        if state.state_id != lock.state_id {
            return Err(Error::InvalidInput(format!(
                "the lock is on {:?}, not on {:?}",
                lock.state_id, state.state_id
            )));
        }
        let stored = self.read_version(&self.session.sql.version_of(&state.state_id))?;
        self.write_fenced(Some(state), Op::Set, lock, stored)
            .map(drop)
    }

    /// Writes `state` (none: a tombstone) as the lock's id's next version under `lock`, fenced
    /// by it, above the `stored` version; returns the version written.
    pub(crate) fn write_fenced(
        &self,
        state: Option<&State>,
        op: Op,
        lock: &mut LockHandle,
        stored: u64,
    ) -> Result<u64> {
        let version = lock::write_version(&self.session, lock, stored)?;
        let origin = self.origin_locked(op, lock);
        lock::within_lease(&self.session, lock, || match state {
            Some(state) => self.write(std::slice::from_ref(state), version, &origin),
            None => self.bury(&[(&lock.state_id, version)], &origin),
        })?;
        lock::confirm_write(&self.session, lock)?;
        Ok(version)
    }

    /// Writes `state` as the lock's id's next version only if the server finds, as it writes,
    /// that the lock is still this grant's and the stored version is still `stored` (the
    /// guarded write `update` makes; see `sql::Guard`); returns the version written. Refused, it
    /// writes nothing, to the state or the history, and fails with `lock-lost`. In settle mode,
    /// which has no generations to guard by, the write is fenced by its version as `set_locked`'s.
    pub(crate) fn write_guarded_locked(
        &self,
        state: &State,
        op: Op,
        lock: &mut LockHandle,
        stored: u64,
    ) -> Result<u64> {
        if lock.mode == LockMode::Settle {
            return self.write_fenced(Some(state), op, lock, stored);
        }
        let version = lock::write_version(&self.session, lock, stored)?;
        let guard = protocol::guard::Guard {
            state_id: lock.state_id.clone(),
            generation: lock.token,
            owner: lock.owner.clone(),
            confirmed: true,
            previous_until: u64::MAX,
            expected_version: stored,
        };
        let origin = self.origin_locked(op, lock);
        let row = state.row(version);
        let token = self.session.new_token();
        let written = lock::within_lease(&self.session, lock, || {
            if row.fits_in_params() {
                let query = self.session.sql.write_guarded(row, &origin, &guard, &token);
                return self.session.write(&query).map(|(landed, _)| landed.rows());
            }
            // Too large for query parameters: the guard as a read, then a plain insert.
            if rows::number(&self.session.run(&self.session.sql.guard_holds(&guard))?)? != 1 {
                return Ok(Some(0));
            }
            self.write(std::slice::from_ref(state), version, &origin)
                .map(|()| Some(1))
        })?;
        // Anything but one row may still have landed: a resend after an unknown outcome finds
        // the guard no longer holds because its first send did. What is stored says: this row,
        // at its version (another write may have the same version).
        let ours = (
            Some(state.partial.clone()),
            Some(state.completed.clone()),
            version,
        );
        let landed = written == Some(1) || self.stored(&lock.state_id)? == Some(ours);
        if !landed {
            return Err(Error::LockLost(format!(
                "nothing was written to {:?}: the lock (token {}) is no longer held, or the \
                 state changed since it was read",
                lock.state_id, lock.token
            )));
        }
        lock::confirm_write(&self.session, lock)?;
        Ok(version)
    }

    /// Deletes the state as it is now: a tombstone above the newest version read here (see
    /// `sql::encode_tombstone`), at a version fixed before sending, so that a retry of the
    /// delete lands on itself and a state written after it stays. In settle mode, the
    /// original's `DELETE` of the id's rows (see `bury`), which removes whatever is stored
    /// when it runs, as the original's delete does.
    pub fn delete(&self, state_id: &str) -> Result<()> {
        validate_state_id(state_id)?;
        match self.stored(state_id)? {
            None | Some((None, None, _)) => Ok(()), // nothing stored, or deleted already
            Some((_, _, version)) => {
                self.bury_above(&[(state_id, version)], &self.origin(Op::Delete))
            }
        }
    }

    pub fn clear(&self, state_id: &str) -> Result<()> {
        validate_state_id(state_id)?;
        lock::release_kept(&self.session, &self.locks, state_id)?;
        let mut held = lock::acquire(&self.session, &self.locks, state_id)?;
        let result = self.clear_locked(&mut held);
        let released = lock::release(&self.session, &self.locks, &held);
        result.and(released)
    }

    /// Deletes a state under a lock the caller holds: a tombstone written as `set_locked` writes
    /// a state, so with fencing it fails with `lock-lost` rather than bury what a later holder
    /// wrote.
    pub fn clear_locked(&self, lock: &mut LockHandle) -> Result<()> {
        let stored = self.read_version(&self.session.sql.version_of(&lock.state_id))?;
        if stored == 0 {
            return Ok(()); // nothing stored: no tombstone for an id that never was
        }
        self.write_fenced(None, Op::Clear, lock, stored).map(drop)
    }

    pub fn lock_info(&self, state_id: &str) -> Result<Option<LockInfo>> {
        validate_state_id(state_id)?;
        lock::info(&self.session, state_id)
    }

    /// Records who this store's writes come from (see [`Session::identify`]).
    pub fn identify(&self, who: WriterInfo) {
        self.session.identify(who);
    }

    /// The processes behind instance ids (see [`Session::writers`]); the ids travel in one
    /// query parameter, so at most [`crate::sql::PARAMS_MAX_BYTES`] of them.
    pub fn writers(&self, ids: &[String]) -> Result<Vec<rows::Writer>> {
        let bytes: usize = ids.iter().map(|id| id.len() + 3).sum();
        if bytes > crate::sql::PARAMS_MAX_BYTES {
            return Err(Error::InvalidInput(format!(
                "{} writer ids ({bytes} bytes) are more than one read takes ({} bytes)",
                ids.len(),
                crate::sql::PARAMS_MAX_BYTES
            )));
        }
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        Ok(self.session.writers(&ids))
    }

    pub fn force_unlock(&self, state_id: &str) -> Result<bool> {
        validate_state_id(state_id)?;
        lock::force_unlock(&self.session, state_id)
    }

    /// A version for a new write: the clock, but never at or below what is stored, so a client
    /// whose clock is behind still overwrites.
    fn next_version(&self, stored_ms: u64) -> Result<u64> {
        Ok(self.clock_ms()?.max(stored_ms.saturating_add(1)))
    }

    /// The clock versions are taken from: the host's, or in settle mode the server's (see
    /// [`Session::version_clock_ms`]).
    fn clock_ms(&self) -> Result<u64> {
        self.session.version_clock_ms()
    }

    fn read_version(&self, query: &Query) -> Result<u64> {
        rows::number(&self.session.run(query)?)
    }

    /// Who writes, for the history: this instance, under no lock.
    fn origin(&self, op: Op) -> Origin<'_> {
        Origin {
            op,
            writer: &self.session.instance,
            lock_owner: "",
            token: 0,
        }
    }

    /// Who writes, for the history: this instance, under `lock`.
    fn origin_locked<'a>(&'a self, op: Op, lock: &'a LockHandle) -> Origin<'a> {
        Origin {
            op,
            writer: &self.session.instance,
            lock_owner: &lock.owner,
            token: lock.token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_texts_length_in_json_is_what_serde_json_writes() {
        let every_byte: String = (0u8..0x80).map(char::from).collect();
        for text in [
            "",
            "plain",
            "{\"a\":\"b\\\\c\"}",
            "{\n\t\r}",
            "é ü 日本",
            &every_byte,
        ] {
            let written = serde_json::to_string(text).expect("a string encodes");
            assert_eq!(json_len(text), written.len() - 2, "{text:?}");
        }
    }

    #[test]
    fn objects_only() {
        assert!(parse_object("{\"a\":1}", "x").is_ok());
        for (text, kind) in [
            ("[]", "an array"),
            ("1", "a number"),
            ("\"s\"", "a string"),
            ("null", "null"),
            ("true", "a boolean"),
        ] {
            match parse_object(text, "partial state") {
                Err(Error::InvalidInput(m)) => assert!(m.contains(kind), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(
            matches!(parse_object("{", "x"), Err(Error::InvalidInput(m)) if m.contains("not valid JSON"))
        );
        assert!(matches!(parse_object("", "x"), Err(Error::InvalidInput(_))));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(matches!(
            parse_object(&deep, "x"),
            Err(Error::InvalidInput(_))
        ));
        let deep = "{\"a\":".repeat(100_000) + "1" + &"}".repeat(100_000);
        assert!(matches!(
            parse_object(&deep, "x"),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn state_ids_must_be_non_empty_and_bounded() {
        assert!(validate_state_id("dev:tap-a-to-b").is_ok());
        assert!(validate_state_id("ü ✓ '\"\\%_*?[]").is_ok());
        assert!(matches!(validate_state_id(""), Err(Error::InvalidInput(_))));
        assert!(matches!(
            validate_state_id(&"x".repeat(5000)),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn null_parts_read_as_empty_objects() {
        assert_eq!(or_empty(None), "{}");
        assert_eq!(or_empty(Some("null".into())), "{}");
        assert_eq!(or_empty(Some("".into())), "{}");
        assert_eq!(or_empty(Some("{\"a\":1}".into())), "{\"a\":1}");
    }
}

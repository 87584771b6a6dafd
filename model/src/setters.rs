//! Processes that `set` the state without the lock, each the protocol's own `set::Set`.

use protocol::set::{self as overwrite, Set};

use crate::*;

impl LockModel {
    pub(crate) fn setter_of(&self, client: u8) -> Option<u8> {
        client.checked_sub(self.clients).filter(|s| *s < self.sets)
    }

    pub(crate) fn is_setter(&self, client: u8) -> bool {
        self.setter_of(client).is_some()
    }

    /// A setter's next step, its read answered by `replica`. Returns false when it cannot step.
    pub(crate) fn set_step(&self, world: &mut World, setter: u8, replica: u8) -> bool {
        let (set, step) = match world.setters[setter as usize].clone() {
            Setter::Idle => Set::new(&partial_of(set_bit(setter)), "{}", world.now),
            Setter::Asks { set, statement } => (set, overwrite::Step::Send(statement)),
            _ => return false,
        };
        self.set_drive(world, setter, replica, set, step);
        true
    }

    /// Runs a setter's `set` from `step`: its read answered at once from `replica`, up to an
    /// insert sent or the end.
    pub(crate) fn set_drive(
        &self,
        world: &mut World,
        setter: u8,
        replica: u8,
        mut set: Set,
        mut step: overwrite::Step,
    ) {
        loop {
            let statement = match step {
                overwrite::Step::Done(result) => {
                    world.setters[setter as usize] = Setter::Done { ok: result.is_ok() };
                    return;
                }
                overwrite::Step::Send(statement) => statement,
            };
            let (version, unless_newer) = match statement {
                overwrite::Statement::ReadStored => {
                    let stored = stored_row(final_state(world.view(replica)));
                    step = set.answer(overwrite::Answer::Stored(stored));
                    continue;
                }
                overwrite::Statement::WriteUnlessNewer { version_ms } => (version_ms, true),
                overwrite::Statement::Insert { version_ms } => (version_ms, false),
            };
            let client = self.clients + setter;
            let row = Row::State {
                version,
                updates: set_bit(setter),
                // A setter's rows record the sets that had landed when they were sent.
                generation: u64::from(world.set_landed),
                owner: "setter".into(),
                client,
                after_set: false,
            };
            let token = format!("set{setter}/{version}/{unless_newer}");
            self.send(world, Some(client), row, token, None, None);
            if let Some(f) = world.in_flight.last_mut() {
                f.unless_newer = unless_newer;
            }
            world.setters[setter as usize] = Setter::Awaiting { set };
            return;
        }
    }

    /// Gives `answer` to a setter's `set`; what it asks next waits for the setter's next step.
    pub(crate) fn set_answer(
        &self,
        world: &mut World,
        setter: u8,
        mut set: Set,
        answer: overwrite::Answer,
    ) {
        world.setters[setter as usize] = match set.answer(answer) {
            overwrite::Step::Send(statement) => Setter::Asks { set, statement },
            overwrite::Step::Done(result) => Setter::Done { ok: result.is_ok() },
        };
    }

    /// The acknowledgement of a setter's insert arrives.
    pub(crate) fn set_acknowledged(&self, world: &mut World, setter: u8, f: &InFlight) {
        let Setter::Awaiting { set } = world.setters[setter as usize].clone() else {
            return;
        };
        let answer = if f.unless_newer {
            overwrite::Answer::Written {
                rows: Some(u64::from(!f.dropped)),
                resent: f.resent,
            }
        } else {
            overwrite::Answer::Inserted
        };
        self.set_answer(world, setter, set, answer);
    }
}

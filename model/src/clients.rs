//! The clients: each drives the protocol crate's update (or settle mode's try), its reads
//! answered from what one replica has, its inserts sent into the world.

use protocol::env::Env;
use protocol::env::Level;
use protocol::error::Error;
use protocol::fenced::{self, LogEntry};
use protocol::grant::Attempt;
use protocol::guard::Guard;
use protocol::guard::admits;
use protocol::rows::{Candidate, Event, Outlook};
use protocol::set as overwrite;
use protocol::settle::{self, Try};
use protocol::update::{Answer, Statement, Step, Update};

use crate::*;

/// A client's view of time and randomness, for the guest's protocol.
pub(crate) struct ClientEnv {
    now: u64,
    client: u8,
    tokens: u8,
}

impl Env for ClientEnv {
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn new_token(&mut self) -> String {
        self.tokens += 1;
        format!("c{}t{}", self.client, self.tokens)
    }
    fn random(&mut self) -> u64 {
        0
    }
    fn log(&mut self, _: Level, _: &str) {}
}

impl LockModel {
    pub(crate) fn replicas_to_ask(&self) -> u8 {
        if self.quorum() { 1 } else { self.replicas }
    }

    pub(crate) fn all_replicas(&self) -> u8 {
        (1 << self.replicas) - 1
    }

    pub(crate) fn clock(&self, world: &World, client: u8) -> u64 {
        world.now + world.clients[client as usize].offset
    }

    pub(crate) fn env(&self, world: &World, client: u8) -> ClientEnv {
        ClientEnv {
            now: self.clock(world, client),
            client,
            tokens: world.clients[client as usize].tokens,
        }
    }

    pub(crate) fn send(
        &self,
        world: &mut World,
        client: Option<u8>,
        row: Row,
        token: String,
        guard: Option<Guard>,
        retry_until: Option<u64>,
    ) {
        world.in_flight.push(InFlight {
            client,
            row,
            token,
            guard,
            retry_until,
            landed: false,
            dropped: false,
            resent: false,
            unless_newer: false,
        });
    }

    /// Gives `answer` to `client`'s update and takes its next step.
    pub(crate) fn answer(
        &self,
        world: &mut World,
        client: u8,
        mut update: Box<Update>,
        answer: Answer,
    ) {
        let mut env = self.env(world, client);
        let step = update.answer(answer, &mut env);
        world.clients[client as usize].tokens = env.tokens;
        self.next(world, client, update, step);
    }

    /// What `client` does after its update asked for `step`.
    pub(crate) fn next(&self, world: &mut World, client: u8, update: Box<Update>, step: Step) {
        let now = self.clock(world, client);
        let c = &mut world.clients[client as usize];
        let mut close = None;
        c.pc = match step {
            Step::Send {
                statement,
                retry_until_ms,
            } => Pc::Asks {
                update,
                statement,
                retry_until: retry_until_ms,
            },
            Step::Pause(_) => {
                c.saw_held = true;
                Pc::Paused {
                    update,
                    woken: false,
                }
            }
            Step::Done(Err(e)) => {
                c.memory = update.into_memory();
                if matches!(e, Error::Locked(_)) && world.killed_at.is_some_and(|k| c.started > k) {
                    world.locked_out = true;
                }
                Pc::Done { ok: false }
            }
            Step::Done(Ok(())) => {
                c.memory = update.into_memory();
                world.acknowledged |= update_bit(client, c.update);
                if self.updates > 1 && c.memory.kept.is_none() && c.memory.shared(now) {
                    world.gave_back = true;
                    // It wrote under the very grant it resumed and released that grant after
                    // (a hand-back, or a loss, ends with another generation released or kept).
                    let wanted = |g| {
                        world.rows.iter().any(|r| {
                            matches!(&r.row, Row::Log(Entry(e)) if fenced::wanted_generation(e) == Some(g))
                        })
                    };
                    let released = c.memory.released.as_ref().map(|r| r.generation);
                    world.heeded |= c.resumed.is_some_and(|g| released == Some(g) && wanted(g));
                }
                if world.killed_at.is_some_and(|k| c.started > k) {
                    world.recovered = true;
                }
                if c.update + 1 < self.updates {
                    c.update += 1;
                    Pc::Idle
                } else if let Some(kept) = c.memory.kept.take() {
                    // The host's `close`: give the kept grant back.
                    close = Some(fenced::entry(&kept.handle, Event::Release, now));
                    Pc::Closing
                } else {
                    Pc::Done { ok: true }
                }
            }
        };
        if let Some(release) = close {
            let token = release.token();
            self.send(
                world,
                Some(client),
                Row::Log(Entry(release)),
                token,
                None,
                None,
            );
        }
    }

    /// Whether `guard` admits a write on the rows of `view`.
    pub(crate) fn admits<'a>(guard: &Guard, view: impl Iterator<Item = &'a Row> + Clone) -> bool {
        let stored = final_state(view.clone()).map_or(0, |s| s.version);
        let claims = fenced::claims_on(log(view.clone()), guard.generation, None);
        admits(guard, &fenced::fold(log(view)), &claims, stored)
    }

    /// Runs `client`'s update from `step`: its reads are answered at once from what `replica`
    /// has (a read and what the client does with it are one step, as a read followed at once by
    /// an insert; the insert then lands whenever), up to an insert sent, a pause or the end.
    pub(crate) fn drive(
        &self,
        world: &mut World,
        client: u8,
        replica: u8,
        mut update: Box<Update>,
        mut step: Step,
    ) {
        loop {
            let Step::Send {
                statement,
                retry_until_ms,
            } = step
            else {
                return self.next(world, client, update, step);
            };
            // A `want` is a hint that decides nothing (no decision reads it): it lands on every
            // replica as it is sent. When it lands only moves when a keeper sees it, and a
            // keeper that gives its grant back early, or keeps it, is explored anyway; an
            // insert in flight here would multiply every wait's states for no safety question.
            if let Statement::Append(entry) = &statement
                && entry.event == Event::Want
            {
                // Kept as what the folds read of it (the generation it wants), once: the wants
                // of one generation share a token, and land once.
                let row = Row::Log(Entry(LogEntry {
                    at_ms: 0,
                    ..entry.clone()
                }));
                if !world.rows.iter().any(|r| r.row == row) {
                    let replicas = self.all_replicas();
                    world.rows.push(Landed { row, replicas });
                }
                let mut env = self.env(world, client);
                step = update.answer(Answer::Appended, &mut env);
                world.clients[client as usize].tokens = env.tokens;
                continue;
            }
            // What the statement gets from what `replica` has: an answer, or an insert sent.
            let outcome = {
                let view = world.view(replica);
                let stored = || stored_row(final_state(view.clone()));
                match statement {
                    Statement::ReadOutlook { .. } => Ok(Answer::Outlook(Outlook {
                        newest: fenced::fold(log(view.clone())),
                        stored: stored(),
                    })),
                    Statement::ReadNewest { .. } => {
                        Ok(Answer::NewestGeneration(fenced::fold(log(view.clone()))))
                    }
                    Statement::ReadClaims { generation, .. } => Ok(Answer::Claims(
                        fenced::claims_on(log(view.clone()), generation, stored()),
                    )),
                    Statement::Append(entry) => {
                        let token = entry.token();
                        Err((Row::Log(Entry(entry)), token, None))
                    }
                    Statement::WriteGuarded {
                        partial,
                        completed,
                        version_ms,
                        guard,
                        token,
                    } => {
                        if Self::admits(&guard, view.clone()) {
                            let set = final_state(view).is_some_and(|s| s.updates & SET_BITS != 0);
                            let updates = updates_in(&partial);
                            assert!(
                                partial == partial_of(updates) && completed == "{}",
                                "the model keeps a state as the updates it holds: {partial} {completed}"
                            );
                            let row = Row::State {
                                version: version_ms,
                                updates,
                                generation: guard.generation,
                                owner: guard.owner.clone(),
                                client,
                                after_set: set,
                            };
                            Err((row, token, Some(guard)))
                        } else {
                            Ok(Answer::RowsWritten(Some(0)))
                        }
                    }
                }
            };
            let answer = match outcome {
                Ok(answer) => answer,
                Err((row, token, guard)) => {
                    self.send(world, Some(client), row, token, guard, retry_until_ms);
                    world.clients[client as usize].pc = Pc::Awaiting { update };
                    return;
                }
            };
            let mut env = self.env(world, client);
            step = update.answer(answer, &mut env);
            world.clients[client as usize].tokens = env.tokens;
        }
    }

    /// A client's next step, its reads answered by `replica` (every replica sees the same
    /// with quorum). Returns false when the client cannot step now.
    pub(crate) fn step(&self, world: &mut World, client: u8, replica: u8) -> bool {
        let now = self.clock(world, client);
        let pc = world.clients[client as usize].pc.clone();
        match (self.protocol, pc) {
            (Protocol::Fenced, Pc::Idle) => {
                let started = world.now;
                let c = &mut world.clients[client as usize];
                c.started = started;
                c.resumed = c.memory.kept.as_ref().map(|k| k.handle.token);
                let bit = update_bit(client, c.update);
                let mut update = Box::new(Update::new(
                    "s",
                    &update_partial(bit),
                    "{}",
                    self.limits(),
                    std::mem::take(&mut c.memory),
                    now,
                ));
                let mut env = self.env(world, client);
                let step = update.start(&mut env);
                world.clients[client as usize].tokens = env.tokens;
                self.drive(world, client, replica, update, step);
            }
            (Protocol::Fenced, Pc::Paused { mut update, woken }) => {
                if !woken {
                    return false; // time must pass
                }
                let mut env = self.env(world, client);
                let step = update.answer(Answer::Resumed, &mut env);
                world.clients[client as usize].tokens = env.tokens;
                self.drive(world, client, replica, update, step);
            }
            (
                Protocol::Fenced,
                Pc::Asks {
                    update,
                    statement,
                    retry_until,
                },
            ) => {
                let step = Step::Send {
                    statement,
                    retry_until_ms: retry_until,
                };
                self.drive(world, client, replica, update, step);
            }
            (Protocol::Settle, Pc::Idle) => {
                if world.clients[client as usize].attempts == 0 {
                    world.clients[client as usize].pc = Pc::Done { ok: false };
                    return true;
                }
                let (attempt, step) = Try::start(
                    "s",
                    format!("c{client}"),
                    now * 1000,
                    self.lease * 1000,
                    self.settle * 1000,
                );
                return self.settle_drive(world, client, replica, Box::new(attempt), step, true);
            }
            (Protocol::Settle, Pc::Settling { mut attempt, wake }) => {
                if now < wake {
                    return false;
                }
                let step = attempt.answer(settle::Answer::Resumed, now * 1000);
                return self.settle_drive(world, client, replica, attempt, step, false);
            }
            (Protocol::Settle, Pc::InSection) => {
                Self::withdraw(world, client);
                world.clients[client as usize].pc = Pc::Done { ok: true };
                world.acknowledged |= update_bit(client, 0);
            }
            _ => return false,
        }
        true
    }

    /// Runs `client`'s settle-mode try from `step` (ticks are the guest's seconds): its reads
    /// and deletes are answered at once from what `replica` has, up to the candidate's insert,
    /// the settle pause or the end. A `fresh` try that finds the lock held at its first read is
    /// no step: the client waits for time to pass or the holder to leave (false).
    pub(crate) fn settle_drive(
        &self,
        world: &mut World,
        client: u8,
        replica: u8,
        mut attempt: Box<Try>,
        mut step: settle::Step,
        fresh: bool,
    ) -> bool {
        let now = self.clock(world, client);
        loop {
            let answer = match step {
                settle::Step::Done(Ok(Attempt::Granted(_))) => {
                    world.clients[client as usize].pc = Pc::InSection;
                    return true;
                }
                settle::Step::Done(Ok(Attempt::Held(_))) => {
                    if fresh {
                        return false;
                    }
                    let c = &mut world.clients[client as usize];
                    c.saw_held = true;
                    c.pc = Pc::Idle;
                    return true;
                }
                settle::Step::Done(Err(_)) => {
                    world.clients[client as usize].pc = Pc::Done { ok: false };
                    return true;
                }
                settle::Step::Pause(ms) => {
                    world.clients[client as usize].pc = Pc::Settling {
                        attempt,
                        wake: now + ms / 1000,
                    };
                    return true;
                }
                settle::Step::Send(settle::Statement::DeleteStale { cutoff_s }) => {
                    world.rows.retain(|r| {
                        !matches!(r.row, Row::Candidate { locked_at, .. } if locked_at < cutoff_s)
                    });
                    settle::Answer::Done
                }
                settle::Step::Send(settle::Statement::ReadCandidates { cutoff_s }) => {
                    let mut all: Vec<Candidate> = world
                        .view(replica)
                        .filter_map(|r| match *r {
                            Row::Candidate { client, locked_at } if locked_at >= cutoff_s => {
                                Some(Candidate {
                                    lock_id: format!("c{client}"),
                                    locked_at_s: locked_at,
                                })
                            }
                            _ => None,
                        })
                        .collect();
                    all.sort_by(|a, b| a.lock_id.cmp(&b.lock_id));
                    all.dedup();
                    settle::Answer::Candidates(all)
                }
                settle::Step::Send(settle::Statement::Insert { now_ms, .. }) => {
                    let c = &mut world.clients[client as usize];
                    c.attempts -= 1;
                    let token = format!("candidate/{client}/{}", c.attempts);
                    let row = Row::Candidate {
                        client,
                        locked_at: now_ms / 1000,
                    };
                    self.send(world, Some(client), row, token, None, None);
                    world.clients[client as usize].pc = Pc::Inserting { attempt };
                    return true;
                }
                settle::Step::Send(settle::Statement::Delete { .. }) => {
                    Self::withdraw(world, client);
                    settle::Answer::Done
                }
            };
            step = attempt.answer(answer, now * 1000);
        }
    }

    /// Settle mode's delete of a client's candidates (synchronous, on every replica).
    pub(crate) fn withdraw(world: &mut World, client: u8) {
        world
            .rows
            .retain(|r| !matches!(r.row, Row::Candidate { client: c, .. } if c == client));
    }

    /// The acknowledgement of a client's insert arrives (`dropped`: it landed as nothing).
    pub(crate) fn acknowledge(&self, world: &mut World, client: u8, row: &Row, dropped: bool) {
        let now = self.clock(world, client);
        let pc = world.clients[client as usize].pc.clone();
        match pc {
            Pc::Awaiting { update } => {
                let answer = match row {
                    Row::State { .. } => Answer::RowsWritten(Some(u64::from(!dropped))),
                    _ => Answer::Appended,
                };
                self.answer(world, client, update, answer);
            }
            Pc::Closing => world.clients[client as usize].pc = Pc::Done { ok: true },
            Pc::Inserting { mut attempt } => {
                let step = attempt.answer(settle::Answer::Done, now * 1000);
                self.settle_drive(world, client, 0, attempt, step, false);
            }
            _ => {}
        }
    }

    /// A client's insert failed: its update gets the failure (it may still land).
    pub(crate) fn failed(&self, world: &mut World, client: u8) {
        if let Some(setter) = self.setter_of(client) {
            if let Setter::Awaiting { set } = world.setters[setter as usize].clone() {
                let error = Error::Unreachable("the model's setter gave up".into());
                self.set_answer(world, setter, set, overwrite::Answer::Failed(error));
            }
            return;
        }
        match world.clients[client as usize].pc.clone() {
            Pc::Awaiting { update } => {
                let error = Error::Unreachable("the model's client gave up".into());
                self.answer(world, client, update, Answer::Failed(error));
            }
            // Giving back a kept grant at close is best effort.
            Pc::Closing => world.clients[client as usize].pc = Pc::Done { ok: true },
            _ => {}
        }
    }
}

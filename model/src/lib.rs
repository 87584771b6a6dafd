//! A model of the lock and state protocol on ClickHouse, checked exhaustively by `stateright`.
//!
//! The clients run the protocol of `guest/src/lock` step by step, and every decision they take
//! is the guest's own pure function (`Newest::is_free`, `next_floor`, `decide_claim`,
//! `propose_version`, `near_lease_end`, `settle::winner`), called natively. What the model adds
//! is the world around them:
//!
//! - **Time.** One global time; each client reads it through its own clock, off by up to
//!   `skew`. Time advances by a step of its own, between any two other steps, so any client can
//!   stall anywhere for any length of time (up to the horizon).
//! - **Inserts.** An insert is sent, lands (becomes visible), and is acknowledged, as three
//!   steps, with anything in between. A response can be lost after the insert landed: the
//!   client sends the identical insert again under the same token, as the guest does.
//! - **Deduplication.** Keeper's token set, cluster-wide and atomic: an insert whose token is in
//!   the window is dropped and still acknowledged. The window can pass (its tokens are
//!   forgotten), so that a retry lands twice.
//! - **Replicas.** With the deployment's settings (quorum inserts on a replicated cluster; every
//!   insert on Cloud and on one server), a landed insert is visible to every deciding read,
//!   because `select_sequential_consistency` either sees it or fails and is retried. Without
//!   them (the `NoQuorum` mutant) an insert lands on one replica, reaches the others later, and
//!   each read is answered by any one replica.
//! - **Merges.** State is read with `FINAL` (highest version; equal versions, the last
//!   inserted), which is what a merge keeps, so merges change no answer and are not a step.
//!   The lock log is a plain MergeTree: merges never drop its rows.
//!
//! Each client makes one `update` (acquire, read, merge, write, release), and may renew its
//! lease once before writing. Properties are in [`LockModel::properties`]; mutants, each
//! removing one safety measure, in [`Mutant`].

use std::collections::BTreeSet;
use std::fmt;

use clickhouse_state::config::LockMode;
use clickhouse_state::lock::fenced::{self, Claim, ClaimOutcome, Guard, Newest};
use clickhouse_state::lock::settle::{self, Candidate};
use clickhouse_state::lock::{LockHandle, Proposed, propose_version};
use stateright::{Model, Property};

/// The writes of at most one holder take effect per generation.
pub const ONE_HOLDER: &str = "the writes of at most one holder take effect per generation";
/// No acknowledged update is lost (but those of a grant an operator forced open).
pub const NOTHING_LOST: &str = "no acknowledged update is lost";
/// A state row of an older generation never has a version at or above one of a newer one.
pub const FENCED: &str = "a fenced write never overwrites newer state";
/// Settle mode: never two clients in their critical sections at once.
pub const EXCLUSIVE: &str = "at most one holder at a time";
/// One client alone never finds the lock held.
pub const UNCONTENDED: &str = "an uncontended acquire succeeds";
/// An update whose guarded write was checked while an unlocked `set` was the stored state
/// merges into it.
pub const SET_KEPT: &str = "an update never writes over a set it could see";
/// Some update is acknowledged (the bounds leave room for the protocol to finish).
pub const COMPLETES: &str = "an update is acknowledged";

/// A safety measure taken away, to show that the model finds what it prevents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// Inserts without `insert_quorum`/`insert_quorum_parallel=0` on a replicated cluster:
    /// deciding reads see what one replica has.
    NoQuorum,
    /// A renewal adopts its new lease without checking the log after its row landed.
    NoRenewConfirm,
    /// A claim does not give way to a renewal that landed after it read the log.
    NoGiveWay,
    /// A new grant's versions have no floor above what the previous grant could write.
    NoFloor,
    /// A write acknowledged near or after its lease end is not checked against the log.
    NoWriteConfirm,
    /// Settle mode compares candidates with the time before the insert, as the original did.
    SettleBeforeInsert,
    /// A claim's first guarded write does not check the claim (only the stored version).
    NoClaimGuard,
    /// A guarded write does not check that the stored version is still the one it merged into
    /// (a kept grant writes its cached state as is).
    NoStaleCheck,
    /// A kept grant is written under to the very end of its lease.
    KeptToTheEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Fenced,
    Settle,
}

/// The bounds of one check.
#[derive(Debug, Clone)]
pub struct LockModel {
    pub protocol: Protocol,
    pub clients: u8,
    /// Replicas, each answering reads on its own when inserts are not quorum inserts.
    pub replicas: u8,
    /// The lease, in ticks (the guest's milliseconds).
    pub lease: u64,
    /// Settle mode's settle time, in ticks (the guest's seconds, see `settle_ms`).
    pub settle: u64,
    /// Clocks are off by up to this many ticks (each client's offset is in `0..=skew`).
    pub skew: u64,
    /// The last tick.
    pub horizon: u64,
    /// How many responses to inserts may be lost (each is then resent).
    pub lost_responses: u8,
    /// How many times the deduplication window may pass.
    pub window_expiries: u8,
    /// Claims each client may try before giving up.
    pub attempts: u8,
    /// Holders may renew once before they write.
    pub renew: bool,
    /// How many times an operator may force the lock open.
    pub forces: u8,
    /// How many background merges may run (of the state table; of the candidates in settle
    /// mode).
    pub merges: u8,
    /// Updates each client makes under one grant kept between them (linger); 1 or 2.
    pub updates: u8,
    /// Another process makes one unlocked `set` (a server-versioned write, in one step).
    pub setter: bool,
    pub mutant: Option<Mutant>,
}

impl LockModel {
    /// The fenced protocol: two clients, two replicas, a lease of 10 ticks with clocks off by up
    /// to its margin (1 tick), one lost response, one passing of the dedup window.
    pub fn fenced() -> Self {
        LockModel {
            protocol: Protocol::Fenced,
            clients: 2,
            replicas: 2,
            lease: 10,
            settle: 1,
            skew: 1,
            horizon: 13,
            lost_responses: 1,
            window_expiries: 1,
            attempts: 2,
            renew: true,
            forces: 0,
            merges: 0,
            updates: 1,
            setter: false,
            mutant: None,
        }
    }

    /// Settle mode: two clients, a settle time of one tick, no clock skew.
    pub fn settle() -> Self {
        LockModel {
            protocol: Protocol::Settle,
            clients: 2,
            replicas: 2,
            lease: 300,
            settle: 1,
            skew: 0,
            horizon: 5,
            lost_responses: 0,
            window_expiries: 0,
            attempts: 2,
            renew: false,
            forces: 0,
            merges: 0,
            updates: 1,
            setter: false,
            mutant: None,
        }
    }

    pub fn with(mut self, mutant: Mutant) -> Self {
        self.mutant = Some(mutant);
        self
    }

    fn has(&self, mutant: Mutant) -> bool {
        self.mutant == Some(mutant)
    }

    fn quorum(&self) -> bool {
        !self.has(Mutant::NoQuorum)
    }
}

/// The rows of the three tables.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Row {
    /// The lock log.
    Log {
        generation: u64,
        event: Event,
        owner: u8,
        at: u64,
        until: u64,
        floor: u64,
    },
    /// The state table: `updates` is the set of updates merged into it (a bit per update,
    /// see `update_bit`; the `set` is `SET_BIT`). `after_set`: when the write was checked, the
    /// stored state was the `set`'s (or merged it).
    State {
        version: u64,
        updates: u8,
        generation: u64,
        owner: u8,
        after_set: bool,
    },
    /// Settle mode's candidates.
    Candidate { client: u8, locked_at: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    Acquire,
    Renew,
    Release,
    Force,
}

/// An insert's deduplication token, as the guest names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Token {
    /// `acquire/<generation>/<id>`: shared by every contender for the generation.
    Acquire(u64),
    /// `renew/<generation>/<until>/<owner>/<id>`
    Renew(u64, u64, u8),
    /// `release/<generation>/<owner>/<id>`
    Release(u64, u8),
    /// A state write: random per write, reused by its retries (client, update).
    State(u8, u8),
    /// `force/<generation>/<operator>/<id>`
    Force(u64),
    Candidate(u8, u8),
}

/// A landed row and the replicas that have it (a bit each).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Landed {
    pub row: Row,
    pub replicas: u8,
}

/// An insert on its way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InFlight {
    pub client: u8,
    pub row: Row,
    pub token: Token,
    pub landed: bool,
}

/// What a client's `update` is doing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pc {
    /// About to read the newest generation (fenced) or the candidates (settle).
    Idle,
    /// The claim is in flight; `current` is the generation it follows, `stored` the state
    /// read with it.
    Claiming {
        current: Newest,
        grant: Grant,
        stored: Stored,
    },
    /// The claim was acknowledged: the guarded write checks it (and the stored version).
    Claimed {
        current: Newest,
        grant: Grant,
        stored: Stored,
    },
    /// A guarded write was refused: read why (`current` while the claim is unconfirmed).
    Refused {
        current: Option<Newest>,
        grant: Grant,
    },
    /// Holding a confirmed grant (kept between updates), with the state it last wrote or read.
    Holding { grant: Grant, stored: Stored },
    /// The renew row (new lease end `until`) is in flight.
    Renewing {
        grant: Grant,
        stored: Stored,
        until: u64,
    },
    /// The renew row was acknowledged: check the log, then adopt the lease.
    Renewed {
        grant: Grant,
        stored: Stored,
        until: u64,
    },
    /// The state row is in flight.
    Writing {
        grant: Grant,
        version: u64,
        updates: u8,
    },
    /// The state row (with `updates` merged) was acknowledged.
    Written {
        grant: Grant,
        version: u64,
        updates: u8,
    },
    /// The release row is in flight.
    Releasing,
    /// Settle mode: the candidate is in flight; `before` is the time the insert began.
    Inserting { before: u64 },
    /// Settle mode: settling until `wake`, then deciding; `reference` is the time the winner
    /// rule compares with.
    Settling { wake: u64, reference: u64 },
    /// Settle mode: holding the lock (in the critical section).
    InSection,
    /// The update returned: acknowledged or failed.
    Done { ok: bool },
}

/// A grant as its holder knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grant {
    pub generation: u64,
    pub owner: u8,
    pub at: u64,
    pub until: u64,
    pub floor: u64,
    pub renewed: bool,
    pub written: u64,
}

/// The state as a holder read it: version and the updates in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stored {
    pub version: u64,
    pub updates: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    pub pc: Pc,
    /// This client's clock reads global time plus this.
    pub offset: u64,
    pub attempts: u8,
    /// An acquire found the lock held (for the uncontended property).
    pub saw_held: bool,
    /// Which of its updates the client is making (0-based).
    pub update: u8,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub now: u64,
    pub clients: Vec<Client>,
    pub rows: Vec<Landed>,
    pub in_flight: Vec<InFlight>,
    /// Keeper's deduplication tokens within the window.
    pub dedup: BTreeSet<Token>,
    pub lost_responses: u8,
    pub window_expiries: u8,
    pub forces: u8,
    pub merges: u8,
    /// Every state row that ever landed, for the properties (merges drop rows from `rows`).
    pub written: Vec<Row>,
    /// Generations forced open: their holders' updates may be lost, by the operator's will.
    pub forced: u8,
    /// Updates acknowledged to their callers (a bit per update).
    pub acknowledged: u8,
    /// The `set` is still to come / has landed.
    pub set_pending: bool,
    pub set_landed: bool,
    /// Updates whose writes had landed when the `set` replaced the state.
    pub replaced: u8,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "t={} acknowledged={:#b}", self.now, self.acknowledged)?;
        for (i, c) in self.clients.iter().enumerate() {
            writeln!(f, "  client {i} (+{}): {:?}", c.offset, c.pc)?;
        }
        for r in &self.rows {
            writeln!(f, "  row {:?} on {:#b}", r.row, r.replicas)?;
        }
        for i in &self.in_flight {
            writeln!(f, "  in flight {i:?}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// A client's next step; its reads are answered by `replica` (without quorum).
    Step {
        client: u8,
        replica: u8,
    },
    /// Renew instead of writing.
    Renew {
        client: u8,
        replica: u8,
    },
    /// The in-flight insert `index` lands on `replica` (everywhere with quorum).
    Land {
        index: usize,
        replica: u8,
    },
    /// Its client gets the acknowledgement.
    Ack {
        index: usize,
    },
    /// Its response is lost: the client sends it again.
    Lose {
        index: usize,
    },
    /// A replica fetches a row it lacks (without quorum).
    Replicate {
        row: usize,
        replica: u8,
    },
    /// The deduplication window passes.
    WindowPasses,
    /// An operator forces the lock open (`force_unlock`), at global time.
    Force,
    /// Another process's unlocked `set` lands.
    Set,
    /// A background merge on `replica` (on every replica with quorum).
    Merge {
        replica: u8,
    },
}

impl World {
    /// The rows a read answered by `replica` sees.
    fn view(&self, replica: u8) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(move |r| r.replicas & (1 << replica) != 0)
            .map(|r| &r.row)
    }

    /// `FINAL` over the state rows of a view: the highest version, the last inserted of equals.
    fn final_state<'a>(rows: impl Iterator<Item = &'a Row>) -> Stored {
        let mut best = Stored::default();
        let mut seen = false;
        for row in rows {
            if let Row::State {
                version, updates, ..
            } = row
                && (!seen || *version >= best.version)
            {
                best = Stored {
                    version: *version,
                    updates: *updates,
                };
                seen = true;
            }
        }
        best
    }

    /// The state every replica converges to.
    pub fn converged_state(&self) -> Stored {
        Self::final_state(self.rows.iter().map(|r| &r.row))
    }
}

/// What `log_state` folds for the newest generation of a view.
fn newest<'a>(rows: impl Iterator<Item = &'a Row> + Clone) -> Newest {
    let generation = rows
        .clone()
        .filter_map(|r| match r {
            Row::Log { generation, .. } => Some(*generation),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut folded = Newest {
        generation,
        ..Newest::default()
    };
    if generation == 0 {
        return folded;
    }
    let mut first_acquire: Option<(u64, u8)> = None;
    for row in rows {
        let Row::Log {
            generation: g,
            event,
            owner,
            at,
            until,
            floor,
        } = row
        else {
            continue;
        };
        if *g != generation {
            continue;
        }
        match event {
            Event::Acquire => {
                if first_acquire.is_none_or(|(a, _)| *at < a) {
                    first_acquire = Some((*at, *owner));
                }
                folded.lease_until_ms = folded.lease_until_ms.max(*until);
                folded.floor_ms = folded.floor_ms.max(*floor);
            }
            Event::Renew => folded.lease_until_ms = folded.lease_until_ms.max(*until),
            Event::Release => {
                folded.released = 1;
                folded.release_cap_ms = folded.release_cap_ms.max(*until);
            }
            Event::Force => folded.forced = 1,
        }
    }
    if let Some((at, owner)) = first_acquire {
        folded.acquired_at_ms = at;
        folded.owner = owner_name(owner);
    }
    folded
}

/// What `log_claims` reads back for `generation`.
fn claims<'a>(rows: impl Iterator<Item = &'a Row> + Clone, generation: u64) -> Vec<Claim> {
    let newest_generation = newest(rows.clone()).generation;
    let previous_until = rows
        .clone()
        .filter_map(|r| match r {
            Row::Log {
                generation: g,
                event: Event::Acquire | Event::Renew,
                until,
                ..
            } if *g + 1 == generation => Some(*until),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    rows.filter_map(|r| match r {
        Row::Log {
            generation: g,
            event: Event::Acquire,
            owner,
            at,
            until,
            ..
        } if *g == generation => Some(Claim {
            owner: owner_name(*owner),
            at_ms: *at,
            until_ms: *until,
            newest: newest_generation,
            previous_until,
            stored: vec![],
        }),
        _ => None,
    })
    .collect()
}

/// The bit of a client's `k`th update (two per client).
pub fn update_bit(client: u8, k: u8) -> u8 {
    1 << (2 * client + k)
}

/// The bits of every update of a client.
fn client_bits(client: u8) -> u8 {
    0b11 << (2 * client)
}

/// The `set`'s bit in `updates`.
pub const SET_BIT: u8 = 1 << 7;
/// The `set`'s owner.
const SETTER: u8 = 0xfe;

/// A claim's owner id: the client and its attempt, as the guest's random per-claim id.
fn owner_name(owner: u8) -> String {
    format!("c{}a{}", owner >> 4, owner & 0xf)
}

fn handle(grant: &Grant) -> LockHandle {
    LockHandle {
        state_id: "s".into(),
        owner: owner_name(grant.owner),
        token: grant.generation,
        acquired_at_ms: grant.at,
        lease_until_ms: grant.until,
        floor_ms: grant.floor,
        last_written_ms: grant.written,
        mode: LockMode::Fenced,
    }
}

/// `confirm_held`: the grant is still the newest, neither released nor forced.
fn held<'a>(rows: impl Iterator<Item = &'a Row> + Clone, grant: &Grant) -> bool {
    let current = newest(rows);
    current.generation == grant.generation && current.released == 0 && current.forced == 0
}

impl LockModel {
    fn replicas_to_ask(&self) -> u8 {
        if self.quorum() { 1 } else { self.replicas }
    }

    fn clock(&self, world: &World, client: u8) -> u64 {
        world.now + world.clients[client as usize].offset
    }

    fn send(&self, world: &mut World, client: u8, row: Row, token: Token) {
        world.in_flight.push(InFlight {
            client,
            row,
            token,
            landed: false,
        });
    }

    fn done(world: &mut World, client: u8, ok: bool) {
        let c = &mut world.clients[client as usize];
        c.pc = Pc::Done { ok };
        if ok {
            world.acknowledged |= update_bit(client, c.update);
        }
    }

    /// The guarded write (`lock::update::write`): the server checks the guard against what the
    /// read sees and sends the row only if it holds; otherwise the client reads why.
    /// `claimed_after` is the generation an unconfirmed claim replaced.
    fn write_guarded(
        &self,
        world: &mut World,
        client: u8,
        view: &[Row],
        grant: Grant,
        stored: Stored,
        claimed_after: Option<Newest>,
    ) -> bool {
        let now = self.clock(world, client);
        let current = World::final_state(view.iter());
        let me = owner_name(grant.owner);
        let guard = Guard {
            state_id: "s".into(),
            generation: grant.generation,
            owner: me,
            confirmed: claimed_after.is_none() || self.has(Mutant::NoClaimGuard),
            previous_until: match &claimed_after {
                Some(c) if c.released == 0 && c.forced == 0 && !self.has(Mutant::NoGiveWay) => {
                    c.lease_until_ms
                }
                _ => u64::MAX,
            },
            expected_version: if self.has(Mutant::NoStaleCheck) {
                current.version
            } else {
                stored.version
            },
        };
        let newest_now = if self.has(Mutant::NoClaimGuard) && claimed_after.is_some() {
            // The mutant checks nothing of the lock for a claim's first write.
            Newest {
                generation: grant.generation,
                ..Newest::default()
            }
        } else {
            newest(view.iter())
        };
        let admitted = fenced::admits(
            &guard,
            &newest_now,
            &claims(view.iter(), grant.generation),
            current.version,
        );
        if !admitted {
            world.clients[client as usize].pc = Pc::Refused {
                current: claimed_after,
                grant,
            };
            return true;
        }
        // A kept grant near its lease end is not written under (`update::resume` gives it back
        // and takes the lock anew; here the update gives up): its write could land after the
        // lease and tie with the next grant's floor.
        if claimed_after.is_none()
            && !self.has(Mutant::KeptToTheEnd)
            && fenced::near_lease_end(now, grant.until, self.lease)
        {
            Self::done(world, client, false);
            return true;
        }
        let version = match propose_version(&handle(&grant), now, stored.version) {
            Err(_) => {
                Self::done(world, client, false);
                return true;
            }
            // Above the lease only when something stored is newer than the lease; the guard
            // checks the grant in the log.
            Ok(Proposed::Within(v) | Proposed::AboveLease(v)) => v,
        };
        let mut grant = grant;
        grant.written = grant.written.max(version);
        let k = world.clients[client as usize].update;
        let updates = stored.updates | update_bit(client, k);
        let row = Row::State {
            version,
            updates,
            generation: grant.generation,
            owner: grant.owner,
            after_set: current.updates & SET_BIT != 0,
        };
        // Each write has a token of its own (its retries reuse it).
        self.send(world, client, row, Token::State(client, k));
        world.clients[client as usize].pc = Pc::Writing {
            grant,
            version,
            updates,
        };
        true
    }

    /// A client's next step, its reads answered by `replica` (every replica sees the same
    /// with quorum).
    fn step(&self, world: &mut World, client: u8, replica: u8, renew: bool) -> bool {
        let now = self.clock(world, client);
        let pc = world.clients[client as usize].pc.clone();
        let view: Vec<Row> = world.view(replica).cloned().collect();
        match (self.protocol, pc) {
            (Protocol::Fenced, Pc::Idle) => {
                let current = newest(view.iter());
                if !current.is_free(now) {
                    world.clients[client as usize].saw_held = true;
                    return false; // waits; time must pass
                }
                let c = &mut world.clients[client as usize];
                if c.attempts == 0 {
                    Self::done(world, client, false);
                    return true;
                }
                c.attempts -= 1;
                let owner = (client << 4) | c.attempts;
                let grant = Grant {
                    generation: current.generation + 1,
                    owner,
                    at: now,
                    until: now + self.lease,
                    floor: if self.has(Mutant::NoFloor) {
                        0
                    } else {
                        current.next_floor()
                    },
                    renewed: false,
                    written: 0,
                };
                let row = Row::Log {
                    generation: grant.generation,
                    event: Event::Acquire,
                    owner,
                    at: grant.at,
                    until: grant.until,
                    floor: grant.floor,
                };
                // `log_outlook`: the newest generation and the state, in one read.
                let stored = World::final_state(view.iter());
                self.send(world, client, row, Token::Acquire(grant.generation));
                world.clients[client as usize].pc = Pc::Claiming {
                    current,
                    grant,
                    stored,
                };
            }
            (
                Protocol::Fenced,
                Pc::Claimed {
                    current,
                    grant,
                    stored,
                },
            ) => {
                return self.write_guarded(world, client, &view, grant, stored, Some(current));
            }
            (Protocol::Fenced, Pc::Refused { current, grant }) => {
                let me = owner_name(grant.owner);
                let mine = match &current {
                    // `log_claims`: decide the claim.
                    Some(current) => {
                        let claims = claims(view.iter(), grant.generation);
                        if self.has(Mutant::NoGiveWay) {
                            fenced::all_mine(&claims, &me, grant.generation)
                        } else {
                            fenced::decide_claim(current, &claims, &me, grant.generation)
                                == ClaimOutcome::Mine
                        }
                    }
                    // `log_outlook`: is the confirmed grant still the open newest one?
                    None => newest(view.iter()).is_claim_of(&handle(&grant)) && now <= grant.until,
                };
                world.clients[client as usize].pc = if mine {
                    let stored = World::final_state(view.iter());
                    Pc::Holding { grant, stored }
                } else {
                    // The grant is not this update's: take the lock anew (the next read says
                    // whether someone holds it).
                    Pc::Idle
                };
            }
            (Protocol::Fenced, Pc::Holding { grant, stored }) if renew => {
                if grant.renewed
                    || fenced::near_lease_end(now, grant.until, self.lease)
                    || !held(view.iter(), &grant)
                {
                    Self::done(world, client, false);
                    return true;
                }
                let until = now + self.lease;
                let row = Row::Log {
                    generation: grant.generation,
                    event: Event::Renew,
                    owner: grant.owner,
                    at: now,
                    until,
                    floor: grant.floor,
                };
                let token = Token::Renew(grant.generation, until, grant.owner);
                self.send(world, client, row, token);
                world.clients[client as usize].pc = Pc::Renewing {
                    grant,
                    stored,
                    until,
                };
            }
            (
                Protocol::Fenced,
                Pc::Renewed {
                    mut grant,
                    stored,
                    until,
                },
            ) => {
                if !self.has(Mutant::NoRenewConfirm) && !held(view.iter(), &grant) {
                    Self::done(world, client, false);
                    return true;
                }
                grant.until = until;
                grant.renewed = true;
                world.clients[client as usize].pc = Pc::Holding { grant, stored };
            }
            (Protocol::Fenced, Pc::Holding { grant, stored }) => {
                return self.write_guarded(world, client, &view, grant, stored, None);
            }
            (
                Protocol::Fenced,
                Pc::Written {
                    grant,
                    version,
                    updates,
                },
            ) => {
                let late = fenced::near_lease_end(now, grant.until, self.lease);
                if late && !self.has(Mutant::NoWriteConfirm) && !held(view.iter(), &grant) {
                    Self::done(world, client, false);
                    return true;
                }
                let c = &mut world.clients[client as usize];
                world.acknowledged |= update_bit(client, c.update);
                if c.update + 1 < self.updates {
                    // Keep the grant, with the state written, for the next update.
                    c.update += 1;
                    c.pc = Pc::Holding {
                        grant,
                        stored: Stored { version, updates },
                    };
                    return true;
                }
                let row = Row::Log {
                    generation: grant.generation,
                    event: Event::Release,
                    owner: grant.owner,
                    at: now,
                    until: grant.written,
                    floor: grant.floor,
                };
                let token = Token::Release(grant.generation, grant.owner);
                self.send(world, client, row, token);
                world.clients[client as usize].pc = Pc::Releasing;
            }
            (Protocol::Settle, Pc::Idle) => {
                if view.iter().any(|r| matches!(r, Row::Candidate { .. })) {
                    world.clients[client as usize].saw_held = true;
                    return false;
                }
                let c = &mut world.clients[client as usize];
                if c.attempts == 0 {
                    Self::done(world, client, false);
                    return true;
                }
                c.attempts -= 1;
                let row = Row::Candidate {
                    client,
                    locked_at: now,
                };
                let token = Token::Candidate(client, c.attempts);
                self.send(world, client, row, token);
                world.clients[client as usize].pc = Pc::Inserting { before: now };
            }
            (Protocol::Settle, Pc::Settling { wake, reference }) => {
                if now < wake {
                    return false;
                }
                let mut all: Vec<Candidate> = view
                    .iter()
                    .filter_map(|r| match r {
                        Row::Candidate { client, locked_at } => Some(Candidate {
                            lock_id: format!("c{client}"),
                            locked_at_s: *locked_at,
                        }),
                        _ => None,
                    })
                    .collect();
                all.sort_by(|a, b| a.lock_id.cmp(&b.lock_id));
                all.dedup();
                let me = format!("c{client}");
                let settle_ms = self.settle * 1000;
                let mine = settle::winner(&all, &me, reference * 1000, settle_ms)
                    .is_some_and(|w| w.lock_id == me);
                if mine {
                    world.clients[client as usize].pc = Pc::InSection;
                } else {
                    world.clients[client as usize].saw_held = true;
                    Self::withdraw(world, client);
                    world.clients[client as usize].pc = Pc::Idle;
                }
            }
            (Protocol::Settle, Pc::InSection) => {
                Self::withdraw(world, client);
                Self::done(world, client, true);
            }
            _ => return false,
        }
        true
    }

    /// Settle mode's delete of a client's candidates (synchronous, on every replica).
    fn withdraw(world: &mut World, client: u8) {
        world
            .rows
            .retain(|r| !matches!(r.row, Row::Candidate { client: c, .. } if c == client));
    }

    /// The acknowledgement of a client's insert arrives.
    fn acknowledge(&self, world: &mut World, client: u8) {
        let now = self.clock(world, client);
        let pc = world.clients[client as usize].pc.clone();
        world.clients[client as usize].pc = match pc {
            Pc::Claiming {
                current,
                grant,
                stored,
            } => Pc::Claimed {
                current,
                grant,
                stored,
            },
            Pc::Renewing {
                grant,
                stored,
                until,
            } => Pc::Renewed {
                grant,
                stored,
                until,
            },
            Pc::Writing {
                grant,
                version,
                updates,
            } => Pc::Written {
                grant,
                version,
                updates,
            },
            Pc::Releasing => {
                Self::done(world, client, true);
                return;
            }
            Pc::Inserting { before } => Pc::Settling {
                wake: now + self.settle,
                reference: if self.has(Mutant::SettleBeforeInsert) {
                    before
                } else {
                    now
                },
            },
            other => other,
        };
    }
}

impl LockModel {
    /// A background merge of the parts on `replica` (every replica with quorum). The state table
    /// is a ReplacingMergeTree(updated_at) by state id: the merge keeps the highest version, the
    /// last inserted of equals, which is what `FINAL` reads. Settle mode's candidates table is a
    /// ReplacingMergeTree(locked_at) by state id too: the merge keeps one candidate. The lock
    /// log is a plain MergeTree (merges keep every row) and is not touched. Returns whether
    /// anything merged.
    fn merge(&self, world: &mut World, replica: u8) -> bool {
        let mask = if self.quorum() {
            (1 << self.replicas) - 1
        } else {
            1 << replica
        };
        let mergeable = |row: &Row| match self.protocol {
            Protocol::Fenced => matches!(row, Row::State { .. }),
            Protocol::Settle => matches!(row, Row::Candidate { .. }),
        };
        let parts: Vec<usize> = (0..world.rows.len())
            .filter(|&i| world.rows[i].replicas & mask == mask && mergeable(&world.rows[i].row))
            .collect();
        if parts.len() < 2 {
            return false;
        }
        // the highest version (locked_at for candidates), the last inserted of equals
        let key = |row: &Row| match row {
            Row::State { version, .. } => *version,
            Row::Candidate { locked_at, .. } => *locked_at,
            Row::Log { .. } => 0,
        };
        let mut kept = parts[0];
        for &i in &parts[1..] {
            if key(&world.rows[i].row) >= key(&world.rows[kept].row) {
                kept = i;
            }
        }
        let survivor = world.rows[kept].row.clone();
        for &i in &parts {
            world.rows[i].replicas &= !mask;
        }
        world.rows.retain(|r| r.replicas != 0);
        world.rows.push(Landed {
            row: survivor,
            replicas: mask,
        });
        true
    }
}

impl Model for LockModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        // Every combination of clock offsets within the skew bound; client 0's clock is the
        // reference (shifting every clock alike changes nothing but the horizon).
        let mut offsets: Vec<Vec<u64>> = vec![vec![0]];
        for _ in 1..self.clients {
            offsets = offsets
                .into_iter()
                .flat_map(|o| {
                    (0..=self.skew).map(move |x| {
                        let mut o = o.clone();
                        o.push(x);
                        o
                    })
                })
                .collect();
        }
        offsets
            .into_iter()
            .map(|offsets| World {
                now: 0,
                clients: offsets
                    .into_iter()
                    .map(|offset| Client {
                        pc: Pc::Idle,
                        offset,
                        attempts: self.attempts,
                        saw_held: false,
                        update: 0,
                    })
                    .collect(),
                rows: vec![],
                in_flight: vec![],
                dedup: BTreeSet::new(),
                lost_responses: self.lost_responses,
                window_expiries: self.window_expiries,
                forces: self.forces,
                merges: self.merges,
                written: vec![],
                forced: 0,
                acknowledged: 0,
                set_pending: self.setter,
                set_landed: false,
                replaced: 0,
            })
            .collect()
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        if world.now < self.horizon {
            actions.push(Action::Tick);
        }
        for (i, c) in world.clients.iter().enumerate() {
            let client = i as u8;
            let steps = matches!(
                c.pc,
                Pc::Idle
                    | Pc::Claimed { .. }
                    | Pc::Refused { .. }
                    | Pc::Holding { .. }
                    | Pc::Renewed { .. }
                    | Pc::Written { .. }
                    | Pc::Settling { .. }
                    | Pc::InSection
            );
            if !steps {
                continue;
            }
            for replica in 0..self.replicas_to_ask() {
                actions.push(Action::Step { client, replica });
                if self.renew && matches!(&c.pc, Pc::Holding { grant, .. } if !grant.renewed) {
                    actions.push(Action::Renew { client, replica });
                }
            }
        }
        for (index, f) in world.in_flight.iter().enumerate() {
            if f.landed {
                actions.push(Action::Ack { index });
                if world.lost_responses > 0 {
                    actions.push(Action::Lose { index });
                }
            } else {
                for replica in 0..self.replicas_to_ask() {
                    actions.push(Action::Land { index, replica });
                }
            }
        }
        if !self.quorum() {
            for (row, r) in world.rows.iter().enumerate() {
                for replica in 0..self.replicas {
                    if r.replicas & (1 << replica) == 0 {
                        actions.push(Action::Replicate { row, replica });
                    }
                }
            }
        }
        if world.window_expiries > 0 && !world.dedup.is_empty() {
            actions.push(Action::WindowPasses);
        }
        if world.merges > 0 {
            for replica in 0..self.replicas_to_ask() {
                actions.push(Action::Merge { replica });
            }
        }
        if world.forces > 0 && !newest(world.rows.iter().map(|r| &r.row)).is_free(world.now) {
            actions.push(Action::Force);
        }
        if world.set_pending {
            actions.push(Action::Set);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Tick => world.now += 1,
            Action::Step { client, replica } => {
                if !self.step(&mut world, client, replica, false) {
                    return None;
                }
            }
            Action::Renew { client, replica } => {
                if !self.step(&mut world, client, replica, true) {
                    return None;
                }
            }
            Action::Land { index, replica } => {
                let f = &mut world.in_flight[index];
                f.landed = true;
                let (row, token) = (f.row.clone(), f.token.clone());
                // Keeper's deduplication: the token is checked and stored with the part, in
                // one transaction, cluster-wide.
                if world.dedup.insert(token) {
                    if let Row::State { .. } = row {
                        world.written.push(row.clone());
                    }
                    let replicas = if self.quorum() {
                        (1 << self.replicas) - 1
                    } else {
                        1 << replica
                    };
                    world.rows.push(Landed { row, replicas });
                }
            }
            Action::Ack { index } => {
                let f = world.in_flight.remove(index);
                self.acknowledge(&mut world, f.client);
            }
            Action::Lose { index } => {
                world.lost_responses -= 1;
                world.in_flight[index].landed = false;
            }
            Action::Replicate { row, replica } => world.rows[row].replicas |= 1 << replica,
            Action::WindowPasses => {
                world.window_expiries -= 1;
                world.dedup.clear();
            }
            Action::Merge { replica } => {
                world.merges -= 1;
                if !self.merge(&mut world, replica) {
                    return None;
                }
            }
            Action::Set => {
                // One statement: the server puts the version above what it stores, and the
                // row lands everywhere (the model's `set` runs with quorum).
                world.set_pending = false;
                let stored = world.converged_state();
                let version = world.now.max(stored.version + 1);
                let row = Row::State {
                    version,
                    updates: SET_BIT,
                    generation: 0,
                    owner: SETTER,
                    after_set: false,
                };
                // It replaces what landed before it, and what was on its way: in either order
                // the set may win (the two ran at once).
                let in_flight = world.in_flight.iter().map(|f| &f.row);
                for r in world.written.iter().chain(in_flight) {
                    if let Row::State { updates, .. } = r {
                        world.replaced |= updates & !SET_BIT;
                    }
                }
                world.written.push(row.clone());
                world.rows.push(Landed {
                    row,
                    replicas: (1 << self.replicas) - 1,
                });
                world.set_landed = true;
            }
            Action::Force => {
                // The operator's row lands at once (its own insert races nothing here).
                world.forces -= 1;
                let current = newest(world.rows.iter().map(|r| &r.row));
                world.forced |= 1 << current.generation;
                world.rows.push(Landed {
                    row: Row::Log {
                        generation: current.generation,
                        event: Event::Force,
                        owner: 0xff,
                        at: world.now,
                        until: 0,
                        floor: 0,
                    },
                    replicas: (1 << self.replicas) - 1,
                });
            }
        }
        Some(world)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = match self.protocol {
            Protocol::Fenced => vec![
                Property::<Self>::always(ONE_HOLDER, |_, w| {
                    let mut owners = BTreeSet::new();
                    for r in &w.written {
                        if let Row::State {
                            generation, owner, ..
                        } = *r
                            && owner != SETTER
                        {
                            owners.insert((generation, owner));
                        }
                    }
                    let generations: BTreeSet<u64> = owners.iter().map(|(g, _)| *g).collect();
                    generations.len() == owners.len()
                }),
                Property::<Self>::always(NOTHING_LOST, |_, w| {
                    // except the updates of a grant an operator forced open
                    let mut spared = 0u8;
                    for r in &w.written {
                        if let Row::State {
                            generation, owner, ..
                        } = *r
                            && owner != SETTER
                            && w.forced & (1 << generation) != 0
                        {
                            spared |= client_bits(owner >> 4);
                        }
                    }
                    // ...and those a later `set` replaced.
                    let converged = w.converged_state();
                    w.acknowledged & !converged.updates & !spared & !w.replaced == 0
                }),
                Property::<Self>::always(FENCED, |_, w| {
                    let states: Vec<(u64, u64)> = w
                        .written
                        .iter()
                        .filter_map(|r| match *r {
                            Row::State {
                                version,
                                generation,
                                owner,
                                ..
                            } if owner != SETTER => Some((generation, version)),
                            _ => None,
                        })
                        .collect();
                    states
                        .iter()
                        .all(|(ga, va)| states.iter().all(|(gb, vb)| !(ga < gb && va >= vb)))
                }),
            ],
            Protocol::Settle => vec![Property::<Self>::always(EXCLUSIVE, |_, w| {
                w.clients.iter().filter(|c| c.pc == Pc::InSection).count() <= 1
            })],
        };
        if self.setter {
            properties.push(Property::<Self>::always(SET_KEPT, |_, w| {
                w.written.iter().all(|r| match r {
                    Row::State {
                        after_set: true,
                        updates,
                        ..
                    } => updates & SET_BIT != 0,
                    _ => true,
                })
            }));
        }
        // The checks are not vacuous: some run gets through.
        properties.push(Property::<Self>::sometimes(COMPLETES, |_, w| {
            w.acknowledged != 0
        }));
        if self.clients == 1 {
            properties.push(Property::<Self>::always(UNCONTENDED, |_, w| {
                !w.clients[0].saw_held
            }));
        }
        properties
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now <= self.horizon
    }
}

//! A model of the lock and state protocol on ClickHouse, checked exhaustively by `stateright`.
//!
//! The clients run the guest's own protocol: each `update` is a `lock::update::Update`, the
//! sans-IO state machine the component drives over HTTP, and every statement it asks for is
//! answered here by a simulated ClickHouse. Reads of the lock log are folded by the guest's
//! `fenced::fold` and `fenced::claims_on` (the Rust twins of its SQL), guarded writes are
//! admitted by `fenced::admits`, and whether inserts reach every deciding read comes from the
//! deployment's settings (`deployment::Consistency`). Unlocked `set`s are the guest's `set::Set`,
//! and settle mode's tries its `lock::settle::Try`. The model owns only the world:
//!
//! - **Time.** One global time; each client reads it through its own clock, off by up to
//!   `skew`. Time advances by a step of its own, between any two other steps, so any client can
//!   stall anywhere for any length of time (up to the horizon).
//! - **Inserts.** An insert is sent, lands (becomes visible), and is acknowledged, as three
//!   steps, with anything in between. A response can be lost after the insert landed: the
//!   client sends the identical insert again under the same token, as the guest's retries do,
//!   unless its retry bound has passed. A client can also give up on an insert (its retries
//!   ran out) while the server still finishes it: the insert may land later.
//! - **Guarded writes.** The guard is evaluated when the write is sent (and again when a lost
//!   response makes the client send it again); the row lands later, so a contender can act in
//!   between, as on a real server.
//! - **Deduplication.** Keeper's token set, cluster-wide and atomic: an insert whose token is in
//!   the window is dropped and still acknowledged. The window can pass (its tokens are
//!   forgotten), so that a retry lands twice.
//! - **Replicas.** With quorum inserts and sequentially consistent deciding reads (the
//!   settings of a replicated deployment), a landed insert is visible to every deciding read.
//!   Without them an insert lands on one replica, reaches the others later, and each read is
//!   answered by any one replica.
//! - **Merges.** State is read with `FINAL` (highest version; equal versions, the last
//!   inserted), which is what a merge keeps, so merges change no answer.
//!   The lock log is a plain MergeTree: merges never drop its rows.
//!
//! Each client makes `updates` updates; with more than one, the grant is kept between them
//! (linger) and given back at the end, as the host's `close` does. Properties are in
//! [`LockModel::properties`].

use std::collections::BTreeSet;
use std::fmt;

use clickhouse_state::deployment::{Consistency, Kind};
use clickhouse_state::error::Error;
use clickhouse_state::exec::Level;
use clickhouse_state::lock::Attempt;
use clickhouse_state::lock::Memory;
use clickhouse_state::lock::fenced::{self, Event, LogEntry, Outlook};
use clickhouse_state::lock::settle::{self, Candidate, Try};
use clickhouse_state::lock::update::{self, Answer, Env, Limits, Statement, Step, Update};
use clickhouse_state::set::{self as overwrite, Set};
use clickhouse_state::sql::{Guard, Role};
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
/// A `set` lands at most once: a row of it landing again never shadows a write that knew of
/// its first landing (an update merged into it, a set sent after it).
pub const SET_ONCE: &str = "a set sent again never buries a write made after it landed";
/// Some `set` reports success (the set checks are not vacuous).
pub const SET_DONE: &str = "a set is reported done";
/// A `set` that reported success has landed.
pub const SET_LANDED: &str = "a set reported done has landed";
/// An update that starts after a holder was killed never fails with `locked` (with one other
/// client, the dead holder is the only one it can wait for): the dead grant's lease ends
/// within the update's timeout.
pub const NOT_LOCKED_OUT: &str = "a killed holder never locks out an update started after it";
/// Some update started after a kill is acknowledged.
pub const RECOVERS: &str = "an update after a kill is acknowledged";
/// Some update on an id its client found shared (`Memory::shared`) is acknowledged and gives
/// its grant back instead of keeping it: the rule that spares a second writer the linger is
/// explored (required in every check with two clients and two updates each).
pub const GIVES_BACK: &str = "an update on an id found shared gives its grant back";
/// Some update that resumed a kept grant another client had said it wants (a `want` row) is
/// acknowledged, written under that grant, and gives the grant back: the keeper heeds the
/// waiter instead of holding on for the linger (`fenced_with_a_waiter_wanting_a_kept_grant`).
pub const HEEDS_WANT: &str = "a kept grant another client wants is given back";
/// Some update is acknowledged (the bounds leave room for the protocol to finish).
pub const COMPLETES: &str = "an update is acknowledged";

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
    /// The deployment kind whose settings the guest sends (the tables are replicated when
    /// `replicas` > 1).
    pub kind: Kind,
    /// The lease of an update's grant, in ticks (the guest's milliseconds).
    pub lease: u64,
    /// When set, the lease of an explicit lock (`lock_lease_seconds`): the update's lease is
    /// then the guest's rule over it and the timeout (`update::update_lease`), as the
    /// component derives it, instead of `lease`.
    pub lock_lease: Option<u64>,
    /// How long an update waits for the lock, in ticks.
    pub timeout: u64,
    /// Settle mode's settle time, in ticks (the guest's seconds, see `settle_ms`).
    pub settle: u64,
    /// Clocks are off by up to this many ticks (each client's offset is in `0..=skew`).
    pub skew: u64,
    /// The last tick.
    pub horizon: u64,
    /// How many responses to inserts may be lost (each is then resent).
    pub lost_responses: u8,
    /// How many inserts a client may give up on (they may still land).
    pub failures: u8,
    /// How many times the deduplication window may pass.
    pub window_expiries: u8,
    /// Settle mode: candidates each client may insert before giving up.
    pub attempts: u8,
    /// How many times an operator may force the lock open.
    pub forces: u8,
    /// How many background merges may run (of the state table; of the candidates in settle
    /// mode).
    pub merges: u8,
    /// Updates each client makes, under one grant kept between them (linger) when 2.
    pub updates: u8,
    /// Processes that each make one unlocked `set` (the guest's `set::Set`), with the
    /// inserts' faults and a read of the state when it wrote nothing.
    pub sets: u8,
    /// How many clients may be killed: between two updates, holding the grant it keeps (what a
    /// kill of a streaming run leaves). A killed client never steps again.
    pub crashes: u8,
}

impl LockModel {
    /// The fenced protocol: two clients, two replicas, a lease of 10 ticks with clocks off by up
    /// to its margin (1 tick), one lost response, one passing of the dedup window.
    pub fn fenced() -> Self {
        LockModel {
            protocol: Protocol::Fenced,
            clients: 2,
            replicas: 2,
            kind: Kind::Replicated,
            lease: 10,
            timeout: 20,
            settle: 1,
            skew: 1,
            horizon: 13,
            lost_responses: 1,
            failures: 0,
            window_expiries: 1,
            attempts: 2,
            forces: 0,
            merges: 0,
            updates: 1,
            sets: 0,
            crashes: 0,
            lock_lease: None,
        }
    }

    /// Settle mode: two clients, a settle time of one tick, no clock skew.
    pub fn settle() -> Self {
        LockModel {
            protocol: Protocol::Settle,
            lease: 300,
            skew: 0,
            horizon: 5,
            lost_responses: 0,
            window_expiries: 0,
            ..LockModel::fenced()
        }
    }

    /// Whether every landed insert is visible to every deciding read: the deployment's
    /// settings ask for linearized quorum inserts and sequentially consistent reads.
    pub fn quorum(&self) -> bool {
        let consistency = Consistency {
            kind: self.kind,
            deduplicate_insert: false,
        };
        let inserts = consistency.settings(Role::GuardedInsert);
        let plain = consistency.settings(Role::Insert);
        let reads = consistency.settings(Role::Deciding);
        let quorum = |s: &[(&str, &str)]| {
            s.iter().any(|(n, v)| *n == "insert_quorum" && *v != "0")
                && s.contains(&("insert_quorum_parallel", "0"))
        };
        // A guarded write's condition is a deciding read too.
        let consistent = |s: &[(&str, &str)]| s.contains(&("select_sequential_consistency", "1"));
        self.replicas <= 1
            || (quorum(&inserts) && quorum(&plain) && consistent(&reads) && consistent(&inserts))
    }

    fn limits(&self) -> Limits {
        let lease = match self.lock_lease {
            Some(lock_lease) => update::update_lease(lock_lease, self.timeout, 1),
            None => self.lease,
        };
        Limits {
            lease_ms: lease,
            timeout_ms: self.timeout,
            retry_ms: 1,
            linger_ms: u64::from(self.updates > 1),
            // a client gives up one tick before its retry bound at the latest
            retry_pause_ms: 1,
        }
    }
}

/// The rows of the three tables.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Row {
    /// The lock log.
    Log(Entry),
    /// The state table. `updates` is the set of updates merged into its partial state (a bit
    /// per update, see `update_bit`; a `set` is `SET_BIT`): the JSON the guest wrote, which
    /// `partial_of` gives back (the completed part is always empty here).
    /// `after_set`: when the write was checked, the stored state was a `set`'s (or merged it).
    State {
        version: u64,
        updates: u8,
        generation: u64,
        owner: String,
        client: u8,
        after_set: bool,
    },
    /// Settle mode's candidates.
    Candidate { client: u8, locked_at: u64 },
}

/// A lock log row, ordered for the world's row list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry(pub LogEntry);

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let key = |e: &LogEntry| {
            (
                e.generation,
                e.event as u8,
                e.owner.clone(),
                e.at_ms,
                e.until_ms,
                e.floor_ms,
            )
        };
        key(&self.0).cmp(&key(&other.0))
    }
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
    /// Whose insert it is; `None` once its client gave up on it (the server still finishes it).
    pub client: Option<u8>,
    pub row: Row,
    pub token: String,
    /// A guarded write's guard, evaluated again when the insert is sent again.
    pub guard: Option<Guard>,
    /// Its client sends it again only until then (its own clock).
    pub retry_until: Option<u64>,
    pub landed: bool,
    /// It landed as nothing: deduplicated, or its guard refused it when sent again.
    pub dropped: bool,
    /// Sent more than once (a lost response).
    pub resent: bool,
    /// A `set`'s conditional write: it lands only while nothing stored is at or above its
    /// version (`set::lands`), evaluated at each landing.
    pub unless_newer: bool,
}

/// What a client is doing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pc {
    /// About to start an update (fenced) or to insert a candidate (settle).
    Idle,
    /// Fenced: the update asked for `statement`, which the client's next step sends.
    Asks {
        update: Box<Update>,
        statement: Statement,
        retry_until: Option<u64>,
    },
    /// Fenced: the update waits for its insert's acknowledgement.
    Awaiting { update: Box<Update> },
    /// Fenced: the update pauses until time has passed (`woken`).
    Paused { update: Box<Update>, woken: bool },
    /// Fenced: giving back the kept grant at the end (the host's `close`).
    Closing,
    /// Settle mode: the try's (the guest's `settle::Try`) candidate is in flight.
    Inserting { attempt: Box<Try> },
    /// Settle mode: settling until `wake`, then deciding.
    Settling { attempt: Box<Try>, wake: u64 },
    /// Settle mode: holding the lock (in the critical section).
    InSection,
    /// The client is done: its last update acknowledged or failed.
    Done { ok: bool },
    /// Killed: it never steps again.
    Killed,
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
    /// What the guest's lock remembers between this client's updates.
    pub memory: Memory,
    /// When its current update started (global time).
    pub started: u64,
    /// Tokens the client has made (owners and write tokens are named by this count).
    pub tokens: u8,
    /// The generation of the kept grant its current update resumed, if any (for `HEEDS_WANT`).
    pub resumed: Option<u64>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub now: u64,
    pub clients: Vec<Client>,
    pub rows: Vec<Landed>,
    pub in_flight: Vec<InFlight>,
    /// Keeper's deduplication tokens within the window.
    pub dedup: BTreeSet<String>,
    pub lost_responses: u8,
    pub failures: u8,
    pub window_expiries: u8,
    pub forces: u8,
    pub merges: u8,
    pub setters: Vec<Setter>,
    /// Setters whose row has landed (a bit each): a `set` takes effect at its first landing.
    pub set_landed: u8,
    /// Every state row that ever landed, for the properties (merges drop rows from `rows`).
    pub written: Vec<Row>,
    /// Generations forced open: their holders' updates may be lost, by the operator's will.
    pub forced: u64,
    /// Updates acknowledged to their callers (a bit per update).
    pub acknowledged: u8,
    /// Updates whose writes had landed or were on their way when a `set` replaced the state.
    pub replaced: u8,
    /// Kills left, and when the first one happened (global time).
    pub crashes: u8,
    pub killed_at: Option<u64>,
    /// An update started after a kill failed with `locked`: locked out by the dead holder.
    pub locked_out: bool,
    /// An update started after a kill was acknowledged.
    pub recovered: bool,
    /// An update on an id its client found shared was acknowledged and gave its grant back
    /// (with a linger, it would have kept it).
    pub gave_back: bool,
    /// An update that resumed a kept grant another client wanted wrote under it and gave it back.
    pub heeded: bool,
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
        for (i, s) in self.setters.iter().enumerate() {
            writeln!(f, "  setter {i}: {s:?}")?;
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
    /// The in-flight insert `index` lands on `replica` (everywhere with quorum).
    Land {
        index: usize,
        replica: u8,
    },
    /// Its client gets the acknowledgement.
    Ack {
        index: usize,
    },
    /// Its response is lost: the client sends it again (or gives up, past its retry bound).
    Lose {
        index: usize,
    },
    /// Its client gives up on it (its retries ran out); the server may still finish it.
    Fail {
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
    /// A setter's next step; its read is answered by `replica`.
    SetStep {
        setter: u8,
        replica: u8,
    },
    /// A background merge on `replica` (on every replica with quorum).
    Merge {
        replica: u8,
    },
    /// The client is killed (SIGKILL): it never steps again; its inserts in flight may land.
    Kill {
        client: u8,
    },
}

impl World {
    /// The rows a read answered by `replica` sees.
    fn view(&self, replica: u8) -> impl Iterator<Item = &Row> + Clone {
        self.rows
            .iter()
            .filter(move |r| r.replicas & (1 << replica) != 0)
            .map(|r| &r.row)
    }

    /// The state every replica converges to.
    pub fn converged_state(&self) -> Option<Stored> {
        final_state(self.rows.iter().map(|r| &r.row))
    }
}

/// A state row as `FINAL` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub version: u64,
    pub updates: u8,
}

/// `FINAL` over the state rows of a view: the highest version, the last inserted of equals.
fn final_state<'a>(rows: impl Iterator<Item = &'a Row>) -> Option<Stored> {
    let mut best: Option<Stored> = None;
    for row in rows {
        if let Row::State {
            version, updates, ..
        } = row
            && best.as_ref().is_none_or(|b| *version >= b.version)
        {
            best = Some(Stored {
                version: *version,
                updates: *updates,
            });
        }
    }
    best
}

fn stored_row(stored: Option<Stored>) -> Option<(Option<String>, Option<String>, u64)> {
    stored.map(|s| (Some(partial_of(s.updates)), Some("{}".into()), s.version))
}

fn log<'a>(
    rows: impl Iterator<Item = &'a Row> + Clone,
) -> impl Iterator<Item = &'a LogEntry> + Clone {
    rows.filter_map(|r| match r {
        Row::Log(Entry(e)) => Some(e),
        _ => None,
    })
}

/// The bit of a client's `k`th update (two per client).
pub fn update_bit(client: u8, k: u8) -> u8 {
    1 << (2 * client + k)
}

/// The bits of every update of a client.
fn client_bits(client: u8) -> u8 {
    0b11 << (2 * client)
}

/// The time the model starts at: a version is never 0, which the guard reads as "nothing
/// stored" (real versions are milliseconds since 1970).
const START: u64 = 1;

/// The bits of the `set`s in `updates`: setter `s` has `1 << (7 - s)`.
pub const SET_BITS: u8 = 0b1100_0000;

fn set_bit(setter: u8) -> u8 {
    1 << (7 - setter)
}

/// A process that makes one unlocked `set`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Setter {
    Idle,
    /// Its `set` asked for `statement`, which its next step sends.
    Asks {
        set: Set,
        statement: overwrite::Statement,
    },
    /// Waiting for its insert's acknowledgement.
    Awaiting {
        set: Set,
    },
    Done {
        ok: bool,
    },
}

/// The partial state of one update: a key of its own, so that merges show which updates a
/// state holds.
fn update_partial(bit: u8) -> String {
    format!("{{\"b{}\":1}}", bit.trailing_zeros())
}

/// The partial state holding `updates`, as the guest's JSON writes it (keys in order).
fn partial_of(updates: u8) -> String {
    let keys: Vec<String> = (0..8)
        .filter(|n| updates & (1 << n) != 0)
        .map(|n| format!("\"b{n}\":1"))
        .collect();
    format!("{{{}}}", keys.join(","))
}

/// The updates a partial state holds (its `b<n>` keys).
fn updates_in(partial: &str) -> u8 {
    clickhouse_state::merge::parse_object(partial, "partial state")
        .unwrap_or_default()
        .keys()
        .filter_map(|k| k.strip_prefix('b')?.parse::<u8>().ok())
        .fold(0, |bits, n| bits | (1 << n))
}

/// A client's view of time and randomness, for the guest's protocol.
struct ClientEnv {
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
    fn replicas_to_ask(&self) -> u8 {
        if self.quorum() { 1 } else { self.replicas }
    }

    fn all_replicas(&self) -> u8 {
        (1 << self.replicas) - 1
    }

    fn clock(&self, world: &World, client: u8) -> u64 {
        world.now + world.clients[client as usize].offset
    }

    fn env(&self, world: &World, client: u8) -> ClientEnv {
        ClientEnv {
            now: self.clock(world, client),
            client,
            tokens: world.clients[client as usize].tokens,
        }
    }

    fn send(
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
    fn answer(&self, world: &mut World, client: u8, mut update: Box<Update>, answer: Answer) {
        let mut env = self.env(world, client);
        let step = update.answer(answer, &mut env);
        world.clients[client as usize].tokens = env.tokens;
        self.next(world, client, update, step);
    }

    /// What `client` does after its update asked for `step`.
    fn next(&self, world: &mut World, client: u8, update: Box<Update>, step: Step) {
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
    fn admits<'a>(guard: &Guard, view: impl Iterator<Item = &'a Row> + Clone) -> bool {
        let stored = final_state(view.clone()).map_or(0, |s| s.version);
        let claims = fenced::claims_on(log(view.clone()), guard.generation, None);
        fenced::admits(guard, &fenced::fold(log(view)), &claims, stored)
    }

    /// Runs `client`'s update from `step`: its reads are answered at once from what `replica`
    /// has (a read and what the client does with it are one step, as a read followed at once by
    /// an insert; the insert then lands whenever), up to an insert sent, a pause or the end.
    fn drive(
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
                        Ok(Answer::Newest(fenced::fold(log(view.clone()))))
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
                            Ok(Answer::Written(Some(0)))
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
    fn step(&self, world: &mut World, client: u8, replica: u8) -> bool {
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
    fn settle_drive(
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
    fn withdraw(world: &mut World, client: u8) {
        world
            .rows
            .retain(|r| !matches!(r.row, Row::Candidate { client: c, .. } if c == client));
    }

    /// The acknowledgement of a client's insert arrives (`dropped`: it landed as nothing).
    fn acknowledge(&self, world: &mut World, client: u8, row: &Row, dropped: bool) {
        let now = self.clock(world, client);
        let pc = world.clients[client as usize].pc.clone();
        match pc {
            Pc::Awaiting { update } => {
                let answer = match row {
                    Row::State { .. } => Answer::Written(Some(u64::from(!dropped))),
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
    fn failed(&self, world: &mut World, client: u8) {
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

impl LockModel {
    fn setter_of(&self, client: u8) -> Option<u8> {
        client.checked_sub(self.clients).filter(|s| *s < self.sets)
    }

    fn is_setter(&self, client: u8) -> bool {
        self.setter_of(client).is_some()
    }

    /// A setter's next step, its read answered by `replica`. Returns false when it cannot step.
    fn set_step(&self, world: &mut World, setter: u8, replica: u8) -> bool {
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
    fn set_drive(
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
    fn set_answer(&self, world: &mut World, setter: u8, mut set: Set, answer: overwrite::Answer) {
        world.setters[setter as usize] = match set.answer(answer) {
            overwrite::Step::Send(statement) => Setter::Asks { set, statement },
            overwrite::Step::Done(result) => Setter::Done { ok: result.is_ok() },
        };
    }

    /// The acknowledgement of a setter's insert arrives.
    fn set_acknowledged(&self, world: &mut World, setter: u8, f: &InFlight) {
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
                now: START,
                clients: offsets
                    .into_iter()
                    .map(|offset| Client {
                        pc: Pc::Idle,
                        offset,
                        attempts: self.attempts,
                        saw_held: false,
                        resumed: None,
                        update: 0,
                        memory: Memory::default(),
                        started: START,
                        tokens: 0,
                    })
                    .collect(),
                rows: vec![],
                in_flight: vec![],
                dedup: BTreeSet::new(),
                lost_responses: self.lost_responses,
                failures: self.failures,
                window_expiries: self.window_expiries,
                forces: self.forces,
                merges: self.merges,
                setters: vec![Setter::Idle; usize::from(self.sets)],
                set_landed: 0,
                written: vec![],
                forced: 0,
                acknowledged: 0,
                replaced: 0,
                crashes: self.crashes,
                killed_at: None,
                locked_out: false,
                recovered: false,
                gave_back: false,
                heeded: false,
            })
            .collect()
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        if world.now < START + self.horizon {
            actions.push(Action::Tick);
        }
        for (i, c) in world.clients.iter().enumerate() {
            let steps = matches!(
                c.pc,
                Pc::Idle
                    | Pc::Asks { .. }
                    | Pc::Paused { .. }
                    | Pc::Settling { .. }
                    | Pc::InSection
            );
            if !steps {
                continue;
            }
            let reads = matches!(c.pc, Pc::Asks { .. } | Pc::Settling { .. } | Pc::Idle);
            let replicas = if reads { self.replicas_to_ask() } else { 1 };
            for replica in 0..replicas {
                actions.push(Action::Step {
                    client: i as u8,
                    replica,
                });
            }
        }
        for (index, f) in world.in_flight.iter().enumerate() {
            if f.landed {
                if f.client.is_some() {
                    actions.push(Action::Ack { index });
                    if world.lost_responses > 0 {
                        actions.push(Action::Lose { index });
                    }
                }
            } else {
                for replica in 0..self.replicas_to_ask() {
                    actions.push(Action::Land { index, replica });
                }
            }
            if f.client.is_some() && world.failures > 0 {
                actions.push(Action::Fail { index });
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
        if world.forces > 0
            && !fenced::fold(log(world.rows.iter().map(|r| &r.row))).is_free(world.now)
        {
            actions.push(Action::Force);
        }
        if world.crashes > 0 {
            for (i, c) in world.clients.iter().enumerate() {
                if matches!(c.pc, Pc::Idle) && c.memory.kept.is_some() {
                    actions.push(Action::Kill { client: i as u8 });
                }
            }
        }
        for (s, setter) in world.setters.iter().enumerate() {
            if matches!(setter, Setter::Idle | Setter::Asks { .. }) {
                for replica in 0..self.replicas_to_ask() {
                    actions.push(Action::SetStep {
                        setter: s as u8,
                        replica,
                    });
                }
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Tick => {
                world.now += 1;
                for c in &mut world.clients {
                    if let Pc::Paused { woken, .. } = &mut c.pc {
                        *woken = true;
                    }
                }
            }
            Action::Step { client, replica } => {
                if !self.step(&mut world, client, replica) {
                    return None;
                }
            }
            Action::Land { index, replica } => {
                let replicas = if self.quorum() {
                    self.all_replicas()
                } else {
                    1 << replica
                };
                let f = &world.in_flight[index];
                // Sent again after a lost response: the server evaluates the guard anew.
                let refused = f
                    .guard
                    .as_ref()
                    .is_some_and(|g| f.dropped && !Self::admits(g, world.view(replica)))
                    || f.unless_newer && {
                        let stored = final_state(world.view(replica)).map(|s| s.version);
                        let Row::State { version, .. } = f.row else {
                            unreachable!("a set writes state")
                        };
                        !overwrite::lands(stored, version)
                    };
                let f = &mut world.in_flight[index];
                f.landed = true;
                f.dropped = refused;
                let (row, token) = (f.row.clone(), f.token.clone());
                // Keeper's deduplication: the token is checked and stored with the part, in
                // one transaction, cluster-wide.
                if refused || !world.dedup.insert(token) {
                    world.in_flight[index].dropped = true;
                } else {
                    if let Row::State {
                        client,
                        version: set_version,
                        ..
                    } = row
                        && let Some(setter) = self.setter_of(client)
                        && world.set_landed & (1 << setter) == 0
                    {
                        // The set takes effect: it replaces what landed before it and what was
                        // on its way (in either order the set may win: the two ran at once), at
                        // or below its version. Landing again later is not another set.
                        world.set_landed |= 1 << setter;
                        let in_flight = world.in_flight.iter().map(|f| &f.row);
                        for r in world.written.iter().chain(in_flight) {
                            if let Row::State {
                                updates, version, ..
                            } = *r
                                && version <= set_version
                            {
                                world.replaced |= updates & !SET_BITS;
                            }
                        }
                    }
                    if let Row::State { .. } = row {
                        world.written.push(row.clone());
                    }
                    world.rows.push(Landed { row, replicas });
                }
                // Given up on by its client: nobody waits for the answer.
                if world.in_flight[index].client.is_none() {
                    world.in_flight.remove(index);
                }
            }
            Action::Ack { index } => {
                let f = world.in_flight.remove(index);
                match f.client.map(|c| (c, self.setter_of(c))) {
                    Some((_, Some(setter))) => self.set_acknowledged(&mut world, setter, &f),
                    Some((client, None)) => self.acknowledge(&mut world, client, &f.row, f.dropped),
                    None => {}
                }
            }
            Action::Lose { index } => {
                world.lost_responses -= 1;
                let f = world.in_flight[index].clone();
                let client = f.client?;
                let past = f
                    .retry_until
                    .is_some_and(|u| self.clock(&world, client) > u);
                if past {
                    world.in_flight.remove(index);
                    self.failed(&mut world, client);
                } else {
                    // Sent again; `dropped` marks it as a resend for the guard.
                    let f = &mut world.in_flight[index];
                    f.landed = false;
                    f.dropped = true;
                    f.resent = true;
                }
            }
            Action::Fail { index } => {
                world.failures -= 1;
                let client = world.in_flight[index].client?;
                if world.in_flight[index].landed {
                    world.in_flight.remove(index);
                } else {
                    world.in_flight[index].client = None;
                }
                self.failed(&mut world, client);
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
            Action::SetStep { setter, replica } => {
                if !self.set_step(&mut world, setter, replica) {
                    return None;
                }
            }
            Action::Kill { client } => {
                world.crashes -= 1;
                world.killed_at = Some(world.now);
                world.clients[client as usize].pc = Pc::Killed;
                // The server may still finish what it sent; nobody waits for the answers.
                world.in_flight.retain_mut(|f| {
                    if f.client == Some(client) {
                        f.client = None;
                        return !f.landed;
                    }
                    true
                });
            }
            Action::Force => {
                // The operator's row lands at once (its own insert races nothing here).
                world.forces -= 1;
                let current = fenced::fold(log(world.rows.iter().map(|r| &r.row)));
                world.forced |= 1 << current.generation;
                world.rows.push(Landed {
                    row: Row::Log(Entry(LogEntry {
                        state_id: "s".into(),
                        generation: current.generation,
                        event: Event::Force,
                        owner: "operator".into(),
                        at_ms: world.now,
                        until_ms: 0,
                        floor_ms: 0,
                    })),
                    replicas: self.all_replicas(),
                });
            }
        }
        Some(world)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = match self.protocol {
            Protocol::Fenced => vec![
                Property::<Self>::always(ONE_HOLDER, |m, w| {
                    let mut owners = BTreeSet::new();
                    for r in &w.written {
                        if let Row::State {
                            generation,
                            owner,
                            client,
                            ..
                        } = r
                            && !m.is_setter(*client)
                        {
                            owners.insert((*generation, owner.clone()));
                        }
                    }
                    let generations: BTreeSet<u64> = owners.iter().map(|(g, _)| *g).collect();
                    generations.len() == owners.len()
                }),
                Property::<Self>::always(NOTHING_LOST, |m, w| {
                    // except the updates of a grant an operator forced open
                    let mut spared = 0u8;
                    for r in &w.written {
                        if let Row::State {
                            generation, client, ..
                        } = *r
                            && !m.is_setter(client)
                            && w.forced & (1 << generation) != 0
                        {
                            spared |= client_bits(client);
                        }
                    }
                    // ...and those a later `set` replaced.
                    let converged = w.converged_state().map_or(0, |s| s.updates);
                    w.acknowledged & !converged & !spared & !w.replaced & !SET_BITS == 0
                }),
                Property::<Self>::always(FENCED, |m, w| {
                    let states: Vec<(u64, u64)> = w
                        .written
                        .iter()
                        .filter_map(|r| match *r {
                            Row::State {
                                version,
                                generation,
                                client,
                                ..
                            } if !m.is_setter(client) => Some((generation, version)),
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
        if self.sets > 0 {
            properties.push(Property::<Self>::always(SET_LANDED, |_, w| {
                w.setters.iter().enumerate().all(|(s, setter)| {
                    *setter != Setter::Done { ok: true } || w.set_landed & (1 << s) != 0
                })
            }));
            properties.push(Property::<Self>::sometimes(SET_DONE, |_, w| {
                w.setters.contains(&Setter::Done { ok: true })
            }));
            properties.push(Property::<Self>::always(SET_ONCE, |m, w| {
                (0..m.sets).all(|setter| {
                    let client = m.clients + setter;
                    // The versions of the rows written since the set's first landing that knew
                    // of it: updates merged into it, and sets sent after it landed.
                    let knew = |r: &Row| match *r {
                        Row::State {
                            updates,
                            generation,
                            client: c,
                            ..
                        } => {
                            if m.is_setter(c) {
                                generation & (1 << setter) != 0
                            } else {
                                updates & set_bit(setter) != 0
                            }
                        }
                        _ => false,
                    };
                    let mut since: Option<Vec<u64>> = None;
                    for r in &w.written {
                        let Row::State {
                            version, client: c, ..
                        } = r
                        else {
                            continue;
                        };
                        match &mut since {
                            Some(others) if *c != client && knew(r) => others.push(*version),
                            Some(_) if *c != client => {}
                            Some(others) if others.iter().any(|v| v <= version) => return false,
                            None if *c == client => since = Some(vec![]),
                            _ => {}
                        }
                    }
                    true
                })
            }));
            properties.push(Property::<Self>::always(SET_KEPT, |_, w| {
                w.written.iter().all(|r| match r {
                    Row::State {
                        after_set: true,
                        updates,
                        ..
                    } => updates & SET_BITS != 0,
                    _ => true,
                })
            }));
        }
        // The checks are not vacuous: some run gets through.
        properties.push(Property::<Self>::sometimes(COMPLETES, |_, w| {
            w.acknowledged != 0
        }));
        if self.crashes > 0 {
            properties.push(Property::<Self>::always(NOT_LOCKED_OUT, |_, w| {
                !w.locked_out
            }));
            properties.push(Property::<Self>::sometimes(RECOVERS, |_, w| w.recovered));
        }
        if self.updates > 1 && self.clients > 1 {
            properties.push(Property::<Self>::sometimes(GIVES_BACK, |_, w| w.gave_back));
            if self.timeout > 0 {
                properties.push(Property::<Self>::sometimes(HEEDS_WANT, |_, w| w.heeded));
            }
        }
        if self.clients == 1 {
            properties.push(Property::<Self>::always(UNCONTENDED, |_, w| {
                !w.clients[0].saw_held
            }));
        }
        properties
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now <= START + self.horizon
    }
}

//! The world the clients act in: the rows each replica has, the inserts in flight, the
//! clients and setters, and the facts the properties read.

use std::collections::BTreeSet;
use std::fmt;

use protocol::fenced::LogEntry;
use protocol::grant::Memory;
use protocol::guard::Guard;
use protocol::set::{self as overwrite, Set};
use protocol::settle::Try;
use protocol::update::{Statement, Update};

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
    pub(crate) fn view(&self, replica: u8) -> impl Iterator<Item = &Row> + Clone {
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
pub(crate) fn final_state<'a>(rows: impl Iterator<Item = &'a Row>) -> Option<Stored> {
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

pub(crate) fn stored_row(stored: Option<Stored>) -> Option<(Option<String>, Option<String>, u64)> {
    stored.map(|s| (Some(partial_of(s.updates)), Some("{}".into()), s.version))
}

pub(crate) fn log<'a>(
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
pub(crate) fn client_bits(client: u8) -> u8 {
    0b11 << (2 * client)
}

/// The time the model starts at: a version is never 0, which the guard reads as "nothing
/// stored" (real versions are milliseconds since 1970).
pub(crate) const START: u64 = 1;

/// The bits of the `set`s in `updates`: setter `s` has `1 << (7 - s)`.
pub const SET_BITS: u8 = 0b1100_0000;

pub(crate) fn set_bit(setter: u8) -> u8 {
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
pub(crate) fn update_partial(bit: u8) -> String {
    format!("{{\"b{}\":1}}", bit.trailing_zeros())
}

/// The partial state holding `updates`, as the guest's JSON writes it (keys in order).
pub(crate) fn partial_of(updates: u8) -> String {
    let keys: Vec<String> = (0..8)
        .filter(|n| updates & (1 << n) != 0)
        .map(|n| format!("\"b{n}\":1"))
        .collect();
    format!("{{{}}}", keys.join(","))
}

/// The updates a partial state holds (its `b<n>` keys).
pub(crate) fn updates_in(partial: &str) -> u8 {
    protocol::merge::parse_object(partial, "partial state")
        .unwrap_or_default()
        .keys()
        .filter_map(|k| k.strip_prefix('b')?.parse::<u8>().ok())
        .fold(0, |bits, n| bits | (1 << n))
}

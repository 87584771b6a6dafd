//! The rows the protocol decides on, as the guest's reads give them (the guest's `rows`
//! decodes each from ClickHouse's answer) and the model's simulated server folds them.

/// A state read together with a lock's grant: partial, completed (NULL as none) and version.
pub type StoredTuple = (Option<String>, Option<String>, u64);

/// The newest generation of an id, folded (`Statements::log_state`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct NewestGeneration {
    pub generation: u64,
    pub owner: String,
    pub acquired_at_ms: u64,
    pub lease_until_ms: u64,
    pub floor_ms: u64,
    pub released: u8,
    pub release_cap_ms: u64,
    pub forced: u8,
    /// Another instance waits for this generation (a `want` row): its keeper should give it
    /// back.
    pub wanted: u8,
}

/// What an `update` reads before it claims (`Statements::log_outlook`): the newest generation
/// (generation 0 when the id was never locked) and the stored state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Outlook {
    pub newest: NewestGeneration,
    pub stored: Option<StoredTuple>,
}

/// One claim on a generation as its read-back sees it (`Statements::log_claims`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Claim {
    pub owner: String,
    pub at_ms: u64,
    pub until_ms: u64,
    /// The newest generation of the id in the log.
    pub newest: u64,
    /// The lease end of the generation the claim replaces, renewals included.
    pub previous_until: u64,
    pub stored: Vec<StoredTuple>,
}

/// A live candidate, as `Statements::lock_candidates` reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub lock_id: String,
    pub locked_at_s: u64,
}

/// The deployment check's one row (`Statements::deployment`).
#[derive(Debug, Default)]
pub struct Observation {
    /// (table name, engine) of this store's tables that exist.
    pub tables: Vec<(String, String)>,
    /// The server has a `replica` macro: it is set up as a replica of replicated tables.
    pub replica_macro: u8,
    /// (cluster name, largest replica number) of the clusters the server knows.
    pub clusters: Vec<(String, u64)>,
    /// The server knows the `deduplicate_insert` setting (newer releases; it supersedes
    /// `insert_deduplicate`).
    pub dedup_setting: u8,
    /// The history's view exists (see `sql::history`).
    pub history_view: u8,
    /// Which of the newer pinned settings the server knows (see `pinned::newer_names`).
    pub pinnable: Vec<String>,
}

/// What a row of the lock log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    Acquire,
    Renew,
    Release,
    Force,
    /// Another instance waits for the generation's holder (a hint: a keeper that sees it gives
    /// its kept grant back; it decides nothing).
    Want,
}

impl Event {
    /// Every event with its number in the log's `Enum8` column (`Statements::lock_log_events`).
    pub const ALL: [(Event, &'static str, u8); 5] = [
        (Event::Acquire, "acquire", 1),
        (Event::Renew, "renew", 2),
        (Event::Release, "release", 3),
        (Event::Force, "force", 4),
        (Event::Want, "want", 5),
    ];

    /// The event's name in the log.
    pub fn name(self) -> &'static str {
        Event::ALL
            .iter()
            .find(|(event, _, _)| *event == self)
            .map_or("", |(_, name, _)| name)
    }
}

impl serde::Serialize for Event {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

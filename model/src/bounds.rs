//! The bounds of one check: how many clients, faults and ticks, and the guest's limits under them.

use protocol::deployment::{Consistency, Kind};
use protocol::role::Role;
use protocol::update::{self, Limits};

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
            pinnable: 0,
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

    pub(crate) fn limits(&self) -> Limits {
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

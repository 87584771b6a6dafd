//! The default lock: generations in an append-only lock log (`<table>_lock_log`).
//!
//! Each grant of a state id is a generation `g`; `g` is the grant's fencing token. To acquire:
//!
//! 1. Read the newest generation `g` of the id (one folded row). It is free when it was
//!    released, forced open, or its lease ended.
//! 2. Append `acquire` for `g + 1` with my owner id, my lease end and the version floor of the
//!    new grant, under the deduplication token `acquire/<g+1>/<id>`.
//! 3. Read back the claims on `g + 1`. I hold the lock when every claim on `g + 1` is mine and
//!    `g + 1` is still the newest generation.
//!
//! Why at most one holder: inserts are acknowledged only once visible (synchronous inserts;
//! sequentially consistent reads on replicated servers). Of two contenders for `g + 1`, the one
//! whose read-back comes second sees the other's claim, so it cannot see only itself; with
//! deduplication on (the default of replicated and Cloud tables, and of this table) the second
//! claim does not even land. A claim that lands late, after others moved on, is for an old
//! generation and decides nothing. Rows are never merged away (plain MergeTree) and never
//! updated: release, renew and force are rows of their own.
//!
//! Fencing: a grant's writes use versions in `[floor, lease end]`; the next grant's floor is
//! above the previous grant's last possible version (its release cap, or its lease end when it
//! was forced open or expired). So a holder that lost its lock can never overwrite what a later
//! holder wrote, whatever the clocks do.

use serde::Serialize;

use crate::config::LockMode;
use crate::error::{Error, LockInfo};
use crate::grant::{Attempt, LockHandle, StoredRow};
use crate::rows::{Claim, Event, NewestGeneration};

/// Old generations are pruned once in this many claims (`acquire` and `update` alike), so an
/// id's log holds at most `PRUNE_EVERY + PRUNE_KEEP + 1` generations whatever its age (while
/// pruning succeeds; it is best effort, and a failed one leaves its rows to the next).
pub const PRUNE_EVERY: u64 = 128;
/// How many old generations pruning keeps.
pub const PRUNE_KEEP: u64 = 16;

/// The generation below which a claim on `generation` prunes the log, if it is a claim that
/// prunes: once in [`PRUNE_EVERY`], keeping the [`PRUNE_KEEP`] generations before it.
pub fn prune_below(generation: u64) -> Option<u64> {
    (generation >= PRUNE_EVERY && generation.is_multiple_of(PRUNE_EVERY))
        .then(|| generation - PRUNE_KEEP)
}

// The decisions below are pure, so that the model checker (`model/`) runs these very functions.
impl NewestGeneration {
    pub fn is_free(&self, now_ms: u64) -> bool {
        self.generation == 0
            || self.released != 0
            || self.forced != 0
            || now_ms > self.lease_until_ms
    }

    /// Whether this is the grant `claim` asked for: the same generation, held by its owner, and
    /// still open.
    pub fn is_claim_of(&self, claim: &LockHandle) -> bool {
        self.generation == claim.token
            && self.owner == claim.owner
            && self.released == 0
            && self.forced == 0
    }

    /// Whether `lock`, a confirmed grant, is still the newest generation, neither released nor
    /// forced open.
    pub fn still_held_by(&self, lock: &LockHandle) -> bool {
        self.generation == lock.token && self.forced == 0 && self.released == 0
    }

    /// The lowest version the next grant may write: above anything this grant could write.
    pub fn next_floor(&self) -> u64 {
        if self.generation == 0 {
            return 0;
        }
        let cap = if self.released != 0 && self.forced == 0 {
            self.release_cap_ms
        } else {
            self.lease_until_ms
        };
        self.floor_ms.max(cap.saturating_add(1))
    }

    /// Who holds the id, as a `locked` error names it.
    pub fn info(&self, state_id: &str) -> LockInfo {
        LockInfo {
            state_id: state_id.to_string(),
            owner: self.owner.clone(),
            token: self.generation,
            acquired_at_ms: self.acquired_at_ms,
            expires_at_ms: self.lease_until_ms,
        }
    }
}

/// What a claim's read-back decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Every claim on the generation is mine and it is the newest: I hold the lock.
    Mine,
    /// The generation this claim replaces was renewed after it was read: its holder may have
    /// checked the log before this claim landed and gone on, so the claim loses.
    GivesWay,
    /// Someone else claimed the generation too, or a newer one exists.
    Lost,
}

/// Decides a claim by `owner` on `generation`, which followed `current` (read free).
pub fn decide_claim(
    current: &NewestGeneration,
    claims: &[Claim],
    owner: &str,
    generation: u64,
) -> ClaimOutcome {
    if renewed_since(current, claims) {
        ClaimOutcome::GivesWay
    } else if all_mine(claims, owner, generation) {
        ClaimOutcome::Mine
    } else {
        ClaimOutcome::Lost
    }
}

/// The generation `current` was free because its lease had ended, and a renewal of it has
/// landed since.
pub fn renewed_since(current: &NewestGeneration, claims: &[Claim]) -> bool {
    current.released == 0
        && current.forced == 0
        && claims
            .first()
            .is_some_and(|c| c.previous_until > current.lease_until_ms)
}

/// Every claim on `generation` is `owner`'s, and no newer generation exists.
pub fn all_mine(claims: &[Claim], owner: &str, generation: u64) -> bool {
    claims.iter().all(|c| c.owner == owner)
        && claims.first().is_some_and(|c| c.newest == generation)
}

/// How close to its end a lease counts as ended for its holder: clocks may differ by this much,
/// and a contender whose clock is ahead sees the lease end that much earlier.
pub fn lease_margin_ms(lease_ms: u64) -> u64 {
    lease_ms / 10
}

/// Whether, at `now_ms`, a contender may already see the lease ending at `lease_until_ms` as
/// ended: too late to renew, and a write acknowledged now needs the log to say it was in time.
pub fn near_lease_end(now_ms: u64, lease_until_ms: u64, lease_ms: u64) -> bool {
    now_ms.saturating_add(lease_margin_ms(lease_ms)) >= lease_until_ms
}

/// One row of the lock log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct LogEntry {
    pub state_id: String,
    pub generation: u64,
    pub event: Event,
    pub owner: String,
    pub at_ms: u64,
    pub until_ms: u64,
    pub floor_ms: u64,
}

impl LogEntry {
    /// The row's deduplication token: it names the logical event, so that a retry lands once,
    /// and two contenders for one generation share `acquire/<g>/<id>`.
    pub fn token(&self) -> String {
        let (g, id, owner) = (self.generation, &self.state_id, &self.owner);
        match self.event {
            Event::Acquire => format!("acquire/{g}/{id}"),
            Event::Renew => format!("renew/{g}/{}/{owner}/{id}", self.until_ms),
            Event::Release => format!("release/{g}/{owner}/{id}"),
            Event::Force => format!("force/{g}/{owner}/{id}"),
            Event::Want => format!("want/{}/{id}", self.until_ms),
        }
    }
}

/// A claim on the generation after `current` (which must be free), by `owner`, at `now_ms`:
/// the grant it asks for, not yet decided.
pub fn claim_handle(
    state_id: &str,
    current: &NewestGeneration,
    now_ms: u64,
    lease_ms: u64,
    owner: String,
) -> LockHandle {
    LockHandle {
        state_id: state_id.to_string(),
        owner,
        token: current.generation + 1,
        acquired_at_ms: now_ms,
        lease_until_ms: now_ms.saturating_add(lease_ms),
        floor_ms: current.next_floor(),
        last_written_ms: 0,
        mode: LockMode::Fenced,
    }
}

/// The log row of a lock's event at `at_ms`: its claim, a renewal to `until_ms`, its release
/// (whose cap is the highest version its holder may have written).
pub fn entry(lock: &LockHandle, event: Event, at_ms: u64) -> LogEntry {
    let until_ms = match event {
        Event::Acquire | Event::Renew => lock.lease_until_ms,
        // The release cap: no version above what this grant wrote will come from it.
        Event::Release => lock.last_written_ms,
        Event::Force | Event::Want => 0,
    };
    LogEntry {
        state_id: lock.state_id.clone(),
        generation: lock.token,
        event,
        owner: lock.owner.clone(),
        at_ms,
        until_ms,
        floor_ms: lock.floor_ms,
    }
}

/// The newest generation as it is once `lock` is released: what the next claim follows.
pub fn released(lock: &LockHandle) -> NewestGeneration {
    NewestGeneration {
        generation: lock.token,
        owner: lock.owner.clone(),
        acquired_at_ms: lock.acquired_at_ms,
        lease_until_ms: lock.lease_until_ms,
        floor_ms: lock.floor_ms,
        released: 1,
        release_cap_ms: lock.last_written_ms,
        forced: 0,
        wanted: 0,
    }
}

/// The row by which a waiter says, at `now_ms`, that it waits for `holder` (the newest
/// generation, held): the holder gives back a kept grant when it sees one. It is a hint, sent
/// once per holder and never retried, and it decides nothing. It names no waiter: one want of a
/// generation says all there is to say, so the wants of several waiters share a token and land
/// once. It goes in generation 0, which no grant has, so that no read of a generation, its
/// claims or the guard ever meets it, with the generation it wants in `until_ms`
/// ([`wanted_generation`]). Pruning drops it with the old generations. It only lands on a log
/// whose `event` column knows it (`say_wanted`).
pub fn want(holder: &LockInfo, now_ms: u64) -> LogEntry {
    LogEntry {
        state_id: holder.state_id.clone(),
        generation: 0,
        event: Event::Want,
        owner: String::new(),
        at_ms: now_ms,
        until_ms: holder.token,
        floor_ms: 0,
    }
}

/// The generation a `want` row asks for.
pub fn wanted_generation(entry: &LogEntry) -> Option<u64> {
    (entry.event == Event::Want).then_some(entry.until_ms)
}

/// What `Statements::log_state` folds from an id's lock log: its newest generation (generation
/// 0 when the id was never locked). The SQL is the one that runs; this is the same fold in
/// Rust, for the model, and the engine test in `tests/tests/integration/statements.rs` checks that the two agree.
pub fn fold<'a>(log: impl Iterator<Item = &'a LogEntry> + Clone) -> NewestGeneration {
    let generation = log.clone().map(|e| e.generation).max().unwrap_or(0);
    let mut folded = NewestGeneration {
        generation,
        ..NewestGeneration::default()
    };
    if generation == 0 {
        return folded;
    }
    folded.wanted = u8::from(
        log.clone()
            .any(|e| wanted_generation(e) == Some(generation)),
    );
    let mut first_claim: Option<&LogEntry> = None;
    for entry in log.filter(|e| e.generation == generation) {
        match entry.event {
            Event::Acquire => {
                if first_claim.is_none_or(|f| entry.at_ms < f.at_ms) {
                    first_claim = Some(entry);
                }
                folded.lease_until_ms = folded.lease_until_ms.max(entry.until_ms);
                folded.floor_ms = folded.floor_ms.max(entry.floor_ms);
            }
            Event::Renew => folded.lease_until_ms = folded.lease_until_ms.max(entry.until_ms),
            Event::Release => {
                folded.released = 1;
                folded.release_cap_ms = folded.release_cap_ms.max(entry.until_ms);
            }
            Event::Force => folded.forced = 1,
            // In generation 0: never the newest (see `want`).
            Event::Want => {}
        }
    }
    if let Some(first) = first_claim {
        folded.acquired_at_ms = first.at_ms;
        folded.owner = first.owner.clone();
    }
    folded
}

/// What `Statements::log_claims` reads back for `generation` (with the stored state `stored`),
/// in Rust (see [`fold`]).
pub fn claims_on<'a>(
    log: impl Iterator<Item = &'a LogEntry> + Clone,
    generation: u64,
    stored: Option<StoredRow>,
) -> Vec<Claim> {
    let newest = log.clone().map(|e| e.generation).max().unwrap_or(0);
    let previous_until = log
        .clone()
        .filter(|e| {
            e.generation + 1 == generation && matches!(e.event, Event::Acquire | Event::Renew)
        })
        .map(|e| e.until_ms)
        .max()
        .unwrap_or(0);
    log.filter(|e| e.generation == generation && e.event == Event::Acquire)
        .map(|e| Claim {
            owner: e.owner.clone(),
            at_ms: e.at_ms,
            until_ms: e.until_ms,
            newest,
            previous_until,
            stored: stored.iter().cloned().collect(),
        })
        .collect()
}

/// What a decided claim `handle` (which followed `followed`) comes to: the grant, when it is
/// its owner's alone; else who holds the id. A claim that gave way stays in the log until its
/// own lease ends, so that nobody takes the id while the renewed holder works: that holder,
/// until its renewed lease ends. One that lost: the rival that claimed too.
pub fn claim_decided(
    outcome: ClaimOutcome,
    followed: &NewestGeneration,
    claims: &[Claim],
    handle: LockHandle,
) -> Attempt {
    match outcome {
        ClaimOutcome::Mine => Attempt::Granted(handle),
        ClaimOutcome::GivesWay => Attempt::Held(LockInfo {
            expires_at_ms: claims.first().map_or(0, |c| c.previous_until),
            ..followed.info(&handle.state_id)
        }),
        ClaimOutcome::Lost => Attempt::Held(rival(claims, &handle)),
    }
}

/// Who beat the claim `handle`, as far as its read-back `claims` tells.
pub fn rival(claims: &[Claim], handle: &LockHandle) -> LockInfo {
    match claims.iter().find(|c| c.owner != handle.owner) {
        Some(c) => LockInfo {
            state_id: handle.state_id.clone(),
            owner: c.owner.clone(),
            token: handle.token,
            acquired_at_ms: c.at_ms,
            expires_at_ms: c.until_ms,
        },
        None => LockInfo {
            state_id: handle.state_id.clone(),
            owner: "unknown (a newer generation exists)".into(),
            token: handle.token,
            acquired_at_ms: handle.acquired_at_ms,
            expires_at_ms: handle.lease_until_ms,
        },
    }
}

/// Whether the claim in doubt `handle` can still be decided from the log at `now_ms`: only
/// while its generation is the newest, still open, and its lease has not ended. A generation
/// forced open or released, or a lease that ended, is never adopted: a new claim follows it.
pub fn doubt_decidable(current: &NewestGeneration, handle: &LockHandle, now_ms: u64) -> bool {
    current.is_claim_of(handle) && now_ms <= handle.lease_until_ms
}

/// The `lock-lost` error of `lock`, saying why.
pub fn lost(lock: &LockHandle, why: &str) -> Error {
    Error::LockLost(format!(
        "the lock on {:?} (token {}) is no longer held: {why}",
        lock.state_id, lock.token
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newest(released: bool, forced: bool, until: u64, cap: u64, floor: u64) -> NewestGeneration {
        NewestGeneration {
            generation: 3,
            owner: "o".into(),
            acquired_at_ms: 100,
            lease_until_ms: until,
            floor_ms: floor,
            released: released as u8,
            release_cap_ms: cap,
            forced: forced as u8,
            wanted: 0,
        }
    }

    /// A `want` marks the generation it names, once that is the newest, and is never a
    /// generation itself: the newest generation, the claims and the fold's other columns are
    /// what they are without it.
    #[test]
    fn a_want_marks_the_generation_it_names_and_is_never_a_generation() {
        let acquire = |generation| LogEntry {
            state_id: "s".into(),
            generation,
            event: Event::Acquire,
            owner: "a".into(),
            at_ms: 1,
            until_ms: 10,
            floor_ms: 0,
        };
        let wants = |token| {
            let holder = LockInfo {
                state_id: "s".into(),
                owner: "a".into(),
                token,
                acquired_at_ms: 1,
                expires_at_ms: 10,
            };
            want(&holder, 5)
        };
        let mut log = vec![acquire(1), acquire(2), wants(1)];
        let before = fold(log[..2].iter());
        assert_eq!(fold(log.iter()), before, "a want for an older generation");
        log.push(wants(2));
        let after = fold(log.iter());
        assert_eq!((after.generation, after.wanted), (2, 1));
        assert_eq!(NewestGeneration { wanted: 0, ..after }, before);
        for generation in [1, 2] {
            // Generation 1's previous generation is 0, where the wants are.
            assert_eq!(
                claims_on(log.iter(), generation, None),
                claims_on(log[..2].iter(), generation, None)
            );
        }
        assert_eq!(
            fold([wants(3)].iter()).generation,
            0,
            "wants alone: never locked"
        );
    }

    /// A claim on a generation whose predecessor was free only because its lease had ended
    /// gives way when a renewal of that predecessor landed since (its holder may have gone on
    /// writing); a released or forced predecessor, or a renewal that did not reach past the
    /// lease read, does not stop it.
    #[test]
    fn a_claim_gives_way_to_a_renewal_of_the_generation_it_replaced() {
        let claim = |owner: &str, previous_until| Claim {
            owner: owner.into(),
            at_ms: 0,
            until_ms: 0,
            newest: 4,
            previous_until,
            stored: vec![],
        };
        let expired = newest(false, false, 1_000, 0, 0);
        let decide = |current: &NewestGeneration, previous_until| {
            decide_claim(current, &[claim("me", previous_until)], "me", 4)
        };
        assert_eq!(decide(&expired, 1_500), ClaimOutcome::GivesWay);
        assert_eq!(decide(&expired, 1_000), ClaimOutcome::Mine);
        assert_eq!(
            decide(&newest(true, false, 1_000, 0, 0), 1_500),
            ClaimOutcome::Mine
        );
        assert_eq!(
            decide(&newest(false, true, 1_000, 0, 0), 1_500),
            ClaimOutcome::Mine
        );
        assert_eq!(
            decide_claim(
                &expired,
                &[claim("me", 1_000), claim("rival", 1_000)],
                "me",
                4
            ),
            ClaimOutcome::Lost
        );
    }

    #[test]
    fn a_claim_prunes_once_in_prune_every_and_keeps_prune_keep_generations() {
        for generation in [0, 1, PRUNE_EVERY - 1, PRUNE_EVERY + 1, 2 * PRUNE_EVERY - 1] {
            assert_eq!(prune_below(generation), None, "generation {generation}");
        }
        for n in [1, 2, 1000] {
            let generation = n * PRUNE_EVERY;
            assert_eq!(prune_below(generation), Some(generation - PRUNE_KEEP));
        }
        let pruning = (0..10 * PRUNE_EVERY).filter(|&g| prune_below(g).is_some());
        assert_eq!(pruning.count(), 9);
    }

    /// A holder counts its lease as ended a tenth of it early, the skew allowed between clocks:
    /// a contender whose clock is that far ahead already sees it ended.
    #[test]
    fn a_lease_is_near_its_end_a_tenth_of_it_early() {
        assert_eq!(lease_margin_ms(30_000), 3_000);
        assert_eq!(lease_margin_ms(10_000), 1_000);
        let until = 100_000;
        assert!(!near_lease_end(until - 3_001, until, 30_000));
        assert!(near_lease_end(until - 3_000, until, 30_000));
        assert!(near_lease_end(until + 1, until, 30_000), "past its end");
    }

    /// A generation's holder is its earliest claim by the claimers' clocks (the SQL's
    /// `argMinIf`), whatever order the rows come in: concurrent claims land in either.
    #[test]
    fn a_generation_is_held_by_its_earliest_claim_whatever_order_the_rows_come_in() {
        let acquire = |owner: &str, at_ms| LogEntry {
            state_id: "s".into(),
            generation: 2,
            event: Event::Acquire,
            owner: owner.into(),
            at_ms,
            until_ms: at_ms + 10,
            floor_ms: 0,
        };
        let log = [
            acquire("late", 7),
            acquire("early", 5),
            acquire("between", 6),
        ];
        let folded = fold(log.iter());
        assert_eq!((folded.owner.as_str(), folded.acquired_at_ms), ("early", 5));
        assert_eq!(
            folded.lease_until_ms, 17,
            "the latest lease of the generation"
        );
    }

    /// A decided claim is the grant only when it is its owner's alone; a claim that gave way
    /// names the renewed holder, until its renewed lease ends; one that lost names the rival.
    #[test]
    fn a_claim_not_granted_names_who_holds_the_id() {
        let handle = LockHandle {
            state_id: "s".into(),
            owner: "me".into(),
            token: 4,
            acquired_at_ms: 2_000,
            lease_until_ms: 32_000,
            floor_ms: 0,
            last_written_ms: 0,
            mode: LockMode::Fenced,
        };
        let claim = |owner: &str| Claim {
            owner: owner.into(),
            at_ms: 1_900,
            until_ms: 31_900,
            newest: 4,
            previous_until: 1_500,
            stored: vec![],
        };
        let followed = NewestGeneration {
            owner: "renewed".into(),
            ..newest(false, false, 1_000, 0, 0)
        };
        let decided =
            |outcome, claims: &[Claim]| claim_decided(outcome, &followed, claims, handle.clone());
        assert_eq!(
            decided(ClaimOutcome::Mine, &[claim("me")]),
            Attempt::Granted(handle.clone())
        );
        let Attempt::Held(gave_way) = decided(ClaimOutcome::GivesWay, &[claim("me")]) else {
            panic!("a claim that gave way is no grant");
        };
        assert_eq!(
            (
                gave_way.owner.as_str(),
                gave_way.token,
                gave_way.expires_at_ms
            ),
            ("renewed", 3, 1_500),
            "the renewed holder, until its renewed lease ends"
        );
        let Attempt::Held(lost) = decided(ClaimOutcome::Lost, &[claim("me"), claim("rival")])
        else {
            panic!("a lost claim is no grant");
        };
        assert_eq!((lost.owner.as_str(), lost.expires_at_ms), ("rival", 31_900));
    }

    /// A claim in doubt is decided from the log only while it is the newest open generation and
    /// within its lease; forced open, released or past its lease, it is never adopted.
    #[test]
    fn a_claim_in_doubt_is_decided_only_while_open_and_within_its_lease() {
        let claim = LockHandle {
            state_id: "s".into(),
            owner: "o".into(),
            token: 3,
            acquired_at_ms: 100,
            lease_until_ms: 1_000,
            floor_ms: 0,
            last_written_ms: 0,
            mode: LockMode::Fenced,
        };
        let open = newest(false, false, 1_000, 0, 0);
        assert!(doubt_decidable(&open, &claim, 1_000), "at its lease's end");
        assert!(!doubt_decidable(&open, &claim, 1_001), "past its lease");
        let forced = newest(false, true, 1_000, 0, 0);
        assert!(!doubt_decidable(&forced, &claim, 500), "forced open");
        let released = newest(true, false, 1_000, 0, 0);
        assert!(!doubt_decidable(&released, &claim, 500), "released");
    }

    #[test]
    fn free_when_released_forced_or_expired() {
        assert!(NewestGeneration::default().is_free(0));
        assert!(!newest(false, false, 1_000, 0, 0).is_free(1_000));
        assert!(newest(false, false, 1_000, 0, 0).is_free(1_001));
        assert!(newest(true, false, 1_000, 0, 0).is_free(500));
        assert!(newest(false, true, 1_000, 0, 0).is_free(500));
    }

    #[test]
    fn a_claim_in_doubt_is_ours_only_if_it_is_the_open_newest_grant() {
        let claim = LockHandle {
            state_id: "s".into(),
            owner: "o".into(),
            token: 3,
            acquired_at_ms: 100,
            lease_until_ms: 1_000,
            floor_ms: 0,
            last_written_ms: 0,
            mode: LockMode::Fenced,
        };
        assert!(newest(false, false, 1_000, 0, 0).is_claim_of(&claim));
        assert!(
            !newest(true, false, 1_000, 0, 0).is_claim_of(&claim),
            "released"
        );
        assert!(
            !newest(false, true, 1_000, 0, 0).is_claim_of(&claim),
            "forced"
        );
        let mut other = newest(false, false, 1_000, 0, 0);
        other.owner = "someone else".into();
        assert!(!other.is_claim_of(&claim), "another owner won");
        let mut later = newest(false, false, 1_000, 0, 0);
        later.generation = 4;
        assert!(!later.is_claim_of(&claim), "a later generation");
    }

    #[test]
    fn the_next_floor_is_above_what_the_last_grant_could_write() {
        // released by its holder: above what it wrote
        assert_eq!(newest(true, false, 9_000, 700, 0).next_floor(), 701);
        // forced open: the holder may still write until its lease ends
        assert_eq!(newest(false, true, 9_000, 0, 0).next_floor(), 9_001);
        assert_eq!(newest(true, true, 9_000, 700, 0).next_floor(), 9_001);
        // expired
        assert_eq!(newest(false, false, 9_000, 0, 0).next_floor(), 9_001);
        // floors never go down, even after a grant that wrote nothing
        assert_eq!(newest(true, false, 9_000, 0, 5_000).next_floor(), 5_000);
        assert_eq!(NewestGeneration::default().next_floor(), 0);
    }
}

//! The model checks exhaustively within each configuration's bounds, and every mutant (one
//! safety measure removed) is caught. Configurations are split so that each stays small: the
//! features multiply the state space, and each property needs only some of them together.

use std::time::Instant;

use lock_model::{
    COMPLETES, EXCLUSIVE, FENCED, LockModel, Mutant, NOTHING_LOST, ONE_HOLDER, SET_KEPT,
    UNCONTENDED,
};
use stateright::{Checker, HasDiscoveries, Model};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn report(label: &str, checker: &impl Checker<LockModel>, started: Instant) {
    eprintln!(
        "{label}: {} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
}

/// Explores every state within the bounds: no safety property has a counterexample, and some
/// run acknowledges an update.
fn holds(label: &str, model: LockModel) {
    let started = Instant::now();
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    report(label, &checker, started);
    checker.assert_properties();
    assert!(checker.discovery(COMPLETES).is_some());
}

/// With a safety measure removed, the checker finds a counterexample to one of `properties`.
fn caught(label: &str, model: LockModel, properties: &[&str]) {
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    report(label, &checker, started);
    let found: Vec<&str> = checker
        .discoveries()
        .into_keys()
        .filter(|name| *name != COMPLETES)
        .collect();
    assert!(
        found.iter().any(|name| properties.contains(name)),
        "{label}: the mutant was not caught (found: {found:?})"
    );
    for name in found {
        if let Some(path) = checker.discovery(name) {
            eprintln!(
                "  {name}: a counterexample of {} steps",
                path.into_actions().len()
            );
        }
    }
}

/// Two clients, a lease of 4 ticks (margin 0, so no skew), renewals, and the dedup window that
/// passes once, so that a second claim on a generation lands.
fn renewals() -> LockModel {
    LockModel {
        lease: 4,
        horizon: 6,
        skew: 0,
        lost_responses: 0,
        window_expiries: 1,
        attempts: 1,
        renew: true,
        ..LockModel::fenced()
    }
}

/// Responses lost after their insert landed, resent, inside and after the dedup window.
fn lost_responses() -> LockModel {
    LockModel {
        lost_responses: 1,
        renew: false,
        ..renewals()
    }
}

/// Clocks off by up to the lease's margin (1 tick of a 10-tick lease).
fn skew() -> LockModel {
    LockModel {
        lease: 10,
        horizon: 12,
        skew: 1,
        lost_responses: 0,
        window_expiries: 0,
        attempts: 1,
        renew: false,
        ..LockModel::fenced()
    }
}

/// An operator forces the lock open once.
fn force() -> LockModel {
    LockModel {
        forces: 1,
        window_expiries: 0,
        renew: false,
        ..renewals()
    }
}

/// A client that loses a claim tries again; a background merge of the state table runs.
fn retries() -> LockModel {
    LockModel {
        attempts: 2,
        renew: false,
        merges: 1,
        ..renewals()
    }
}

/// Two updates per client under one kept grant (linger): the second is one guarded write.
fn linger() -> LockModel {
    LockModel {
        updates: 2,
        renew: false,
        window_expiries: 0,
        ..renewals()
    }
}

/// One client keeps its grant across two updates while another process `set`s the state
/// without the lock.
fn linger_with_a_set() -> LockModel {
    LockModel {
        clients: 1,
        setter: true,
        lost_responses: 1,
        ..linger()
    }
}

fn settle() -> LockModel {
    LockModel {
        clients: 3,
        horizon: 6,
        ..LockModel::settle()
    }
}

#[test]
fn fenced_with_renewals_and_a_passing_dedup_window() {
    holds("renewals", renewals());
}

#[test]
fn fenced_with_lost_responses() {
    holds("lost responses", lost_responses());
}

#[test]
fn fenced_with_clock_skew_within_the_margin() {
    holds("skew", skew());
}

#[test]
fn fenced_with_a_forced_unlock() {
    holds("force", force());
}

#[test]
fn fenced_with_retried_claims_and_a_merge() {
    holds("retries and a merge", retries());
}

#[test]
fn fenced_with_kept_grants() {
    holds("linger", linger());
}

#[test]
fn fenced_with_kept_grants_renewed_between_updates() {
    holds(
        "linger, renewals",
        LockModel {
            renew: true,
            ..linger()
        },
    );
}

#[test]
fn fenced_with_a_kept_grant_forced_open() {
    holds(
        "linger, force",
        LockModel {
            forces: 1,
            ..linger()
        },
    );
}

#[test]
fn fenced_with_a_kept_grant_and_an_unlocked_set() {
    let model = linger_with_a_set();
    assert!(model.properties().iter().any(|p| p.name == SET_KEPT));
    holds("linger, set", model);
}

#[test]
fn settle_mode_with_three_clients() {
    holds("settle", settle());
}

#[test]
fn an_uncontended_acquire_succeeds() {
    let model = LockModel {
        clients: 1,
        lost_responses: 1,
        ..renewals()
    };
    assert!(
        model.properties().iter().any(|p| p.name == UNCONTENDED),
        "the property is checked"
    );
    holds("uncontended", model);
}

// -- mutants --------------------------------------------------------------------------------

#[test]
fn without_quorum_inserts_a_lagging_replica_loses_updates() {
    let model = LockModel {
        renew: false,
        window_expiries: 0,
        ..renewals()
    };
    caught(
        "no quorum",
        model.with(Mutant::NoQuorum),
        &[NOTHING_LOST, ONE_HOLDER, FENCED],
    );
}

/// Before guarded writes, this mutant lost updates (a late renewal adopted let the holder write
/// into the next grant's versions). An update's every write now checks its grant in the log
/// when the server runs it, so the renewal's own check no longer guards `update`: the mutant
/// model holds. (It still guards explicit locks' `set-locked`, which this model does not run.)
#[test]
fn with_guarded_writes_a_late_renewal_cannot_make_an_update_land() {
    holds(
        "no renew confirm, guarded",
        LockModel {
            updates: 2,
            ..renewals()
        }
        .with(Mutant::NoRenewConfirm),
    );
}

#[test]
fn without_giving_way_a_claim_takes_a_renewed_lock() {
    caught(
        "no give way",
        LockModel {
            updates: 2,
            ..renewals()
        }
        .with(Mutant::NoGiveWay),
        &[NOTHING_LOST, FENCED],
    );
}

#[test]
fn without_the_fencing_floor_a_forced_holder_overwrites_newer_state() {
    caught(
        "no floor",
        force().with(Mutant::NoFloor),
        &[FENCED, NOTHING_LOST],
    );
}

#[test]
fn without_the_check_after_a_late_write_an_acknowledged_update_is_lost() {
    let model = LockModel {
        renew: false,
        window_expiries: 0,
        ..renewals()
    };
    caught(
        "no write confirm",
        model.with(Mutant::NoWriteConfirm),
        &[NOTHING_LOST],
    );
}

#[test]
fn without_the_claim_in_the_guard_two_claimants_both_write() {
    caught(
        "no claim guard",
        linger().with(Mutant::NoClaimGuard),
        &[ONE_HOLDER, NOTHING_LOST, FENCED],
    );
}

#[test]
fn without_the_version_in_the_guard_a_kept_grant_writes_over_a_set() {
    caught(
        "no stale check",
        linger_with_a_set().with(Mutant::NoStaleCheck),
        &[SET_KEPT],
    );
}

#[test]
fn a_kept_grant_written_under_to_its_lease_end_buries_the_next_holders_update() {
    caught(
        "kept to the end",
        linger().with(Mutant::KeptToTheEnd),
        &[NOTHING_LOST, FENCED],
    );
}

#[test]
fn settle_mode_comparing_with_the_time_before_the_insert_admits_two_holders() {
    caught(
        "settle before insert",
        settle().with(Mutant::SettleBeforeInsert),
        &[EXCLUSIVE],
    );
}

// -- a known limit ----------------------------------------------------------------------------

/// Settle mode keeps the original backend's table, a ReplacingMergeTree by state id: a
/// background merge keeps one candidate, and a holder whose row was merged away is invisible to
/// the next contender. Not fixable without changing the Python backend's table (docs/lock.md,
/// "settle"); the model shows it, so that the limit is stated from a check, not a guess.
#[test]
fn settle_mode_is_not_safe_against_a_merge_of_its_candidates() {
    let model = LockModel {
        merges: 1,
        ..settle()
    };
    caught("settle with a merge", model, &[EXCLUSIVE]);
}

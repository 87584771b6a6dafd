//! The model checks exhaustively within each configuration's bounds; where a safety measure is
//! missing (one server's settings on a replicated cluster), it finds the counterexample; the
//! changes of the guest's code it catches are `just mutants`'. Configurations are split so that each stays small: the features multiply
//! the state space, and each property needs only some of them together.

use std::time::Instant;

use lock_model::{
    COMPLETES, EXCLUSIVE, FENCED, GIVES_BACK, HEEDS_WANT, LockModel, NOT_LOCKED_OUT, NOTHING_LOST,
    ONE_HOLDER, RECOVERS, SET_DONE, SET_KEPT, SET_ONCE, SET_PASSES_A_LIVE_FLOOR, UNCONTENDED,
};
use protocol::deployment::Kind;
use stateright::{Checker, Expectation, HasDiscoveries, Model};

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
/// run acknowledges an update. The search stops at the first counterexample, which fails the
/// check as a full search would (a mutant's verdict in seconds, not minutes).
fn holds(label: &str, model: LockModel) -> impl Checker<LockModel> {
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    report(label, &checker, started);
    checker.assert_properties();
    assert!(checker.discovery(COMPLETES).is_some());
    checker
}

/// As [`holds`], but for `unreached`: properties of the `sometimes` kind that these bounds are
/// too narrow to show (another check shows each). Every safety property is still checked.
fn holds_without(label: &str, model: LockModel, unreached: &[&str]) {
    let started = Instant::now();
    let properties = model.properties();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    report(label, &checker, started);
    for property in properties {
        match property.expectation {
            Expectation::Sometimes if unreached.contains(&property.name) => {}
            Expectation::Sometimes => drop(checker.assert_any_discovery(property.name)),
            Expectation::Always | Expectation::Eventually => {
                checker.assert_no_discovery(property.name);
            }
        }
    }
    assert!(checker.discovery(COMPLETES).is_some());
}

/// Without a safety measure, the checker finds a counterexample to one of `properties`.
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
        "{label}: no counterexample was found (found: {found:?})"
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

/// Two clients, a lease of 4 ticks, the horizon past its end, and an update that waits one
/// tick for the lock before it gives up (each wait multiplies the states).
fn base() -> LockModel {
    LockModel {
        lease: 4,
        horizon: 6,
        timeout: 1,
        skew: 0,
        lost_responses: 0,
        window_expiries: 0,
        ..LockModel::fenced()
    }
}

/// The dedup window passes once, so that a second claim on a generation lands.
fn dedup_window() -> LockModel {
    LockModel {
        window_expiries: 1,
        horizon: 5,
        ..base()
    }
}

/// Responses lost after their insert landed, resent (within the retry bound) or given up.
fn lost_responses() -> LockModel {
    LockModel {
        lost_responses: 1,
        horizon: 5,
        ..base()
    }
}

/// Clocks off by up to the lease's margin: a lease of 10 ticks, whose margin is 1.
fn skew() -> LockModel {
    LockModel {
        lease: 10,
        horizon: 10,
        skew: 1,
        timeout: 0,
        ..base()
    }
}

/// An operator forces the lock open once.
fn force() -> LockModel {
    LockModel {
        forces: 1,
        horizon: 4,
        timeout: 0,
        ..base()
    }
}

/// A client gives up on an insert (a claim, a write, a release) that the server still
/// finishes later; two updates each, so that a confirmed grant's write can be given up on.
fn failures() -> LockModel {
    LockModel {
        failures: 1,
        updates: 2,
        horizon: 4,
        ..base()
    }
}

/// Two updates per client under one kept grant (linger): the second is one guarded write, or
/// a renewal first once past half the lease.
fn linger() -> LockModel {
    LockModel {
        updates: 2,
        ..base()
    }
}

/// One client keeps its grant across two updates while another process `set`s the state
/// without the lock; a lost response and a merge of the state table.
fn linger_with_a_set() -> LockModel {
    LockModel {
        clients: 1,
        sets: 1,
        lost_responses: 1,
        merges: 1,
        horizon: 4,
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
fn fenced_with_two_clients() {
    holds("two clients", base());
}

#[test]
fn fenced_with_a_passing_dedup_window() {
    holds("dedup window", dedup_window());
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

/// A write given up on was released with a cap below its version: when it landed later, it
/// tied with the next grant's write and buried it (found here, 16 steps, before the version was
/// recorded ahead of the write).
#[test]
fn fenced_with_an_insert_given_up_on_that_lands_later() {
    holds("failures", failures());
}

/// Kept grants under a lease of 10 ticks, whose margin is 1: the second update renews once
/// past half the lease, and the first grant's lease end is within the horizon. A client that
/// met the other keeps no grant (`GIVES_BACK`: with the rule removed, no run shows it).
#[test]
fn fenced_with_kept_grants() {
    let checker = holds(
        "linger, lease 10",
        LockModel {
            lease: 10,
            horizon: 9,
            timeout: 0,
            ..linger()
        },
    );
    assert!(checker.discovery(GIVES_BACK).is_some());
}

/// A client keeps its grant between two updates while the other waits for it and says so (a
/// `want` row): the keeper's next update renews past half the lease, sees the want, and gives
/// the grant back after writing instead of keeping it (`HEEDS_WANT`: with `Update::heed`
/// removed, no run shows it).
#[test]
fn fenced_with_a_waiter_wanting_a_kept_grant() {
    let checker = holds(
        "linger, a waiter",
        LockModel {
            horizon: 4,
            ..linger()
        },
    );
    assert!(checker.discovery(HEEDS_WANT).is_some());
}

/// Clocks off by the margin, with renewals of kept grants and a lost response. Wide: 4.4 M
/// states, about 2 minutes on two cores (`just model-wide`).
#[test]
#[ignore = "wide bounds: run by `just model-wide`"]
fn fenced_with_skew_renewals_and_a_lost_response() {
    // These bounds reach no give-back (the check failed on it when first run with the property,
    // 10 minutes in); `fenced_with_kept_grants` shows one, at horizon 9 without skew.
    holds_without(
        "skew, linger, lost",
        LockModel {
            updates: 2,
            lost_responses: 1,
            horizon: 8,
            ..skew()
        },
        &[GIVES_BACK],
    );
}

/// Two processes `set` the state without the lock while a client updates it; a lost response
/// (resent), the dedup window passing and a merge: a set lands at most once (`SET_ONCE`), and
/// no update built on a set is buried by it landing again.
#[test]
fn fenced_with_two_unlocked_setters() {
    let model = LockModel {
        clients: 1,
        sets: 2,
        lost_responses: 1,
        window_expiries: 1,
        merges: 1,
        horizon: 1,
        ..base()
    };
    assert!(model.properties().iter().any(|p| p.name == SET_ONCE));
    let checker = holds("two setters", model);
    assert!(checker.discovery(SET_DONE).is_some(), "a set gets through");
}

/// Two clients hand the lock over while another process `set`s the state without it: the
/// second grant's floor is above the first's released cap, and a set can still pass it before
/// the grant's holder writes anything (`SET_PASSES_A_LIVE_FLOOR`). So the stored state cannot
/// stand in for a holder's release (docs/lock.md, "What a hand-off costs").
#[test]
fn fenced_with_a_hand_off_and_an_unlocked_set() {
    let model = LockModel {
        sets: 1,
        replicas: 1,
        ..base()
    };
    // An example, not a proof over every state: the search stops at the first one (the space
    // of two clients and a setter is too large to explore here).
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(
            [SET_PASSES_A_LIVE_FLOOR].into_iter().collect(),
        ))
        .spawn_bfs()
        .join();
    report("hand-off, set", &checker, started);
    let example = checker
        .discovery(SET_PASSES_A_LIVE_FLOOR)
        .expect("a set passes the floor of a grant that followed a release");
    eprintln!(
        "  {SET_PASSES_A_LIVE_FLOOR}: an example of {} steps",
        example.into_actions().len()
    );
}

/// Wide (`just model-wide`): see docs/lock.md for its size.
#[test]
#[ignore = "wide bounds: run by `just model-wide`"]
fn fenced_with_a_kept_grant_forced_open() {
    holds(
        "linger, force",
        LockModel {
            updates: 2,
            horizon: 5,
            ..force()
        },
    );
}

#[test]
fn fenced_with_a_kept_grant_and_an_unlocked_set() {
    let model = linger_with_a_set();
    assert!(model.properties().iter().any(|p| p.name == SET_KEPT));
    holds("linger, set", model);
}

/// A client is killed holding the grant it keeps between updates; the other's update, started
/// after the kill, waits for the dead grant's lease and gets the lock within its timeout
/// (`NOT_LOCKED_OUT`), and the dead client's acknowledged update is kept. The update's lease
/// comes from the guest's rule (`update::update_lease`) over an explicit lock's lease of 30
/// ticks and a timeout of 3: with the explicit lock's lease instead, the waiter is locked out
/// (`a_killed_holder_with_the_explicit_locks_lease_locks_the_next_update_out`).
#[test]
fn fenced_with_a_holder_killed() {
    let model = LockModel {
        crashes: 1,
        updates: 2,
        lock_lease: Some(30),
        timeout: 3,
        horizon: 4,
        ..base()
    };
    assert!(model.properties().iter().any(|p| p.name == NOT_LOCKED_OUT));
    let checker = holds("killed holder", model);
    assert!(
        checker.discovery(RECOVERS).is_some(),
        "an update after the kill gets through"
    );
}

/// The same kill, with the update's grant under the explicit lock's lease (30 ticks) as before
/// the rule: the next update waits out its timeout and fails with `locked`.
#[test]
fn a_killed_holder_with_the_explicit_locks_lease_locks_the_next_update_out() {
    caught(
        "killed holder, the explicit lock's lease",
        LockModel {
            crashes: 1,
            updates: 2,
            lease: 30,
            lock_lease: None,
            timeout: 3,
            horizon: 4,
            ..base()
        },
        &[NOT_LOCKED_OUT],
    );
}

/// When the user may not read the system tables, the kind is unknown: the guest then sends
/// settings under which a replicated cluster's inserts reach every deciding read, so the
/// exploration is the two-clients check's (`fenced_with_two_clients`).
#[test]
fn fenced_on_a_replicated_cluster_whose_kind_is_unknown() {
    let unknown = LockModel {
        kind: Kind::Unknown,
        ..base()
    };
    assert!(unknown.quorum());
    assert!(
        base().quorum(),
        "the two-clients check is on a replicated cluster too"
    );
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
        updates: 2,
        ..base()
    };
    assert!(
        model.properties().iter().any(|p| p.name == UNCONTENDED),
        "the property is checked"
    );
    holds("uncontended", model);
}

// -- what the safety measures prevent ------------------------------------------------------

/// The settings of one server (what a denied deployment check used to give) on a replicated
/// cluster: inserts without quorum, so a deciding read may miss an acknowledged one.
#[test]
fn without_quorum_inserts_a_lagging_replica_loses_updates() {
    let model = LockModel {
        kind: Kind::SingleServer,
        ..base()
    };
    assert!(!model.quorum());
    caught("no quorum", model, &[NOTHING_LOST, ONE_HOLDER, FENCED]);
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

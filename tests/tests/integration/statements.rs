//! Statements on the real engine, natively: what the component and the model rely on.
//!
//! The lock log's folds: the component folds the log in the server (`Statements::log_state`, `log_claims`); the model
//! (`model/`) folds it with the guest's Rust twins (`fenced::fold`, `fenced::claims_on`). The
//! model's verdicts hold for the code that runs only if the two say the same of every log, so
//! random logs are written to the local ClickHouse and read back both ways.

use crate::common::ORIGIN;
use clickhouse_state::error::Result;
use clickhouse_state::session::{Level, Platform, Session};
use clickhouse_state::sql::StateRow;
use clickhouse_state::store::{State, Store};
use integration_tests::{TestTable, splitmix64};
use protocol::fenced::{self, LogEntry};
use protocol::rows::{Claim, Event, NewestGeneration};
use protocol::set;

use crate::common;
use common::Ureq;

struct Clock;

impl Platform for Clock {
    fn now_ms(&self) -> u64 {
        1_700_000_000_000
    }
    fn sleep_ms(&self, _: u64) {}
    fn random_u128(&self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }
    fn log(&self, _: Level, _: &str) {}
}

/// A random log of one id: up to 4 generations, claims by up to 3 owners, renewals, releases
/// (with caps) and forces, in any order. Times are distinct (ties in `at_ms` are the server's
/// to break, see `fenced::fold`).
fn random_log(state_id: &str, seed: &mut u64) -> Vec<LogEntry> {
    let rows = splitmix64(seed) % 9;
    let mut at = 0;
    (0..rows)
        .map(|_| {
            at += 1 + splitmix64(seed) % 5;
            let event = [
                Event::Acquire,
                Event::Acquire,
                Event::Renew,
                Event::Release,
                Event::Force,
                Event::Want,
            ][(splitmix64(seed) % 6) as usize];
            let generation = 1 + splitmix64(seed) % 4;
            let entry = LogEntry {
                state_id: state_id.to_string(),
                generation,
                event,
                owner: ["a", "b", "c"][(splitmix64(seed) % 3) as usize].to_string(),
                at_ms: at,
                until_ms: splitmix64(seed) % 40,
                floor_ms: splitmix64(seed) % 20,
            };
            if event == Event::Want {
                // A waiter's row, as `fenced::want` makes it: in generation 0.
                let holder = clickhouse_state::error::LockInfo {
                    state_id: state_id.to_string(),
                    owner: String::new(),
                    token: generation,
                    acquired_at_ms: 0,
                    expires_at_ms: 0,
                };
                return fenced::want(&holder, at);
            }
            entry
        })
        .collect()
}

fn sorted(mut claims: Vec<Claim>) -> Vec<Claim> {
    claims.sort_by(|a, b| (&a.owner, a.at_ms, a.until_ms).cmp(&(&b.owner, b.at_ms, b.until_ms)));
    claims
}

#[test]
fn the_sql_and_the_rust_folds_of_the_lock_log_agree() -> Result<()> {
    let table = TestTable::new("lock_log");
    let session = Session::open(&table.target.uri(), &table.settings(), Ureq, Clock)?;
    session.migrate()?;
    let mut seed = 0x5eed_u64;
    let mut compared = 0;
    for case in 0..60 {
        let state_id = format!("case-{case}");
        let log = random_log(&state_id, &mut seed);
        for entry in &log {
            let mut row = serde_json::to_vec(entry).expect("a log row encodes");
            row.push(b'\n');
            session.run(&session.sql.log_insert(row, &session.new_token()))?;
        }
        let newest: NewestGeneration = session
            .fetch_first(&session.sql.log_state(&state_id))?
            .unwrap_or_default();
        assert_eq!(newest, fenced::fold(log.iter()), "log_state of {log:#?}");
        let outlook: protocol::rows::Outlook = session
            .fetch_first(&session.sql.log_outlook(&state_id))?
            .unwrap_or_default();
        assert_eq!(
            outlook.newest,
            fenced::fold(log.iter()),
            "log_outlook of {log:#?}"
        );
        for generation in 1..=5 {
            let read = session.sql.log_claims(&state_id, generation, false);
            let claims: Vec<Claim> = session.fetch(&read)?;
            assert_eq!(
                sorted(claims),
                sorted(fenced::claims_on(log.iter(), generation, None)),
                "log_claims of generation {generation} of {log:#?}"
            );
            compared += 1;
        }
    }
    eprintln!("{compared} claim reads and 120 folds compared");
    Ok(())
}

/// A `set` sent again after its answer was lost, with another write landed in between (the
/// retry of a lost response) and the rows merged: the second send writes nothing, so the write
/// in between stays the state. Token deduplication does not cover this on one server (the state table has no window)
/// nor, from 26.1, for `INSERT ... SELECT` by default.
#[test]
fn a_set_sent_again_does_not_land_over_a_write_made_in_between() -> Result<()> {
    let table = TestTable::new("set_retry");
    let session = Session::open(&table.target.uri(), &table.settings(), Ureq, Clock)?;
    session.migrate()?;
    let row = |completed: &'static str, version_ms: u64| StateRow {
        state_id: "id",
        partial: "{}",
        completed,
        version_ms,
    };
    let first = session
        .sql
        .set_unless_newer(row(r#"{"a":1}"#, 1_000), &ORIGIN, "first");
    session.run(&first)?;
    session.run(
        &session
            .sql
            .set_unless_newer(row(r#"{"b":2}"#, 2_000), &ORIGIN, "second"),
    )?;
    // A background merge in between keeps only the newest row: the first landing leaves no
    // row behind, only the newer version above it.
    table
        .target
        .must(&format!("OPTIMIZE TABLE {} FINAL", table.qualified()));
    assert_eq!(table.raw_rows(), 1, "merged");
    // the first one's retry: the same statement, token and version
    session.run(&first)?;
    let stored = session
        .fetch_first(&session.sql.get("id"))?
        .expect("a state");
    assert_eq!(stored.completed_state.as_deref(), Some(r#"{"b":2}"#));
    assert_eq!(table.raw_rows(), 1, "the retry wrote nothing");
    // A set of the same state, later, still lands above what is stored.
    session.run(
        &session
            .sql
            .set_unless_newer(row(r#"{"a":1}"#, 3_000), &ORIGIN, "third"),
    )?;
    let stored = session
        .fetch_first(&session.sql.get("id"))?
        .expect("a state");
    assert_eq!(stored.completed_state.as_deref(), Some(r#"{"a":1}"#));
    Ok(())
}

/// `set_unless_newer` writes exactly when `set::lands` says it does, equal versions included:
/// the model decides a `set`'s landings by the Rust rule.
#[test]
fn the_set_condition_in_sql_decides_as_the_rule_in_rust() -> Result<()> {
    let table = TestTable::new("set_rule");
    let session = Session::open(&table.target.uri(), &table.settings(), Ureq, Clock)?;
    session.migrate()?;
    for (n, stored) in [None, Some(4_999), Some(5_000), Some(5_001)]
        .into_iter()
        .enumerate()
    {
        let id = format!("id{n}");
        let row = |completed: &'static str, version_ms: u64| StateRow {
            state_id: &id,
            partial: "{}",
            completed,
            version_ms,
        };
        if let Some(version) = stored {
            let first =
                session
                    .sql
                    .set_unless_newer(row("{}", version), &ORIGIN, &format!("{id}/a"));
            assert_eq!(session.write(&first)?.0.rows(), Some(1), "{stored:?}");
        }
        let set =
            session
                .sql
                .set_unless_newer(row(r#"{"s":1}"#, 5_000), &ORIGIN, &format!("{id}/b"));
        let written = session.write(&set)?.0.rows();
        assert_eq!(
            written,
            Some(u64::from(set::lands(stored, 5_000))),
            "stored at {stored:?}"
        );
    }
    Ok(())
}

/// A `set` lands and its answer is lost; the state is deleted; an update from a client whose
/// clock is behind the set's version writes the id afresh and is acknowledged; then the set is
/// sent again. The delete must leave a trace the resend's condition sees: otherwise the resend
/// lands again, brings the deleted state back and buries the acknowledged update. An id
/// deleted with nothing after it must stay deleted, too.
#[test]
fn a_set_sent_again_after_a_delete_does_not_land_again() -> Result<()> {
    let table = TestTable::new("set_delete");
    let store = Store::open(&table.target.uri(), &table.settings(), Ureq, Clock)?;
    store.migrate()?;
    let session = &Session::open(&table.target.uri(), &table.settings(), Ureq, Clock)?;
    // The setter's clock is ahead of the others' (`Clock`).
    let ahead = Clock.now_ms() + 10_000;
    let row = |id: &'static str| StateRow {
        state_id: id,
        partial: "{}",
        completed: r#"{"set":1}"#,
        version_ms: ahead,
    };
    let sends = ["updated", "deleted"].map(|id| session.sql.set_unless_newer(row(id), &ORIGIN, id));
    for send in &sends {
        assert_eq!(session.write(send)?.0.rows(), Some(1), "the first landing");
    }
    for id in ["updated", "deleted"] {
        store.delete(id)?;
        assert_eq!(store.get(id)?, None, "deleted");
    }
    store.update(&State {
        state_id: "updated".into(),
        partial: r#"{"after_delete":1}"#.into(),
        completed: "{}".into(),
    })?;
    for send in &sends {
        // the resend, after the lost answer: below the tombstone, it writes nothing
        assert_eq!(
            session.write(send)?.0.rows(),
            Some(0),
            "the resend landed again"
        );
    }
    let updated = store.get("updated")?.expect("the update's state");
    assert_eq!(
        (updated.partial.as_str(), updated.completed.as_str()),
        (r#"{"after_delete":1}"#, "{}"),
        "the acknowledged update is the state, not the resent set"
    );
    assert_eq!(store.get("deleted")?, None, "a deleted state stays deleted");
    assert_eq!(store.state_ids(None)?, ["updated"]);
    let listed: Vec<String> = store
        .get_all(None)?
        .into_iter()
        .map(|s| s.state_id)
        .collect();
    assert_eq!(listed, ["updated"]);
    Ok(())
}
